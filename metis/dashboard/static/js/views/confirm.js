// A pending tool.confirmation_requested: what the tool wants, Allow once / Allow for this
// session / Deny (with a reason). An answer given elsewhere (another client, AAP) updates it;
// so does the end of its turn: the daemon then withdraws the request without a
// tool.confirmation_resolved event, and an answer to it would only get a 409.
// An AAP session's requests are its AAP client's to answer (the daemon refuses an answer from
// here): their cards say so, offer no buttons, and stay open past the end of the turn, which
// AAP suspends until the client answers in its next turn.

import { api, errorText } from "../api.js";
import { h, clear } from "../dom.js";
import { diffView } from "./toolcard.js";

// How long a settled card stays before it leaves the confirmation area.
const SETTLED_MS = 4000;

// The keyboard never falls off the page with a card: an answered card keeps the focus that was
// in it (the card itself, saying how it was settled, not a button a second Enter would press),
// and when it leaves, the focus goes to the next card, else to `focusAfter()` (the composer).
export function confirmationCard(sessionId, turnId, p, toolInput, { answeredByAap = false, focusAfter = null } = {}) {
  const reason = h("input", { type: "text", class: "reason", dir: "auto", placeholder: "reason (optional)", "aria-label": `Reason to deny ${p.tool_name}` });
  const outcome = h("p", { class: "outcome", role: "status" });
  const buttons = h("div", { class: "row confirm-actions" });
  const details = [];
  if (p.command_summary) details.push(h("pre", { class: "command" }, h("span", { class: "prompt", "aria-hidden": "true" }, "$ "), p.command_summary));
  const diff = diffView(p.tool_name, toolInput);
  if (diff) details.push(diff);
  if (p.projected_modifications?.length) {
    details.push(h("p", { class: "small" }, "Would modify: ", p.projected_modifications.join(", ")));
  }
  const el = h("article", { class: "confirm-card", tabindex: "-1", dataset: { requestId: p.confirmation_request_id }, "aria-label": `Confirm ${p.tool_name}` },
    h("h3", {}, "Allow ", h("code", {}, p.tool_name), "? ", h("span", { class: `badge se-${p.side_effects}` }, p.side_effects)),
    h("p", { class: "summary" }, p.input_summary),
    details, buttons, outcome);

  // an answer from here took the focus with its disabled buttons: it goes back to the card
  let answering = false;

  function settle(decision, text) {
    if (el.classList.contains("resolved")) return;
    const lost = !document.activeElement || document.activeElement === document.body;
    const focused = el.contains(document.activeElement) || (answering && lost);
    clear(buttons);
    outcome.textContent = text;
    el.classList.add("resolved", `d-${decision}`);
    if (focused) el.focus();
    setTimeout(leave, SETTLED_MS);
  }

  function leave() {
    const focused = el.contains(document.activeElement);
    const next = el.nextElementSibling || el.previousElementSibling;
    el.remove();
    if (focused) (next || focusAfter?.())?.focus();
  }

  function resolved(r) {
    const what = {
      allow: `Allowed${r.scope === "session" ? " for this session" : r.scope === "once" ? " once" : ""}`,
      deny: `Denied${r.scope === "session" ? " for this session" : ""}`,
      timeout: "Timed out",
      withdrawn: "Withdrawn — the turn ended",
    }[r.decision] || r.decision;
    settle(r.decision, `${what}${r.reason ? `: ${r.reason}` : ""}`);
  }

  async function answer(decision, scope) {
    // the keyboard's focus only (a click or a tap leaves the focus to the browser)
    answering = el.contains(document.activeElement) && document.activeElement.matches(":focus-visible");
    for (const b of buttons.querySelectorAll("button")) b.disabled = true;
    const body = { decision, scope };
    if (decision === "deny" && reason.value.trim()) body.reason = reason.value.trim();
    try {
      await api("POST", `/sessions/${sessionId}/turns/${turnId}/confirmations/${p.confirmation_request_id}`, body);
    } catch (err) {
      if (err.code === "confirmation_already_resolved") {
        // settled before this answer (elsewhere, or withdrawn): show how, not the 409
        resolved({ decision: err.details.resolution, scope: err.details.scope });
        return;
      }
      outcome.textContent = errorText(err);
      for (const b of buttons.querySelectorAll("button")) b.disabled = false;
      if (answering) el.focus();
      answering = false;
    }
  }

  if (answeredByAap) {
    buttons.append(h("p", { class: "muted small aap-answers" }, "Waiting for the AAP client that runs this session to allow or deny it."));
  } else {
    buttons.append(
      h("button", { type: "button", class: "primary allow-once", onclick: () => answer("allow", "once") }, "Allow once"),
      ...(p.allowed_scopes?.includes("session")
        ? [h("button", { type: "button", class: "allow-session", onclick: () => answer("allow", "session") }, "Allow for this session")]
        : []),
      reason,
      h("button", { type: "button", class: "danger deny", onclick: () => answer("deny", "once") }, "Deny"));
  }

  return {
    el,
    turnId,
    answeredByAap,
    resolved,
    // the turn ended (cancelled, failed, the session ended, the daemon restarted): a request
    // still open was withdrawn with it
    turnEnded() {
      resolved({ decision: "withdrawn" });
    },
  };
}
