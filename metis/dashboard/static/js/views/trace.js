// A session's trace: each turn a bar, its route decisions, LLM calls and tool calls nested
// with durations, tokens, cost, retries and failovers; click a row for its JSON; filter; paging.
// Once every page is in, it follows the session live, as the session view does.

import { api, errorText } from "../api.js";
import { turnEndReason } from "./session.js";
import { OUTCOMES, pickedBy } from "./routing.js";
import { SessionStream } from "../stream.js";
import { toolFailure } from "./toolcard.js";
import { h, clear, breakable, fmtCost, fmtInt, fmtMs, fmtTime, modelId, plural, shortId, tokensIn } from "../dom.js";

const PAGE = 200;

// What fitting the model's window left out of a call (its llm.call_started), in words.
function leftOut(started) {
  const parts = [];
  if (started.messages_left_out) parts.push(`${plural(started.messages_left_out, "earlier message")} left out`);
  if (started.tool_results_omitted) parts.push(`${plural(started.tool_results_omitted, "tool result")} omitted`);
  return parts.length ? ` · ${parts.join(", ")}` : "";
}
// Why a model call failed, in words (the keys are llm.call_failed's error_class); the code
// itself is in the event's JSON.
const LLM_FAILED_BECAUSE = {
  auth: "key refused",
  rate_limit: "rate-limited",
  server_error: "provider error",
  network: "network error",
  invalid_request: "request refused",
  context_overflow: "too long for the model",
  content_filter: "refused by the provider's filter",
  cancelled: "cancelled",
};
const REDRAW_MS = 250; // live events are drawn together: a redraw walks the whole trace
const KINDS = { all: null, turn: "turn.", route: "route.", llm: "llm.", tool: "tool.", session: "session." };
// what the filter's choices say (their values stay the kinds' names)
const KIND_NAMES = { all: "All events", turn: "Turns", route: "Route decisions", llm: "LLM calls", tool: "Tool calls", session: "Session events" };

export function traceView(root, sessionId) {
  document.title = `Trace · ${shortId(sessionId)} · metis`;
  const events = []; // in seq order, each once (a live event may also come in a page)
  const ids = new Set();
  let cursor = null;
  let kind = "all";
  let selected = null; // the id of the event whose JSON is shown
  const filter = h("select", { id: "trace-filter", "aria-label": "Event type" },
    Object.keys(KINDS).map((k) => h("option", { value: k }, KIND_NAMES[k])));
  const more = h("button", { type: "button", id: "trace-more", hidden: true }, "Load more");
  const tree = h("div", { id: "trace", class: "trace" });
  const PLACEHOLDER = "Select an event to see its JSON.";
  const json = h("pre", { id: "event-json", class: "json", tabindex: "0", "aria-label": "Selected event" }, PLACEHOLDER);
  const summary = h("p", { class: "muted", id: "trace-summary" });
  // the session's title (its first prompt unless set), read once: a person knows it by that
  const named = h("p", { id: "trace-session", class: "clamp", hidden: true });
  const error = h("p", { class: "error", id: "trace-error", role: "alert" });
  const conn = h("span", { class: "badge conn-state", id: "trace-conn", role: "status", hidden: true });
  // The selected event's JSON: beside the timeline on a wide screen; on a narrow one, where
  // the panel would be under the whole timeline, out of sight, right under the row clicked.
  const panel = h("aside", { class: "event-panel" }, h("h2", { class: "small" }, "Event"), json);
  const layout = h("div", { class: "trace-layout" }, h("div", {}, tree, more), panel);
  const narrow = matchMedia("(max-width: 800px)");
  function placePanel() {
    const row = selected && tree.querySelector(".ev.selected");
    if (narrow.matches && row) row.after(panel);
    else if (panel.parentNode !== layout) layout.append(panel);
  }
  narrow.addEventListener("change", placePanel);
  const view = h("section", { class: "view" },
    h("div", { class: "view-head" },
      h("div", {}, h("a", { href: `#/s/${sessionId}`, class: "small" }, "← Session"), h("h1", {}, "Trace"), named, h("p", { class: "muted small mono" }, sessionId)),
      h("div", { class: "filters" }, conn, h("label", { for: "trace-filter" }, "Show"), filter)),
    summary, error,
    layout);
  root.append(view);

  filter.addEventListener("change", () => { kind = filter.value; draw(); });
  more.addEventListener("click", () => load());

  // A row pressed again, or Escape, closes its JSON (on a phone a long block under the row,
  // with no other way to put it away).
  function select(ev, row) {
    const again = row.classList.contains("selected");
    unselect();
    if (again) return;
    mark(row);
    selected = ev.id;
    json.textContent = JSON.stringify(ev, null, 2);
    placePanel();
  }

  function mark(row) {
    row.classList.add("selected");
    row.setAttribute("aria-pressed", "true");
  }

  function unselect() {
    for (const r of tree.querySelectorAll(".selected")) {
      r.classList.remove("selected");
      r.setAttribute("aria-pressed", "false");
    }
    selected = null;
    json.textContent = PLACEHOLDER;
    placePanel();
  }

  // the keyboard goes back to the row whose JSON it closed; an Escape that closes the filter's
  // list of choices is that list's own
  view.addEventListener("keydown", (e) => {
    if (e.target instanceof HTMLSelectElement) return;
    const row = e.key === "Escape" && selected ? tree.querySelector(".ev.selected") : null;
    if (!row) return;
    unselect();
    row.focus();
  });

  // After a redraw the selected event's row is marked again; a filter that hides it empties
  // the panel, which would otherwise show an event no longer on the page.
  function reselect() {
    const row = [...tree.querySelectorAll(".ev")].find((r) => r.dataset.id === selected);
    if (!row) return unselect();
    mark(row);
    placePanel();
  }

  function eventRow(ev, label, extra, cls, bar) {
    const row = h("button", { type: "button", class: `ev ${cls}`, "aria-pressed": "false", dataset: { type: ev.type, id: ev.id } },
      h("span", { class: "ev-label" }, typeof label === "string" ? breakable(label) : label),
      bar || null,
      h("span", { class: "ev-extra muted small" }, extra || ""));
    row.addEventListener("click", () => select(ev, row));
    return row;
  }

  function spanBar(start, ms, t0, total) {
    if (!total) return null;
    const left = Math.max(0, Math.min(100, ((start - t0) / total) * 100));
    const width = Math.max(0.8, Math.min(100 - left, (ms / total) * 100));
    const bar = h("span", { class: "bar", "aria-hidden": "true" });
    const fill = h("span", { class: "fill" });
    fill.style.marginLeft = `${left}%`;
    fill.style.width = `${width}%`;
    bar.append(fill);
    return bar;
  }

  function draw() {
    layout.append(panel); // out of the timeline before it is redrawn (placed again after)
    clear(tree);
    const prefix = KINDS[kind];
    // in time order: a turn takes the place of its first event, an event outside turns its own
    const turns = new Map();
    const order = [];
    // of the whole session, whatever the filter shows. Tool calls are counted as each turn's
    // tool_call_count counts them, those that ran (tool.called); a call denied, timed out or
    // cancelled before it ran has only its tool.failed and is counted as not run.
    let llm = 0, ran = 0, notRun = 0;
    const called = new Set();
    const notRunIn = new Map(); // turn id → calls not run
    for (const ev of events) {
      if (ev.type === "llm.call_completed" || ev.type === "llm.call_failed") llm += 1;
      if (ev.type === "tool.called") {
        ran += 1;
        called.add(ev.payload.tool_use_id);
      } else if (ev.type === "tool.failed" && !called.has(ev.payload.tool_use_id)) {
        notRun += 1;
        notRunIn.set(ev.turn_id, (notRunIn.get(ev.turn_id) || 0) + 1);
      }
      if (!ev.turn_id) {
        order.push(ev);
      } else if (turns.has(ev.turn_id)) {
        turns.get(ev.turn_id).push(ev);
      } else {
        turns.set(ev.turn_id, [ev]);
        order.push(ev.turn_id);
      }
    }
    let n = 0;
    for (const item of order) {
      if (typeof item !== "string") {
        if (!prefix || item.type.startsWith(prefix)) tree.append(eventRow(item, item.type, fmtTime(item.timestamp), "loose"));
        continue;
      }
      const turnId = item;
      const evs = turns.get(turnId);
      n += 1;
      const t0 = Date.parse(evs[0].timestamp);
      const end = evs.find((e) => e.type.startsWith("turn.") && e.type !== "turn.started");
      const total = end ? end.payload.wall_time_ms || Date.parse(end.timestamp) - t0 : Date.parse(evs[evs.length - 1].timestamp) - t0;
      const start = evs.find((e) => e.type === "turn.started");
      const models = new Set();
      const children = h("div", { class: "children" });
      const llmOpen = new Map();
      const toolOpen = new Map();
      for (const ev of evs) {
        const p = ev.payload;
        const at = Date.parse(ev.timestamp);
        if (prefix && !ev.type.startsWith(prefix)) continue;
        if (ev.type === "route.decided") {
          const by = p.chain.find((c) => c.verdict === "chose");
          children.append(eventRow(ev, ["route → ", p.chosen_model ? modelId(p.chosen_model) : "none"], `${by ? pickedBy(by) : OUTCOMES[p.outcome] || p.outcome} · ${fmtMs(p.elapsed_ms)}`, "span-route"));
        } else if (ev.type === "llm.call_started") {
          llmOpen.set(`${p.request_id}:${p.attempt}`, ev);
        } else if (ev.type === "llm.call_completed" || ev.type === "llm.call_failed") {
          models.add(p.model);
          const st = llmOpen.get(`${p.request_id}:${p.attempt}`);
          const began = st ? Date.parse(st.timestamp) : at - p.latency_ms;
          const failed = ev.type === "llm.call_failed";
          const label = ["LLM ", modelId(p.model), `${p.attempt > 1 ? ` (retry ${p.attempt - 1})` : ""}${failed ? ` ✗ ${LLM_FAILED_BECAUSE[p.error_class] || "failed"}${p.will_retry ? ", will retry" : ""}` : ""}`];
          children.append(eventRow(ev, label, `${fmtMs(p.latency_ms)} · ${fmtInt(tokensIn(p))} in / ${fmtInt(p.output_tokens)} out · ${fmtCost(p.cost_usd)}${st ? leftOut(st.payload) : ""}`, `span-llm${failed ? " failed" : ""}`, spanBar(began, p.latency_ms, t0, total)));
        } else if (ev.type === "tool.called") {
          toolOpen.set(p.tool_use_id, ev);
        } else if (ev.type === "tool.completed" || ev.type === "tool.failed") {
          const st = toolOpen.get(p.tool_use_id);
          const name = p.tool_name || st?.payload.tool_name || "tool";
          const began = st ? Date.parse(st.timestamp) : at - p.duration_ms;
          const failed = ev.type === "tool.failed" || p.is_error;
          children.append(eventRow(ev, `tool ${name}${failed ? ` ✗ ${toolFailure(p.error_class)}` : ""}`, `${fmtMs(p.duration_ms)}${p.exit_code != null ? ` · exit ${p.exit_code}` : ""}`, `span-tool${failed ? " failed" : ""}`, spanBar(began, p.duration_ms, t0, total)));
        } else if (ev.type.startsWith("tool.confirmation")) {
          children.append(eventRow(ev, ev.type === "tool.confirmation_requested" ? `confirm? ${p.tool_name}` : `confirmation: ${p.decision}`, p.input_summary || p.reason || "", "span-confirm"));
        } else if (!ev.type.startsWith("turn.") && ev.type !== "tool.called") {
          children.append(eventRow(ev, ev.type, "", "span-other"));
        }
      }
      const head = start || evs[0];
      const outcome = end ? end.type.split(".")[1] : "running";
      const p = end?.payload || {};
      const figures = [fmtMs(total), plural(p.llm_call_count, "LLM call"), `${plural(p.tool_call_count, "tool call")} run`,
        ...(notRunIn.has(turnId) ? [`${fmtInt(notRunIn.get(turnId))} not run`] : []),
        `${fmtInt(tokensIn(p))} in / ${fmtInt(p.output_tokens)} out`, fmtCost(p.total_cost_usd)];
      // the totals wrap between figures, never inside one (no-break spaces)
      const totals = figures.map((f) => f.replaceAll(" ", "\u00a0")).join(" · ")
        + (models.size > 1 ? ` · failover: ${[...models].join(" → ")}` : "");
      const turnRow = eventRow(end || head, `Turn ${n} · ${outcome}`, end ? totals : "",
        `span-turn ${outcome}`, spanBar(t0, total, t0, total));
      // a turn that failed or was cancelled says why under its bar, as the transcript does
      const why = end && end.type !== "turn.completed" ? turnEndReason(end) : "";
      const group = h("div", { class: "turn", dataset: { turnId } }, turnRow,
        why ? h("p", { class: `turn-why small ${outcome}` }, why) : null, children);
      if (!prefix || prefix === "turn." || children.childElementCount) tree.append(group);
    }
    summary.textContent = [plural(events.length, "event"), plural(turns.size, "turn"), plural(llm, "LLM call"),
      `${plural(ran, "tool call")} run`, ...(notRun ? [`${fmtInt(notRun)} not run`] : [])].join(" · ")
      + (cursor ? " (more to load)" : "");
    reselect();
  }

  async function load() {
    const params = new URLSearchParams({ limit: String(PAGE) });
    if (cursor) params.set("cursor", cursor);
    error.textContent = "";
    let page;
    try {
      page = await api("GET", `/sessions/${sessionId}/events?${params}`);
    } catch (err) {
      error.textContent = err.code === "session_not_found"
        ? `Session not found: no session ${sessionId} here (never created, or purged).`
        : `The events could not be read (${errorText(err, { sentence: false })}).`;
      return;
    }
    const first = page.events[0]?.id;
    add(page.events);
    cursor = page.next_cursor;
    const hadKeys = document.activeElement === more;
    more.hidden = !cursor;
    draw();
    follow();
    // the last page is in: the keyboard goes from the button that went to the first event it
    // added (its row, or its turn's when the filter or the turn's nesting shows no row of it)
    if (hadKeys && more.hidden) {
      const rows = [...tree.querySelectorAll(".ev")];
      (rows.find((r) => r.dataset.id === first) || rows[rows.length - 1] || filter).focus();
    }
  }
  async function nameSession() {
    let session;
    try {
      session = await api("GET", `/sessions/${sessionId}`);
    } catch {
      return; // unknown or unreachable: the events' answer says so
    }
    if (left || !session.title) return;
    named.replaceChildren(h("bdi", {}, session.title)); // in its own direction (Hebrew, Arabic…)
    named.title = session.title;
    named.hidden = false;
    document.title = `Trace · ${session.title} · metis`;
  }

  function add(list) {
    let sorted = true;
    for (const ev of list) {
      if (ids.has(ev.id)) continue;
      ids.add(ev.id);
      if (events.length && events[events.length - 1].seq > ev.seq) sorted = false;
      events.push(ev);
    }
    if (!sorted) events.sort((a, b) => a.seq - b.seq);
  }

  // Following starts once the last page is read, after its newest event (`since`): the
  // stream replays what came meanwhile, so a turn under way grows on the page without a
  // gap or a reload. Streaming deltas carry no id and are not trace events: skipped.
  let stream = null;
  let redraw = null;
  function follow() {
    if (stream || left || cursor) return;
    stream = new SessionStream(sessionId, {
      onEvent: (ev) => {
        if (!ev.id || ids.has(ev.id)) return;
        add([ev]);
        redraw ??= setTimeout(() => { redraw = null; draw(); }, REDRAW_MS);
      },
      // a snapshot comes only when the event followed from is no longer kept (pruned):
      // the trace is read again from its first page
      onSnapshot: () => {
        events.length = 0;
        ids.clear();
        cursor = null;
        load();
      },
      onState: (state) => showConn(state),
      onGone: (why) => showConn(why === "not found" ? "" : why),
    });
    stream.lastId = events.length ? events[events.length - 1].id : null;
    stream.start();
  }
  function showConn(state) {
    conn.hidden = !state;
    conn.textContent = state;
    conn.className = `badge conn-state ${state}`;
  }

  let left = false;
  load();
  nameSession();
  return {
    stop() {
      left = true;
      stream?.stop();
      clearTimeout(redraw);
      narrow.removeEventListener("change", placePanel);
    },
  };
}
