// A pending tool.confirmation_requested: what the tool wants, Allow once / Allow for this
// session / Deny (with a reason). An answer given elsewhere (another client, AAP) updates it.

import { api } from "../api.js";
import { h, clear } from "../dom.js";
import { diffView } from "./toolcard.js";

export function confirmationCard(sessionId, turnId, p, toolInput) {
  const reason = h("input", { type: "text", class: "reason", placeholder: "reason (optional)", "aria-label": `Reason to deny ${p.tool_name}` });
  const outcome = h("p", { class: "outcome", role: "status" });
  const buttons = h("div", { class: "row confirm-actions" });
  const details = [];
  if (p.command_summary) details.push(h("pre", { class: "command" }, h("span", { class: "prompt", "aria-hidden": "true" }, "$ "), p.command_summary));
  const diff = diffView(p.tool_name, toolInput);
  if (diff) details.push(diff);
  if (p.projected_modifications?.length) {
    details.push(h("p", { class: "small" }, "Would modify: ", p.projected_modifications.join(", ")));
  }
  const el = h("article", { class: "confirm-card", dataset: { requestId: p.confirmation_request_id }, "aria-label": `Confirm ${p.tool_name}` },
    h("h3", {}, "Allow ", h("code", {}, p.tool_name), "? ", h("span", { class: `badge se-${p.side_effects}` }, p.side_effects)),
    h("p", { class: "summary" }, p.input_summary),
    details, buttons, outcome);

  async function answer(decision, scope) {
    for (const b of buttons.querySelectorAll("button")) b.disabled = true;
    const body = { decision, scope };
    if (decision === "deny" && reason.value.trim()) body.reason = reason.value.trim();
    try {
      await api("POST", `/sessions/${sessionId}/turns/${turnId}/confirmations/${p.confirmation_request_id}`, body);
    } catch (err) {
      if (err.code !== "confirmation_already_resolved") {
        outcome.textContent = `${err.code}: ${err.message}`;
        for (const b of buttons.querySelectorAll("button")) b.disabled = false;
      }
    }
  }

  buttons.append(
    h("button", { type: "button", class: "primary allow-once", onclick: () => answer("allow", "once") }, "Allow once"),
    p.allowed_scopes?.includes("session")
      ? h("button", { type: "button", class: "allow-session", onclick: () => answer("allow", "session") }, "Allow for this session")
      : null,
    reason,
    h("button", { type: "button", class: "danger deny", onclick: () => answer("deny", "once") }, "Deny"));

  return {
    el,
    resolved(r) {
      clear(buttons);
      const what = r.decision === "allow" ? `Allowed${r.scope === "session" ? " for this session" : " once"}` : r.decision === "deny" ? "Denied" : "Timed out";
      outcome.textContent = `${what}${r.reason ? `: ${r.reason}` : ""}`;
      el.classList.add("resolved", `d-${r.decision}`);
      setTimeout(() => el.remove(), 4000);
    },
    turnEnded() {
      if (!el.classList.contains("resolved")) return;
      el.remove();
    },
  };
}
