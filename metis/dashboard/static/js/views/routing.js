// Routing & models: the policy in force, the newest route decisions of all sessions, models
// with availability.

import { api, errorText } from "../api.js";
import { h, append, clear, fmtTime, plural, shortId, toast } from "../dom.js";
import { whileVisible } from "../poll.js";

const POLL_MS = 2000;

// a policy's version as the daemon's log names it
const VERSION_CHARS = 12;
// What picked a turn's model (a route.decided chain entry's policy), in words.
const POLICIES = {
  per_message_override: "@alias in the message",
  manual_sticky: "pinned model",
  pattern: "pattern",
  workspace_default: "workspace default",
  global_default: "global default",
  offline_fallback: "offline fallback",
};
export function pickedBy(entry) {
  if (entry.policy === "rule") return entry.rule_name ? `rule ${entry.rule_name}` : "a rule";
  return POLICIES[entry.policy] || entry.policy;
}

// a decision that chose no model (route.decided's outcome)
export const OUTCOMES = {
  no_candidate: "no model could take the turn",
  explicit_choice_rejected: "the model asked for could not take it",
};

// ---- a policy in words ---------------------------------------------------------------------
// GET /routing/policy gives each `when` in its YAML form (globs with ~ expanded, extensions in
// lower case, the rest as written). Everything from the file goes into text nodes and <code>,
// never into HTML.

const val = (text) => h("code", { class: "val" }, String(text));

// "a", "a or b", "a, b or c"
function oneOf(nodes, word = "or") {
  return nodes.flatMap((n, i) => (i === 0 ? [n] : [i === nodes.length - 1 ? ` ${word} ` : ", ", n]));
}

// Python's global flags at the start of a pattern, `(?i)` among them
const IGNORES_CASE = /^\(\?[aiLmsux]*i[aiLmsux]*\)/;

const FLAGS = {
  has_images: ["the message has images", "the message has no images"],
  has_tool_calls_in_history: ["the session has called tools before", "the session has not called tools yet"],
  tool_use_in_progress: ["the turn brings the results of tool calls in progress", "no tool call is in progress"],
};
const LIMITS = {
  message_length_gt: (n) => `the message is longer than ${plural(n, "character")}`,
  message_length_lt: (n) => `the message is shorter than ${plural(n, "character")}`,
  estimated_input_tokens_gt: (n) => `the input is estimated at more than ${plural(n, "token")}`,
  estimated_input_tokens_lt: (n) => `the input is estimated at fewer than ${plural(n, "token")}`,
  turn_index_gt: (n) => `the turn comes after the session's turn ${n}`,
  turn_index_lt: (n) => `the turn comes before the session's turn ${n}`,
};

// A list of `when` mappings (all_of, any_of), one item each.
function whenList(whens) {
  return h("ul", { class: "conds" }, whens.map((w) => h("li", {}, whenWords(w))));
}

// A `when` mapping's conditions (its [key, value] pairs), one item each.
function conditionList(keys) {
  return h("ul", { class: "conds" }, keys.map(([k, v]) => h("li", {}, condition(k, v))));
}

// A `when` mapping in words: its conditions, all of which must hold.
export function whenWords(when) {
  const keys = Object.entries(when || {});
  if (!keys.length) return ["every turn"];
  if (keys.length === 1) return condition(...keys[0]);
  return ["all of these hold:", conditionList(keys)];
}

// `not:` — a flag said the other way round, else "none of" / "not all of" / "not:".
function negation(when) {
  const keys = Object.entries(when || {});
  if (keys.length === 1) {
    const [k, v] = keys[0];
    if (k in FLAGS) return [FLAGS[k][v ? 1 : 0]];
    if (k === "any_of") return ["none of these holds:", whenList(v)];
    if (k === "all_of") return ["not all of these hold:", whenList(v)];
    return ["not: ", condition(k, v)];
  }
  return ["not all of these hold:", conditionList(keys)];
}

// One condition of the closed vocabulary (docs/configuration.md), as a phrase; a key this page
// does not know yet is shown as the daemon gives it.
export function condition(key, value) {
  if (key in FLAGS) return [FLAGS[key][value ? 0 : 1]];
  if (key in LIMITS) return [LIMITS[key](value)];
  switch (key) {
    case "message_matches":
      return ["the message matches ", val(value), IGNORES_CASE.test(value) ? " (in any case)" : null];
    case "message_contains_any":
      return ["the message contains ", oneOf(value.map(val)), " (in any case)"];
    case "mentions_file_extension":
      return ["the message mentions a ", oneOf(value.map((e) => val(`.${e}`))), " file"];
    case "workspace_path_glob":
      return ["the workspace matches ", oneOf([].concat(value).map(val))];
    case "session_cost_usd_gt":
      return [`the session has cost more than $${value}`];
    case "time_of_day_between":
      return [`the daemon's local time is from ${value[0]} until ${value[1]}`, value[0] > value[1] ? " (overnight)" : null];
    case "all_of":
      return ["all of these hold:", whenList(value)];
    case "any_of":
      return ["any of these holds:", whenList(value)];
    case "not":
      return negation(value);
    default:
      return [val(key), ": ", val(JSON.stringify(value))];
  }
}

// fast, balanced and deep, each with its model (none: no model of models.yaml has the tier)
function tierList(tiers) {
  return h("ul", { class: "tiers" }, Object.entries(tiers || {}).map(([tier, model]) =>
    h("li", { dataset: { tier } }, `${tier}: `, model ? h("span", { class: "mono" }, model) : h("span", { class: "muted" }, "none"))));
}

// `pattern:` is read and checked, and used by no release yet
function patternWords(p) {
  if (!p) return "—";
  return [p.enabled ? "on in routing.yaml, but not used yet" : "off",
    h("div", { class: "muted small" },
      `reserved for a later release · cost weight ${p.cost_weight}, minimum confidence ${p.min_confidence}, minimum sample size ${p.min_sample_size}`)];
}

export function routingView(root) {
  const policyBox = h("div", { id: "policy" });
  const decisions = h("tbody");
  const models = h("tbody");
  const resetAll = h("button", { type: "button", id: "reset-all", onclick: () => reset(null) }, "Reset all availability");
  root.append(h("section", { class: "view" },
    h("div", { class: "view-head" }, h("h1", {}, "Routing & models")),
    h("div", { class: "grid2" },
      h("section", { class: "panel" }, h("h2", {}, "Policy"), policyBox),
      h("section", { class: "panel" }, h("h2", {}, "Models"),
        h("div", { class: "table-wrap" }, h("table", { id: "models" }, h("thead", {}, h("tr", {}, ["Model", "Aliases", "Availability", ""].map((t) => h("th", { scope: "col" }, t)))), models)),
        resetAll)),
    h("section", { class: "panel" }, h("h2", {}, "Last route decisions"),
      h("div", { class: "table-wrap" }, h("table", { id: "decisions" }, h("thead", {}, h("tr", {}, ["When", "Session", "Chosen", "By", "Fallbacks", "Policy"].map((t) => h("th", { scope: "col" }, t)))), decisions)))));

  // Back into routing now; the toast says which models that brought back (none were out, maybe).
  async function reset(model) {
    try {
      const r = await api("POST", model ? `/models/${encodeURIComponent(model)}/reset` : "/models/reset");
      toast(r.recovered.length ? `Available again: ${r.recovered.join(", ")}` : `${model || "Every model"} was already available`, { ok: true });
      loadModels();
    } catch (err) { toast(errorText(err)); }
  }

  // What each part last showed: a refresh that reads the same leaves it as it is (no
  // flicker, and the keyboard stays on a Reset button).
  const shown = {};
  function changed(part, data) {
    const text = JSON.stringify(data);
    if (shown[part] === text) return false;
    shown[part] = text;
    return true;
  }

  // none set in routing.yaml: a turn no rule picks goes to the first configured model
  function globalDefault(p) {
    if (p.global_default) return h("dd", { id: "policy-default", class: "mono" }, p.global_default);
    if (!p.fallback_model) return h("dd", { id: "policy-default", class: "muted" }, "none (no model is configured)");
    return h("dd", { id: "policy-default" }, h("span", { class: "mono" }, p.fallback_model),
      h("span", { class: "muted" }, " — none set: the first configured model"));
  }

  async function loadPolicy() {
    const p = await api("GET", "/routing/policy");
    if (!changed("policy", p)) return;
    append(clear(policyBox), [
      h("dl", { class: "kv" },
        // the daemon's own sentence: which file is in force and why (a file with errors is not)
        h("dt", {}, "Status"), h("dd", { id: "policy-state", class: p.valid ? null : "error" }, p.reason || p.source),
        h("dt", {}, "Version"), h("dd", { class: "mono" }, p.version.slice(0, VERSION_CHARS)),
        h("dt", {}, "Loaded"), h("dd", {}, fmtTime(p.loaded_at)),
        h("dt", {}, "Global default"), globalDefault(p),
        h("dt", {}, "Tiers"), h("dd", { id: "policy-tiers" }, tierList(p.tiers)),
        h("dt", {}, "Pattern routing"), h("dd", { id: "policy-pattern" }, patternWords(p.pattern))),
      p.errors.length ? h("ul", { class: "error" }, p.errors.map((e) => h("li", {}, e))) : null,
      p.warnings.length ? h("ul", { class: "warn" }, p.warnings.map((e) => h("li", {}, e))) : null,
      h("h3", {}, `Rules (${p.rules.length})`),
      p.rules.length ? h("ol", { class: "rules" }, p.rules.map(rule)) : h("p", { class: "muted" }, "No rules."),
      workspaces(p.workspaces || {})]);
  }

  async function loadModels() {
    const data = await api("GET", "/models");
    if (!changed("models", data)) return;
    // a rebuilt row keeps the keyboard on its Reset; a model back in routing has none: then
    // on Reset all
    const had = document.activeElement?.closest?.("#models tr")?.dataset.model;
    // labelled cells: on a phone the rows are stacked without the table's head (app.css)
    clear(models).append(...data.models.map((m) => h("tr", { dataset: { model: m.id } },
      h("td", { class: "mono" }, m.id, m.label ? h("div", { class: "muted small" }, m.label) : null),
      h("td", { dataset: { label: "Aliases" } }, (m.aliases || []).join(", ") || null),
      h("td", { class: "availability" }, ...availability(m)),
      h("td", {}, m.availability !== "healthy" ? h("button", { type: "button", "aria-label": `Reset ${m.id}`, onclick: () => reset(m.id) }, "Reset") : null))),
      ...(data.unconfigured || []).map((m) => h("tr", { class: "muted", dataset: { model: m.id } }, h("td", { class: "mono" }, m.id || String(m)), h("td", { dataset: { label: "Aliases" } }, (m.aliases || []).join(", ") || null), h("td", { class: "availability" }, notConfigured(m)), h("td", {}))));
    if (had !== undefined) {
      const row = [...models.rows].find((r) => r.dataset.model === had);
      (row?.querySelector("button") || resetAll).focus();
    }
  }

  // A rule as its file says it: its name, the model it picks and its line, what it is for,
  // and when it applies (its `when` in words; `{}` is every turn).
  function rule(r) {
    const when = Object.keys(r.when || {}).length ? ["when ", whenWords(r.when)] : "on every turn";
    return h("li", { dataset: { rule: r.name || "" } },
      h("code", {}, r.name || "(unnamed)"), " → ", h("span", { class: "mono" }, r.use),
      r.line ? h("span", { class: "muted small" }, ` · line ${r.line}`) : null,
      r.description ? h("div", { class: "muted small" }, r.description) : null,
      h("div", { class: "small when" }, when));
  }

  // The `workspaces:` scopes: each directory (as the daemon resolved it, ~ expanded) with its
  // default, its tiers and its rules, which run before the global ones.
  function workspaces(scopes) {
    const paths = Object.keys(scopes);
    if (!paths.length) return null;
    return [
      h("h3", {}, `Workspaces (${paths.length})`),
      h("p", { class: "muted small" }, "In a workspace at or below one of these directories (the longest that matches), its rules run before the rules above, and its default comes before the global default."),
      paths.map((path) => {
        const s = scopes[path];
        return h("section", { class: "scope", dataset: { workspace: path } },
          h("h4", {}, "In ", h("span", { class: "mono" }, path), " and below"),
          h("dl", { class: "kv" },
            h("dt", {}, "Default"), h("dd", { class: s.default ? "mono" : "muted" }, s.default || "the global default"),
            h("dt", {}, "Tiers"), h("dd", {}, s.tiers ? tierList(s.tiers) : h("span", { class: "muted" }, "the global tiers"))),
          s.rules.length ? h("ol", { class: "rules" }, s.rules.map(rule)) : h("p", { class: "muted small" }, "No rules of its own."));
      })];
  }

  // Whether routing may pick the model; if not, why, since when it is out and when routing
  // tries it again (GET /models' availability_detail), in words.
  function availability(m) {
    if (m.availability === "healthy") return [h("span", { class: "badge ok" }, "available")];
    const d = m.availability_detail || {};
    const whole = d.scope === "provider" ? `all of ${m.provider}'s models are out` : "this model is out";
    return [h("span", { class: "badge bad" }, "unavailable"),
      d.message ? h("div", { class: "small" }, d.message) : null,
      h("div", { class: "small muted" }, `${whole}${d.recovers_at ? `; routing tries again at ${fmtTime(d.recovers_at)}` : ""}`)];
  }

  // Why a declared model is not routable, and what would make it so.
  function notConfigured(m) {
    if (m.reason === "no_credentials" && m.env_var) return `no key: set ${m.env_var}`;
    if (m.reason === "offline_forced") return "off (METIS_OFFLINE is set)";
    return "not configured";
  }

  async function loadDecisions() {
    const rows = (await api("GET", "/routing/decisions?limit=20")).decisions;
    if (!changed("decisions", rows)) return;
    clear(decisions).append(...rows.map((ev) => {
      const p = ev.payload;
      const by = p.chain.find((c) => c.verdict === "chose");
      // a turn no model could take: what was refused, and why
      const refused = [...p.chain].reverse().find((c) => c.verdict === "rejected");
      return h("tr", {},
        h("td", {}, fmtTime(ev.timestamp)),
        // labelled for a phone, where each decision is a block without the table's head
        h("td", { "data-label": "Session" }, h("a", { href: `#/s/${ev.session_id}/trace`, class: "mono small", title: ev.session_id }, shortId(ev.session_id))),
        h("td", { class: p.chosen_model ? "mono" : "muted", "data-label": "Chosen" }, p.chosen_model || "none"),
        h("td", { "data-label": "By" }, by ? pickedBy(by) : [
          h("span", { class: "error" }, OUTCOMES[p.outcome] || p.outcome),
          refused ? h("div", { class: "small muted" }, refused.reason) : null]),
        h("td", { class: "mono small", "data-label": "Fallbacks" }, p.fallbacks.join(", ")),
        h("td", { class: "mono small", "data-label": "Policy" }, p.policy_version.slice(0, VERSION_CHARS)));
    }));
    if (!rows.length) decisions.append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No decisions yet.")));
  }

  // Followed while shown: a model goes out or comes back, a turn is routed, routing.yaml is
  // edited (the daemon reloads it by itself).
  let stopped = false;
  async function refresh() {
    try {
      await Promise.all([loadPolicy(), loadModels(), loadDecisions()]);
    } catch (err) {
      // an unreachable daemon is said in the header (api.js), not toasted at every refresh
      if (!stopped && err.code !== "network_error") toast(errorText(err));
    }
    if (!stopped) poll.next();
  }
  const poll = whileVisible(refresh, POLL_MS);
  refresh();
  return { stop() { stopped = true; poll.stop(); } };
}
