// Routing & models: the policy in force, the newest route decisions of all sessions, models
// with availability.

import { api } from "../api.js";
import { h, append, clear, fmtTime, toast } from "../dom.js";

export function routingView(root) {
  const policyBox = h("div", { id: "policy" });
  const decisions = h("tbody");
  const models = h("tbody");
  root.append(h("section", { class: "view" },
    h("div", { class: "view-head" }, h("h1", {}, "Routing & models")),
    h("div", { class: "grid2" },
      h("section", { class: "panel" }, h("h2", {}, "Policy"), policyBox),
      h("section", { class: "panel" }, h("h2", {}, "Models"),
        h("div", { class: "table-wrap" }, h("table", { id: "models" }, h("thead", {}, h("tr", {}, ["Model", "Aliases", "Availability", ""].map((t) => h("th", { scope: "col" }, t)))), models)),
        h("button", { type: "button", id: "reset-all", onclick: () => reset(null) }, "Reset all availability"))),
    h("section", { class: "panel" }, h("h2", {}, "Last route decisions"),
      h("div", { class: "table-wrap" }, h("table", { id: "decisions" }, h("thead", {}, h("tr", {}, ["When", "Session", "Chosen", "By", "Fallbacks", "Policy"].map((t) => h("th", { scope: "col" }, t)))), decisions)))));

  async function reset(model) {
    try {
      await api("POST", model ? `/models/${encodeURIComponent(model)}/reset` : "/models/reset");
      loadModels();
    } catch (err) { toast(`${err.code}: ${err.message}`); }
  }

  async function loadPolicy() {
    const p = await api("GET", "/routing/policy");
    append(clear(policyBox), [
      h("dl", { class: "kv" },
        h("dt", {}, "Version"), h("dd", { class: "mono" }, p.version.slice(0, 16)),
        h("dt", {}, "Source"), h("dd", {}, p.source, p.path ? h("span", { class: "mono small" }, ` (${p.path})`) : ""),
        h("dt", {}, "Valid"), h("dd", {}, p.valid ? "yes" : "no", p.using_last_known_good ? " — using last known good" : ""),
        h("dt", {}, "Loaded"), h("dd", {}, fmtTime(p.loaded_at)),
        h("dt", {}, "Global default"), h("dd", { class: "mono" }, p.global_default || "—")),
      p.errors.length ? h("ul", { class: "error" }, p.errors.map((e) => h("li", {}, e))) : null,
      p.warnings.length ? h("ul", { class: "warn" }, p.warnings.map((e) => h("li", {}, e))) : null,
      h("h3", {}, `Rules (${p.rules.length})`),
      p.rules.length ? h("ol", { class: "rules" }, p.rules.map((r) => h("li", {}, h("code", {}, r.name || ""), " ", h("span", { class: "mono small" }, JSON.stringify(r))))) : h("p", { class: "muted" }, "No rules."),
      h("details", {}, h("summary", {}, "Tiers, workspaces, pattern"), h("pre", { class: "json" }, JSON.stringify({ tiers: p.tiers, workspaces: p.workspaces, pattern: p.pattern }, null, 2)))]);
  }

  async function loadModels() {
    const data = await api("GET", "/models");
    clear(models).append(...data.models.map((m) => h("tr", {},
      h("td", { class: "mono" }, m.id, m.label ? h("div", { class: "muted small" }, m.label) : null),
      h("td", {}, (m.aliases || []).join(", ")),
      h("td", {}, h("span", { class: `badge av-${m.availability}` }, m.availability), m.availability_detail ? h("div", { class: "small muted" }, typeof m.availability_detail === "string" ? m.availability_detail : JSON.stringify(m.availability_detail)) : null),
      h("td", {}, m.availability !== "healthy" ? h("button", { type: "button", onclick: () => reset(m.id) }, "Reset") : null))),
      ...(data.unconfigured || []).map((m) => h("tr", { class: "muted" }, h("td", { class: "mono" }, m.id || String(m)), h("td", {}, (m.aliases || []).join(", ")), h("td", {}, notConfigured(m)), h("td", {}))));
  }

  // Why a declared model is not routable, and what would make it so.
  function notConfigured(m) {
    if (m.reason === "no_credentials" && m.env_var) return `no key: set ${m.env_var}`;
    if (m.reason === "offline_forced") return "off (METIS_OFFLINE is set)";
    return "not configured";
  }

  async function loadDecisions() {
    const rows = (await api("GET", "/routing/decisions?limit=20")).decisions;
    clear(decisions).append(...rows.map((ev) => {
      const p = ev.payload;
      const by = p.chain.find((c) => c.verdict === "chose");
      return h("tr", {},
        h("td", {}, fmtTime(ev.timestamp)),
        h("td", {}, h("a", { href: `#/s/${ev.session_id}/trace`, class: "mono small", title: ev.session_id }, `…${ev.session_id.slice(-8)}`)),
        h("td", { class: "mono" }, p.chosen_model || p.outcome),
        h("td", {}, by ? `${by.policy}${by.rule_name ? ` (${by.rule_name})` : ""}` : p.outcome),
        h("td", { class: "mono small" }, p.fallbacks.join(", ")),
        h("td", { class: "mono small" }, p.policy_version.slice(0, 8)));
    }));
    if (!rows.length) decisions.append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No decisions yet.")));
  }

  Promise.all([loadPolicy(), loadModels(), loadDecisions()]).catch((err) => toast(`${err.code}: ${err.message}`));
  return {};
}
