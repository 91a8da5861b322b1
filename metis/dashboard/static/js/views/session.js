// One session, live: transcript (server-rendered markdown), streaming deltas, tool cards,
// confirmations, composer, cancel, model selector, cost and tokens.
//
// A long session stays fast: the transcript starts with the snapshot's newest messages (all
// their markdown rendered in one request), older ones come with "Load earlier messages", and
// tool outcomes and token totals are filled in after the transcript is on screen, from the
// events of the shown turns only. Streaming deltas are buffered and written to the page once
// per animation frame, so a burst of thousands of deltas never blocks the main thread.

import { api, renderMarkdown, allEvents, prerender, download, errorText, RENDER_MAX_CHARS } from "../api.js";
import { h, clear, setHtml, fmtCost, fmtInt, fmtMs, shortId, toast, copyButton, addCodeCopy, tokensIn } from "../dom.js";
import { SessionStream } from "../stream.js";
import { toolCard } from "./toolcard.js";
import { confirmationCard } from "./confirm.js";
import { confirmDialog } from "./dialog.js";

const TERMINAL = new Set(["turn.completed", "turn.cancelled", "turn.failed"]);
// What a turn.cancelled reason means to the reader (a cancel the user asked for needs no words).
const CANCEL_REASONS = {
  user_cancel: "",
  client_disconnect: "its client went away",
  timeout: "it ran past its time limit",
  server_shutdown: "metis was stopping",
};

// The key that sends with Enter, named as this system's keyboard names it: ⌘ on a Mac (and an
// iPad's keyboard), Ctrl elsewhere. Both send everywhere (the composer's keydown).
export function sendKeys(platform = navigator.userAgentData?.platform || navigator.platform || "") {
  return /^(mac|iphone|ipad|ipod)/i.test(platform) ? "⌘+Enter" : "Ctrl+Enter";
}

// The direction dir=auto gives a text: that of its first letter (Hebrew, Arabic, Syriac,
// Thaana, N'Ko… right to left; any other left to right).
function firstStrongDir(text) {
  const letter = /\p{L}/u.exec(text);
  return letter && /[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc]/.test(letter[0]) ? "rtl" : "ltr";
}

// Why a turn failed or was cancelled, in words ("" for a cancel the user asked for).
export function turnEndReason(ev) {
  const p = ev.payload || {};
  return ev.type === "turn.failed" ? p.message || p.reason : CANCEL_REASONS[p.reason] ?? p.reason;
}

// `revealAt`: a message to open the transcript at (a search result's, `#/s/<id>?at=<message id>`).
// What the send keys say while a turn runs: Send is disabled then, and a key did nothing.
const REPLY_STILL_COMING = "Not sent: the reply is still coming. Send this once it is done, or Cancel the turn.";

export function sessionView(root, sessionId, revealAt = null) {
  const msgs = new Map(); // message id → {el, role, live, rendered}
  const cards = new Map(); // tool_use_id → toolCard
  const confirms = new Map(); // confirmation_request_id → confirmationCard
  let session = null;
  let snapshotGen = 0; // a newer snapshot makes the older one's late answers moot
  let snapshotAt = null;
  let turnStarts = null;
  let oldest = null; // the oldest message shown
  const liveTools = new Set(); // tool_use_ids a live event updated
  const turnEnds = new Set(); // ids of the turn.failed/turn.cancelled events shown
  let turnId = null;
  const finished = new Set(); // turns whose terminal event was handled (it can beat the POST's answer)
  let ended = false;
  let left = false; // the view was left: a late answer no longer names the browser's tab
  // every model call's usage, a failed one's too (a call cut short is billed all the same);
  // `estimated` once a call's usage was partly estimated (llm.call_*'s usage_estimated)
  const totals = { input: 0, output: 0, cost: 0, estimated: false };

  const title = h("h1", { class: "session-title clamp" }, "Session");
  document.title = `${shortId(sessionId)} · metis`; // until the session says its title
  const meta = h("p", { id: "session-meta", class: "muted small mono" });
  const conn = h("span", { class: "badge conn-state", role: "status" }, "connecting");
  const costEl = h("span", { id: "cost", class: "stat" });
  const tokensEl = h("span", { id: "tokens", class: "stat" });
  const turnState = h("span", { id: "turn-state", class: "badge", "aria-live": "polite" }, "idle");
  const modelSelect = h("select", { id: "model-select", "aria-label": "Model" });
  const modelNote = h("span", { class: "muted small", id: "model-note" });
  // focusable: the keyboard scrolls it
  const transcript = h("div", { id: "transcript", class: "transcript", role: "log", "aria-live": "off", "aria-label": "Transcript", tabindex: "0" });
  const earlier = h("button", { type: "button", id: "load-earlier", class: "load-earlier", hidden: true }, "Load earlier messages");
  const confirmArea = h("section", { id: "confirmations", class: "confirmations", "aria-label": "Pending confirmations" });
  // required: Send with nothing typed says so (the browser's own bubble, as Create's field does)
  // dir=auto (and <bdi>, its inline form) wherever a person's or a model's words are shown or
  // typed: Hebrew or Arabic reads right to left, its punctuation in place; other text as it was
  const input = h("textarea", { id: "composer-input", dir: "auto", rows: 3, required: true, placeholder: `Message (${sendKeys()} to send; start with @alias to pick a model)`, "aria-label": "Message", "aria-keyshortcuts": "Control+Enter Meta+Enter" });
  const send = h("button", { type: "submit", class: "primary", id: "send" }, "Send");
  const cancel = h("button", { type: "button", id: "cancel", class: "danger", hidden: true }, "Cancel");
  // a message left unsent when the session ended elsewhere: kept in the box, to copy or discard
  const copyDraft = copyButton("unsent message", () => input.value);
  copyDraft.className = "small"; // always shown (a reply's Copy shows on hover)
  copyDraft.id = "draft-copy";
  copyDraft.hidden = true;
  const discardDraft = h("button", { type: "button", class: "small", id: "draft-discard", hidden: true }, "Discard");
  const composerError = h("p", { class: "error", role: "alert", id: "composer-error" });
  const composer = h("form", { class: "composer", "aria-label": "Send a message" }, input, h("div", { class: "composer-actions" }, send, cancel, copyDraft, discardDraft), composerError);
  // Where the composer was, when this page cannot send: the session ended, or an AAP client
  // runs it (its messages and answers come from that client; Cancel still works from here).
  const endedNote = h("p", { class: "muted composer-note", id: "ended-note", tabindex: "-1", hidden: true },
    "This session has ended: it takes no more messages. Its transcript, trace and downloads stay.");
  const aapNote = h("p", { class: "muted composer-note", id: "aap-note", hidden: true },
    "An AAP client runs this session: messages and answers to its tool requests come from that client. Here you can follow it, cancel a running turn, pick its model or end it.");

  function exportButton(format, label, what) {
    return h("button", {
      type: "button", class: "small", id: `export-${format}`, title: what,
      "aria-label": `Download this session as ${label}`,
      onclick: async (e) => {
        const button = e.currentTarget;
        button.setAttribute("aria-busy", "true");
        try {
          await download(`/sessions/${sessionId}/export?format=${format}`);
        } catch (err) {
          toast(errorText(err));
        } finally {
          button.removeAttribute("aria-busy");
        }
      },
    }, label);
  }

  // End, here as in the sessions list (after a confirmation; the data stays): the session's
  // end then comes back as its session.ended event, which takes the button and the composer
  const endButton = h("button", { type: "button", id: "end-session", class: "small" }, "End session");
  endButton.addEventListener("click", async () => {
    const running = turnId ? "; its running turn is cancelled" : "";
    const ok = await confirmDialog("End session?",
      `${session?.title || sessionId} takes no more turns${running}. Its transcript and trace stay (Purge, in the sessions list, deletes them).`,
      "End");
    if (!ok) return endButton.focus();
    try {
      await api("DELETE", `/sessions/${sessionId}`);
    } catch (err) { toast(errorText(err)); }
  });
  const side = h("div", { class: "session-side" },
    h("div", { class: "row" }, conn, turnState, h("a", { href: `#/s/${sessionId}/trace`, id: "trace-link" }, "Trace"), endButton),
    h("div", { class: "row small exports" }, "Download",
      exportButton("md", "Markdown", "the conversation to read: turns, tool calls, costs"),
      exportButton("json", "JSON", "the session, its messages and its events, as the API gives them")),
    h("div", { class: "row" }, h("label", { for: "model-select" }, "Model"), modelSelect, modelNote),
    h("div", { class: "row" }, costEl, tokensEl));
  root.append(h("section", { class: "view session" },
    h("div", { class: "view-head" },
      h("div", {}, h("a", { href: "#/", class: "small" }, "← Sessions"), title, meta),
      side),
    earlier, transcript, confirmArea, composer, endedNote, aapNote));

  // On a narrow screen the transcript has no height limit (app.css) and the page scrolls
  // instead: following the newest content then means keeping the page at its bottom.
  const pageScrolls = () => getComputedStyle(transcript).maxHeight === "none";
  let pinned = true;
  function stick() {
    if (!pinned) return;
    if (pageScrolls()) window.scrollTo(0, document.documentElement.scrollHeight);
    else transcript.scrollTop = transcript.scrollHeight;
  }

  function addUsage(p) {
    totals.input += tokensIn(p);
    totals.output += p.output_tokens;
    totals.cost += Number(p.cost_usd);
    totals.estimated ||= !!p.usage_estimated;
  }

  function resetTotals() {
    Object.assign(totals, { input: 0, output: 0, cost: 0, estimated: false });
  }

  function showTotals() {
    costEl.textContent = `Cost ${totals.estimated ? "≈" : ""}${fmtCost(totals.cost)}`;
    costEl.title = totals.estimated ? "Partly estimated: a model call cut short before the provider counted its tokens" : "";
    tokensEl.textContent = `Tokens ${fmtInt(totals.input)} in · ${fmtInt(totals.output)} out`;
  }

  function setTurn(id, label) {
    turnId = id;
    turnState.textContent = label || (id ? "running" : "idle");
    turnState.className = `badge ${id ? "running" : ""}`;
    const hadKeys = cancel.matches(":focus-visible");
    cancel.hidden = !id;
    send.disabled = !!id || ended;
    // a faded button says why to the mouse too (the send keys say it in the composer's note)
    send.title = id ? "A reply is still coming: send once it is done, or Cancel the turn" : "";
    if (hadKeys && !id) keysToComposer(); // Cancel went with the turn
    if (!id && composerError.dataset.code === "turn_in_flight") setComposerError(null);
  }

  // Where the keyboard goes when the button it was on goes away or is disabled (Send while
  // the turn runs, Cancel once it ended): to the message box, ready for the next message.
  // Only the keyboard's (:focus-visible): a tap on a phone would open its on-screen keyboard
  // over the reply.
  function keysToComposer() {
    if (!composer.hidden && !input.hidden) input.focus();
  }

  // What the composer's last send met; a turn_in_flight refusal goes when that turn ends.
  function setComposerError(err) {
    composerError.textContent = err ? errorText(err) : "";
    composerError.dataset.code = err?.code || "";
  }

  // ---- draft -------------------------------------------------------------------------------

  // The message being written, kept for this tab (sessionStorage) until it is sent: the trace,
  // another page or a reload and back, it is in the box again.
  const draftKey = `metis.draft.${sessionId}`;
  function keepDraft() {
    try {
      if (input.value) sessionStorage.setItem(draftKey, input.value);
      else sessionStorage.removeItem(draftKey);
    } catch { /* storage refused: the box still has it */ }
  }
  try {
    input.value = sessionStorage.getItem(draftKey) || "";
  } catch { /* as above */ }
  input.addEventListener("input", () => {
    keepDraft();
    if (composerError.dataset.code === "blank") setComposerError(null); // it is being written
  });
  discardDraft.addEventListener("click", () => {
    input.value = "";
    keepDraft();
    composer.hidden = true;
    endedNote.focus();
  });

  // ---- transcript ------------------------------------------------------------------------

  function place(id, el) {
    el.dataset.id = id;
    const last = transcript.lastElementChild;
    if (!last || last.dataset.id < id) return transcript.append(el); // the usual case: newest
    for (const child of transcript.children) {
      if (child.dataset.id > id) return transcript.insertBefore(el, child);
    }
    transcript.append(el);
  }

  function bubble(id, role, extra = "") {
    const body = h("div", { class: "body" });
    const who = h("div", { class: "who" }, h("span", {}, role === "user" ? "you" : role));
    const el = h("article", { class: `msg ${role} ${extra}`, "aria-label": role === "user" ? "You" : "Assistant" }, who, body);
    const m = { el, body, who, role, blocks: [], source: "" };
    msgs.set(id, m);
    place(id, el);
    return m;
  }

  // A turn that failed or was cancelled says so, and why, where it ended: the notice is placed
  // by its event's id, which sorts after the turn's messages and before the next turn's.
  function showTurnEnd(ev) {
    if (ev.type === "turn.completed" || turnEnds.has(ev.id)) return;
    turnEnds.add(ev.id);
    const why = turnEndReason(ev);
    const what = ev.type === "turn.failed" ? "Turn failed" : "Turn cancelled";
    place(ev.id, h("p", { class: `turn-end ${ev.type.split(".")[1]}`, role: "note" }, why ? `${what}: ${why}` : what));
  }

  function card(toolUseId, name, inputValue) {
    let c = cards.get(toolUseId);
    if (!c) {
      c = toolCard(toolUseId, name);
      cards.set(toolUseId, c);
    }
    if (inputValue !== undefined) c.setInput(inputValue);
    return c;
  }

  // What a reply the output limit stopped says under it: a tool call it was writing (known
  // only live, from its dropped tool.use_end) never ran.
  function cutOffNote(dropped) {
    const calls = dropped.length ? ` The call to ${dropped.join(", ")} it was writing was dropped; it did not run.` : "";
    return `The reply was cut off by the output limit (max_tokens).${calls}`;
  }

  // A text the daemon did not render, as plain text (as it streamed): one longer than the
  // daemon renders says so; one whose request failed is rendered at the next sync (renderLater).
  function markdown(text, html) {
    if (typeof html === "string") {
      const div = h("div", { class: "md" });
      setHtml(div, html);
      // each paragraph, item, heading, quote or cell takes the direction of its own words;
      // code stays left to right
      for (const el of div.querySelectorAll("p, li, ul, ol, h1, h2, h3, h4, h5, h6, blockquote, th, td")) el.dir = "auto";
      for (const el of div.querySelectorAll("pre")) el.dir = "ltr";
      // the whole (a table's columns, a quote's bar) goes the way its first words do: its own
      // dir=auto would skip the blocks that have theirs, and find nothing
      div.dir = firstStrongDir(div.textContent);
      return div;
    }
    return h("div", { class: "md", dir: "auto" },
      text.length > RENDER_MAX_CHARS
        ? h("p", { class: "muted small render-note" }, `Shown as plain text: ${fmtInt(text.length)} characters, more than the ${fmtInt(RENDER_MAX_CHARS)} the dashboard formats.`)
        : null,
      h("div", { class: "stream-text", dir: "auto" }, text));
  }

  async function renderBlocks(m, blocks) {
    const texts = [];
    for (const b of blocks) {
      if (b.type === "text") texts.push(b.text);
      if (b.type === "thinking") texts.push(b.thinking || "");
    }
    // a failed request never leaves the bubble empty, nor stops the messages after it
    let html;
    let failed = false;
    try {
      html = texts.length ? await renderMarkdown(texts) : [];
    } catch {
      html = [];
      failed = true;
    }
    let i = 0;
    const out = [];
    for (const b of blocks) {
      if (b.type === "text") {
        const div = markdown(b.text, html[i++]);
        addCodeCopy(div);
        out.push(div);
      } else if (b.type === "thinking") {
        const div = markdown(b.thinking || "", html[i++]);
        out.push(h("details", { class: "thinking" }, h("summary", {}, "Thinking"), div));
      } else if (b.type === "redacted_thinking") {
        out.push(h("details", { class: "thinking" }, h("summary", {}, "Thinking (redacted)")));
      } else if (b.type === "tool_use") {
        out.push(card(b.id, b.name, b.input).el);
      } else if (b.type === "image") {
        out.push(h("span", { class: "muted" }, "[image]"));
      }
    }
    if (m.cutOff) out.push(h("p", { class: "muted small cut-off", role: "note" }, m.cutOff));
    clear(m.body).append(...out);
    m.rendered = !failed;
    // a reply can be copied whole, as the model wrote it (its markdown; not its thinking)
    m.source = blocks.filter((b) => b.type === "text").map((b) => b.text).join("\n\n");
    if (m.role === "assistant" && m.source && !m.who.querySelector("button.copy")) {
      m.who.append(copyButton("reply", () => m.source));
    }
  }

  // A bubble whose markdown could not be rendered (the daemon went away mid-request) shows its
  // plain text and keeps `rendered` false, so the stored copy is rendered at the next sync.
  function renderLater(m, blocks) {
    renderBlocks(m, blocks).catch(() => {});
  }

  async function addStored(message) {
    if (message.role === "tool") {
      for (const b of message.content) {
        if (b.type === "tool_result") card(b.tool_use_id).setResult(b);
      }
      return;
    }
    if (message.role !== "user" && message.role !== "assistant") return;
    const existing = msgs.get(message.id);
    if (existing && !existing.live && existing.rendered) return;
    const m = existing || bubble(message.id, message.role);
    m.live = false;
    m.el.classList.remove("streaming");
    if (message.metadata?.stop_reason === "max_tokens") m.cutOff ||= cutOffNote([]);
    await renderBlocks(m, message.content);
  }

  async function syncMessages() {
    // the newest stored messages: fills what streaming frames (never replayed) left out
    let page;
    try {
      page = await api("GET", `/sessions/${sessionId}/messages?limit=50`);
    } catch {
      return; // the daemon went away: the stream re-attaches and calls this again
    }
    await prerender(page.messages);
    try {
      for (const message of page.messages) await addStored(message);
    } catch { /* not rendered: the next sync (after the re-attach) fills those bubbles in */ }
  }

  // ---- live streaming ----------------------------------------------------------------------

  function liveMessage(id) {
    let m = msgs.get(id);
    if (!m) {
      m = bubble(id, "assistant", "streaming");
      m.live = true;
      m.parts = new Map();
    }
    return m;
  }

  function livePart(m, index, kind) {
    let part = m.parts.get(index);
    if (!part) {
      const node = document.createTextNode("");
      const text = h("div", { class: "stream-text", dir: "auto" }, node);
      if (kind === "thinking") {
        part = { el: h("details", { class: "thinking" }, h("summary", {}, "Thinking…"), text), text, node, buf: "" };
      } else {
        part = { el: text, text, node, buf: "" };
      }
      m.parts.set(index, part);
      m.body.append(part.el);
    }
    return part;
  }

  // Deltas wait in their part's buffer until the next frame (or 100 ms when frames do not run,
  // as in a hidden tab): one DOM write and one layout per frame, however many deltas came.
  const dirty = new Set();
  let flushFrame = null;
  let flushTimer = null;

  function queueText(part, text) {
    part.buf += text;
    dirty.add(part);
    if (flushFrame !== null) return;
    flushFrame = requestAnimationFrame(flush);
    flushTimer = setTimeout(flush, 100);
  }

  function flush() {
    cancelAnimationFrame(flushFrame);
    clearTimeout(flushTimer);
    flushFrame = flushTimer = null;
    for (const part of dirty) {
      part.node.appendData(part.buf);
      part.buf = "";
    }
    dirty.clear();
    stick();
  }

  function onStreaming(ev, frame) {
    const p = ev.payload;
    if (ev.type === "message.start") {
      const m = liveMessage(p.message_id);
      if (frame.catch_up && m.live) {
        // the text so far comes again: start the live message over (no duplicate)
        m.parts = new Map();
        clear(m.body);
      }
      return;
    }
    const m = msgs.get(p.message_id);
    if (!m || !m.live) return;
    if (ev.type === "text.delta" || ev.type === "thinking.delta") {
      queueText(livePart(m, p.content_block_index, ev.type === "thinking.delta" ? "thinking" : "text"), p.text);
    } else if (ev.type === "tool.use_start") {
      const c = card(p.tool_use_id, p.tool_name);
      m.parts.set(p.content_block_index, { el: c.el });
      m.body.append(c.el);
    } else if (ev.type === "tool.use_input_delta") {
      card(p.tool_use_id).appendInput(p.partial_json);
    } else if (ev.type === "tool.use_end" && p.dropped) {
      // cut off by the output limit: never made, so not in the message the render shows
      m.dropped = [...(m.dropped || []), card(p.tool_use_id).el.querySelector(".tool-name").textContent];
    } else if (ev.type === "tool.use_end") {
      card(p.tool_use_id).setInput(p.final_input);
    } else if (ev.type === "message.complete") {
      flush(); // all of the text is on the page until the rendered markdown replaces it
      m.live = false;
      m.el.classList.remove("streaming");
      m.el.dataset.stop = p.stop_reason;
      if (p.stop_reason === "max_tokens") m.cutOff = cutOffNote(m.dropped || []);
      renderLater(m, p.final_content);
    }
  }

  // ---- confirmations -----------------------------------------------------------------------

  function showConfirmation(p, turn) {
    if (confirms.has(p.confirmation_request_id)) return;
    const c = confirmationCard(sessionId, turn, p, card(p.tool_use_id).input, {
      answeredByAap: session?.surface === "aap",
      focusAfter: () => (composer.hidden || input.hidden ? null : input),
    });
    confirms.set(p.confirmation_request_id, c);
    confirmArea.append(c.el);
    card(p.tool_use_id).setStatus("awaiting confirmation");
  }

  // the end of a turn (or of the session) withdraws its open requests, with no event of their
  // own; an AAP turn's requests outlive it (the client answers them in its next turn)
  function withdrawOpen({ sessionEnded = false } = {}) {
    for (const c of confirms.values()) if (sessionEnded || !c.answeredByAap) c.turnEnded();
  }

  function resolveConfirmation(p) {
    const c = confirms.get(p.confirmation_request_id);
    if (c) c.resolved(p);
    const tc = cards.get(p.tool_use_id);
    if (tc) tc.setStatus(p.decision === "allow" ? "allowed" : p.decision === "deny" ? "denied" : p.decision);
  }

  // ---- bus events ----------------------------------------------------------------------------

  function onEvent(ev, frame) {
    if (!ev.id) return onStreaming(ev, frame);
    const p = ev.payload;
    switch (ev.type) {
      case "turn.started":
        setTurn(ev.turn_id);
        if (p.user_message_id && !msgs.has(p.user_message_id)) syncMessages();
        if (session && !session.title) refreshSession(); // its first prompt is its title now
        break;
      case "llm.call_completed":
      case "llm.call_failed":
        addUsage(p);
        showTotals();
        break;
      case "tool.confirmation_requested":
        showConfirmation(p, ev.turn_id);
        break;
      case "tool.confirmation_resolved":
        liveTools.add(p.tool_use_id);
        resolveConfirmation(p);
        break;
      case "tool.called":
        liveTools.add(p.tool_use_id);
        card(p.tool_use_id, p.tool_name).setStatus("running");
        break;
      case "tool.completed":
      case "tool.failed":
        liveTools.add(p.tool_use_id);
        card(p.tool_use_id).setOutcome(ev.type, p);
        syncMessages();
        break;
      case "session.model_changed":
      case "session.instructions_loaded":
        refreshSession();
        break;
      case "session.ended":
        setEnded();
        setTurn(null, "ended");
        break;
      default:
        if (TERMINAL.has(ev.type)) {
          finished.add(ev.turn_id);
          showTurnEnd(ev);
          setTurn(null, ev.type === "turn.completed" ? "idle" : ev.type.split(".")[1]);
          withdrawOpen();
          if (session?.pending_swap) applySwapLater();
          syncMessages();
        }
    }
  }

  async function onSnapshot(frame) {
    try {
      await applySnapshot(frame);
    } catch (err) {
      toast(errorText(err));
    }
  }

  async function applySnapshot(frame) {
    const gen = ++snapshotGen;
    session = frame.session;
    snapshotAt = frame.snapshot_at_event_id;
    turnStarts = null;
    liveTools.clear();
    turnEnds.clear();
    msgs.clear();
    clear(transcript);
    showSession(session);
    await prerender(frame.messages);
    if (gen !== snapshotGen) return;
    for (const message of frame.messages) await addStored(message);
    oldest = frame.messages[0] || null;
    earlier.hidden = !frame.has_more_before;
    resetTotals();
    showTotals();
    setTurn(session.current_turn_id);
    const open = new Set(session.pending_confirmations.map((pc) => pc.confirmation_request_id));
    for (const [id, c] of confirms) {
      // a card this page showed before the drop whose request is no longer open: answered
      // while away if its turn still runs (the tool card shows how), else withdrawn with it
      if (open.has(id)) continue;
      if (c.turnId === session.current_turn_id) c.el.remove();
      else c.turnEnded();
      confirms.delete(id);
    }
    for (const pc of session.pending_confirmations) showConfirmation(pc, pc.turn_id);
    pinned = true;
    stick();
    // a new session (nothing said yet) is there to be written to: its message box has the keys
    const idle = [root, document.body, null].includes(document.activeElement); // nothing else has the keys
    if (gen === 1 && !frame.messages.length && !input.hidden && !ended && idle) input.focus();
    performance.mark("metis:transcript-rendered");
    // after the transcript is on screen: the totals so far, and the shown tools' outcomes
    loadTotals(gen);
    loadOutcomes(gen, oldest, null);
    await reveal();
  }

  async function loadTotals(gen) {
    try {
      const events = await allEvents(sessionId, { event_types: "llm.call_completed,llm.call_failed", ...upTo() });
      if (gen !== snapshotGen) return;
      for (const ev of events) addUsage(ev.payload);
      showTotals();
    } catch { /* the stream re-attaches and takes a new snapshot */ }
  }

  function upTo() {
    return snapshotAt ? { until: snapshotAt } : {};
  }

  // The id of the turn.started event of every turn up to the snapshot (read once).
  async function turnStartIds() {
    if (!turnStarts) {
      const events = await allEvents(sessionId, { event_types: "turn.started", ...upTo() });
      turnStarts = new Map(events.map((ev) => [ev.turn_id, ev.id]));
    }
    return turnStarts;
  }

  // Tool outcomes (duration, exit code, confirmation) and the failed or cancelled ends of the
  // turns from `first`'s turn up to the turn of `stop` (exclusive; null: the snapshot), from the
  // stored events.
  async function loadOutcomes(gen, first, stop) {
    if (!first) return;
    try {
      const starts = await turnStartIds();
      const since = first.turn_id ? starts.get(first.turn_id) : null;
      const until = stop?.turn_id ? starts.get(stop.turn_id) : snapshotAt;
      const query = { event_types: "tool.completed,tool.failed,tool.confirmation_resolved,turn.failed,turn.cancelled" };
      if (since) query.since = since;
      if (until) query.until = until;
      const events = await allEvents(sessionId, query);
      if (gen !== snapshotGen) return;
      for (const ev of events) {
        if (TERMINAL.has(ev.type)) {
          showTurnEnd(ev);
          continue;
        }
        const id = ev.payload.tool_use_id;
        const tc = cards.get(id);
        if (!tc || liveTools.has(id)) continue; // a live event already said more
        if (ev.type === "tool.confirmation_resolved") tc.setStatus(ev.payload.decision === "allow" ? "allowed" : "denied");
        else tc.setOutcome(ev.type, ev.payload);
      }
    } catch { /* as above */ }
  }

  earlier.addEventListener("click", () => loadEarlier());

  // The page of messages before the oldest shown; false when it could not be read (said).
  async function loadEarlier() {
    if (!oldest) return false;
    // disabled while it reads, the button drops the keyboard: it gets it back after, or (the
    // first message is in, the button gone) the transcript does
    const hadKeys = document.activeElement === earlier;
    earlier.disabled = true;
    try {
      const page = await api("GET", `/sessions/${sessionId}/messages?before=${oldest.id}&limit=50`);
      await prerender(page.messages);
      const stop = oldest;
      const keep = transcript.scrollHeight - transcript.scrollTop; // stay where the reader is
      pinned = false;
      for (const message of page.messages) await addStored(message);
      transcript.scrollTop = transcript.scrollHeight - keep;
      if (page.messages.length) oldest = page.messages[0];
      earlier.hidden = !page.has_more_before;
      loadOutcomes(snapshotGen, oldest, stop);
      return true;
    } catch (err) {
      toast(errorText(err));
      return false;
    } finally {
      earlier.disabled = false;
      if (hadKeys) (earlier.hidden ? transcript : earlier).focus({ preventScroll: true });
    }
  }

  // Opened at a message (a search result): earlier pages are loaded until it is on the page,
  // then it is scrolled to the middle and marked, and the transcript stops following the end.
  // Once: a later snapshot (a reconnection) shows the newest messages as usual.
  async function reveal() {
    const target = revealAt;
    revealAt = null;
    if (!target) return;
    while (!msgs.has(target) && !earlier.hidden) {
      if (!(await loadEarlier())) return;
    }
    const m = msgs.get(target);
    if (!m) return toast("That message is not in this session's transcript any more");
    pinned = false;
    m.el.classList.add("found");
    m.el.scrollIntoView({ block: "center" });
  }

  function showSession(s) {
    // the session's title (its first prompt unless set), clamped, in full as the tooltip
    // in its own direction, isolated: the heading stays where the page's headings are
    title.replaceChildren(h("bdi", {}, s.title || s.id));
    if (!left) document.title = `${s.title || shortId(s.id)} · metis`;
    title.title = s.title || "";
    title.classList.toggle("named", !!s.title);
    // the project instruction file the turns give the model (AGENTS.md, else CLAUDE.md)
    const rules = s.instructions
      ? ` · instructions: ${s.instructions.file}${s.instructions.truncated ? " (too long: the model gets its beginning)" : ""}`
      : "";
    meta.textContent = `${s.title ? `${s.id} · ` : ""}${s.workspace_path} · ${s.surface}${rules}`;
    const byAap = s.surface === "aap";
    input.hidden = byAap; // Cancel stays: it works on any session
    send.hidden = byAap || ended;
    aapNote.hidden = !byAap || ended;
    showModel(s);
  }

  // The model the session will use: a swap queued behind the running turn shows as chosen
  // ("applies after this turn") until the daemon applies it.
  function showModel(s) {
    const swap = s.pending_swap;
    const model = swap ? swap.sticky_model : s.sticky_model;
    modelSelect.value = model || "";
    // an ended session's model decides nothing any more: no note beside its disabled selector
    modelNote.textContent = ended ? "" : swap ? "applies after this turn" : model ? "pinned" : "routing decides";
  }

  async function refreshSession() {
    try {
      const s = await api("GET", `/sessions/${sessionId}`);
      session = s;
      showSession(s);
    } catch { /* shown by the stream */ }
  }

  // The daemon applies a queued swap right after the turn's terminal event (when it frees the
  // session's turn slot) and announces nothing: read the session until the swap is in.
  async function applySwapLater() {
    for (let i = 0; i < 20 && session?.pending_swap && !ended; i += 1) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      await refreshSession();
    }
  }

  // An ended session takes no more turns: no model to pick, nothing to send. A message
  // written and not sent stays in its box, read-only, to copy or discard.
  function setEnded() {
    const keys = endButton.matches(":focus-visible") || composer.contains(document.activeElement);
    const unsent = !ended && !input.hidden && !composer.hidden && input.value.trim() !== "";
    ended = true;
    endButton.hidden = true;
    modelSelect.disabled = true;
    if (session) showModel(session);
    aapNote.hidden = true;
    if (unsent) {
      input.readOnly = true;
      send.hidden = true;
      copyDraft.hidden = discardDraft.hidden = false;
      setComposerError({ message: "Not sent: this session ended. Copy your message to keep it, or discard it." });
    } else if (copyDraft.hidden) {
      composer.hidden = true; // (a second call, as the stream closes, leaves an unsent message)
    }
    endedNote.hidden = false;
    // its button or its composer went: the keyboard on what says so (or on the unsent message's Copy)
    if (keys) (copyDraft.hidden ? endedNote : copyDraft).focus();
    withdrawOpen({ sessionEnded: true });
  }

  async function loadModels() {
    try {
      const data = await api("GET", "/models");
      const configured = data.models || data.configured || [];
      clear(modelSelect).append(h("option", { value: "" }, "auto (routing)"),
        ...configured.map((m) => h("option", { value: m.id }, m.aliases?.length ? `${m.aliases[0]} — ${m.id}` : m.id)));
      if (session) showModel(session);
    } catch (err) { toast(errorText(err)); }
  }

  modelSelect.addEventListener("change", async () => {
    const model = modelSelect.value || null;
    try {
      const r = await api("PATCH", `/sessions/${sessionId}`, { active_model: model });
      if (session) {
        if (r.swap_queued) session.pending_swap = { sticky_model: model, until_turn: r.swap_queued_until_turn };
        else Object.assign(session, { sticky_model: model, pending_swap: null });
        showModel(session);
      }
    } catch (err) {
      toast(errorText(err));
      if (session) showModel(session); // back to what the session really uses
    }
  });

  // A message the daemon never got (it was unreachable) stays in the composer; once the stream
  // is live again the error says so, instead of still saying the daemon cannot be reached.
  let sentOffline = false;
  composer.addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = input.value;
    // only spaces or line breaks (an empty box is `required`'s, and says so itself)
    if (!text.trim()) return setComposerError({ code: "blank", message: "Nothing to send: the message is only spaces or line breaks." });
    setComposerError(null);
    sentOffline = false;
    const fromSend = send.matches(":focus-visible");
    send.disabled = true;
    if (fromSend) keysToComposer();
    try {
      const r = await api("POST", `/sessions/${sessionId}/turns`, { content: [{ type: "text", text }] });
      input.value = "";
      keepDraft();
      if (!msgs.has(r.user_message_id)) {
        const m = bubble(r.user_message_id, "user");
        renderLater(m, [{ type: "text", text }]);
      }
      if (!finished.has(r.turn_id)) setTurn(r.turn_id);
    } catch (err) {
      setComposerError(err);
      sentOffline = err.code === "network_error";
      send.disabled = !!turnId;
    }
  });
  input.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || !(e.ctrlKey || e.metaKey)) return;
    // as Send does: not while a turn runs (requestSubmit ignores the button's state); the keys
    // then say why nothing was sent rather than do nothing (the note goes with the turn)
    if (!send.disabled) composer.requestSubmit();
    else if (turnId) setComposerError({ code: "turn_in_flight", message: REPLY_STILL_COMING });
  });
  cancel.addEventListener("click", async () => {
    const cancelling = turnId;
    if (!cancelling) return;
    try {
      await api("POST", `/sessions/${sessionId}/turns/${cancelling}/cancel`);
      if (turnId === cancelling) turnState.textContent = "cancelling";
    } catch (err) { toast(errorText(err)); }
  });

  const stream = new SessionStream(sessionId, {
    onSnapshot,
    onEvent,
    onResync: () => syncMessages(),
    onState: (s) => {
      if (s === "live" && sentOffline) {
        composerError.textContent = "The daemon is back; your message was not sent: Send it again.";
        sentOffline = false;
      }
      conn.textContent = s;
      conn.className = `badge conn-state ${s}`;
      root.dataset.conn = s;
    },
    onGone: async (why, s) => {
      setEnded();
      conn.textContent = why;
      conn.className = "badge conn-state";
      setTurn(null, why);
      turnState.hidden = true; // no turn can run any more: the badge beside it says why
      if (why === "not found") {
        title.textContent = "Session not found";
        if (!left) document.title = "Session not found · metis";
        title.classList.add("named");
        meta.textContent = `No session ${sessionId}: it never existed here, or it was purged before.`;
        side.hidden = transcript.hidden = endedNote.hidden = true; // nothing to show, nothing to change
        return;
      }
      if (why === "purged") {
        endedNote.textContent = "This session was purged: its messages and events are gone from the daemon.";
        return toast("This session was purged");
      }
      if (!s) return;
      session = s;
      showSession(s);
      try {
        const page = await api("GET", `/sessions/${sessionId}/messages?limit=50`);
        await prerender(page.messages);
        for (const message of page.messages) await addStored(message);
        oldest = page.messages[0] || null;
        earlier.hidden = !page.has_more_before;
      } catch (err) {
        toast(`The transcript could not be read (${errorText(err, { sentence: false })}); reload to try again`);
        return;
      }
      // what the stored events say of the shown turns, read in full now that nothing is live:
      // tokens and cost, tool outcomes, turns that failed or were cancelled
      const gen = ++snapshotGen;
      snapshotAt = turnStarts = null;
      resetTotals();
      loadTotals(gen);
      loadOutcomes(gen, oldest, null);
      await reveal();
    },
  });
  // follow the newest content unless the reader scrolled up (streamed text: `flush` sticks)
  transcript.addEventListener("scroll", () => {
    if (!pageScrolls()) pinned = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 60;
  });
  const onPageScroll = () => {
    if (pageScrolls()) pinned = document.documentElement.scrollHeight - window.scrollY - window.innerHeight < 60;
  };
  window.addEventListener("scroll", onPageScroll);
  const follow = new MutationObserver(stick);
  follow.observe(transcript, { childList: true, subtree: true });
  showTotals();
  loadModels();
  stream.start();
  return {
    stop() {
      left = true;
      stream.stop();
      follow.disconnect();
      window.removeEventListener("scroll", onPageScroll);
      cancelAnimationFrame(flushFrame);
      clearTimeout(flushTimer);
    },
  };
}
