// A session's trace: each turn a bar, its route decisions, LLM calls and tool calls nested
// with durations, tokens, cost, retries and failovers; click a row for its JSON; filter; paging.

import { api } from "../api.js";
import { h, clear, fmtCost, fmtInt, fmtMs, fmtTime } from "../dom.js";

const PAGE = 200;
const KINDS = { all: null, turn: "turn.", route: "route.", llm: "llm.", tool: "tool.", session: "session." };

export function traceView(root, sessionId) {
  const events = [];
  let cursor = null;
  let kind = "all";
  const filter = h("select", { id: "trace-filter", "aria-label": "Event type" },
    Object.keys(KINDS).map((k) => h("option", { value: k }, k)));
  const more = h("button", { type: "button", id: "trace-more", hidden: true }, "Load more");
  const tree = h("div", { id: "trace", class: "trace" });
  const json = h("pre", { id: "event-json", class: "json", tabindex: "0", "aria-label": "Selected event" }, "Select an event to see its JSON.");
  const summary = h("p", { class: "muted", id: "trace-summary" });
  const error = h("p", { class: "error", id: "trace-error", role: "alert" });
  root.append(h("section", { class: "view" },
    h("div", { class: "view-head" },
      h("div", {}, h("a", { href: `#/s/${sessionId}`, class: "small" }, "← Session"), h("h1", {}, "Trace"), h("p", { class: "muted small mono" }, sessionId)),
      h("div", { class: "filters" }, h("label", { for: "trace-filter" }, "Show"), filter)),
    summary, error,
    h("div", { class: "trace-layout" }, h("div", {}, tree, more), h("aside", { class: "event-panel" }, h("h2", { class: "small" }, "Event"), json))));

  filter.addEventListener("change", () => { kind = filter.value; draw(); });
  more.addEventListener("click", () => load());

  function select(ev, row) {
    for (const r of tree.querySelectorAll(".selected")) r.classList.remove("selected");
    row.classList.add("selected");
    json.textContent = JSON.stringify(ev, null, 2);
  }

  function eventRow(ev, label, extra, cls, bar) {
    const row = h("button", { type: "button", class: `ev ${cls}`, dataset: { type: ev.type, id: ev.id } },
      h("span", { class: "ev-label" }, label),
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
    clear(tree);
    const prefix = KINDS[kind];
    // in time order: a turn takes the place of its first event, an event outside turns its own
    const turns = new Map();
    const order = [];
    let llm = 0, tools = 0; // of the whole session, whatever the filter shows
    for (const ev of events) {
      if (ev.type === "llm.call_completed" || ev.type === "llm.call_failed") llm += 1;
      if (ev.type === "tool.completed" || ev.type === "tool.failed") tools += 1;
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
          children.append(eventRow(ev, `route → ${p.chosen_model || p.outcome}`, `${p.chain.find((c) => c.verdict === "chose")?.policy || p.outcome} · ${fmtMs(p.elapsed_ms)}`, "span-route"));
        } else if (ev.type === "llm.call_started") {
          llmOpen.set(`${p.request_id}:${p.attempt}`, ev);
        } else if (ev.type === "llm.call_completed" || ev.type === "llm.call_failed") {
          models.add(p.model);
          const st = llmOpen.get(`${p.request_id}:${p.attempt}`);
          const began = st ? Date.parse(st.timestamp) : at - p.latency_ms;
          const failed = ev.type === "llm.call_failed";
          const label = `LLM ${p.model}${p.attempt > 1 ? ` (retry ${p.attempt - 1})` : ""}${failed ? ` ✗ ${p.error_class}${p.will_retry ? ", will retry" : ""}` : ""}`;
          children.append(eventRow(ev, label, `${fmtMs(p.latency_ms)} · ${fmtInt(p.input_tokens)} in / ${fmtInt(p.output_tokens)} out · ${fmtCost(p.cost_usd)}`, `span-llm${failed ? " failed" : ""}`, spanBar(began, p.latency_ms, t0, total)));
        } else if (ev.type === "tool.called") {
          toolOpen.set(p.tool_use_id, ev);
        } else if (ev.type === "tool.completed" || ev.type === "tool.failed") {
          const st = toolOpen.get(p.tool_use_id);
          const name = p.tool_name || st?.payload.tool_name || "tool";
          const began = st ? Date.parse(st.timestamp) : at - p.duration_ms;
          const failed = ev.type === "tool.failed" || p.is_error;
          children.append(eventRow(ev, `tool ${name}${failed ? ` ✗ ${p.error_class || "error"}` : ""}`, `${fmtMs(p.duration_ms)}${p.exit_code != null ? ` · exit ${p.exit_code}` : ""}`, `span-tool${failed ? " failed" : ""}`, spanBar(began, p.duration_ms, t0, total)));
        } else if (ev.type.startsWith("tool.confirmation")) {
          children.append(eventRow(ev, ev.type === "tool.confirmation_requested" ? `confirm? ${p.tool_name}` : `confirmation: ${p.decision}`, p.input_summary || p.reason || "", "span-confirm"));
        } else if (!ev.type.startsWith("turn.") && ev.type !== "tool.called") {
          children.append(eventRow(ev, ev.type, "", "span-other"));
        }
      }
      const failover = models.size > 1 ? ` · failover: ${[...models].join(" → ")}` : "";
      const head = start || evs[0];
      const outcome = end ? end.type.split(".")[1] : "running";
      const p = end?.payload || {};
      const turnRow = eventRow(end || head, `Turn ${n} · ${outcome}`,
        end ? `${fmtMs(total)} · ${p.llm_call_count} LLM · ${p.tool_call_count} tools · ${fmtInt(p.input_tokens)} in / ${fmtInt(p.output_tokens)} out · ${fmtCost(p.total_cost_usd)}${failover}` : "",
        `span-turn ${outcome}`, spanBar(t0, total, t0, total));
      const group = h("div", { class: "turn", dataset: { turnId } }, turnRow, children);
      if (!prefix || prefix === "turn." || children.childElementCount) tree.append(group);
    }
    summary.textContent = `${events.length} events · ${turns.size} turns · ${llm} LLM calls · ${tools} tool calls${cursor ? " (more to load)" : ""}`;
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
        : `The events could not be read (${err.code}: ${err.message}).`;
      return;
    }
    events.push(...page.events);
    cursor = page.next_cursor;
    more.hidden = !cursor;
    draw();
  }
  load();
  return {};
}
