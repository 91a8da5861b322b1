// Costs: spend per day, per model and per session as inline SVG charts (GET /costs).

import { api } from "../api.js";
import { h, svg, fmtCost, fmtInt, toast } from "../dom.js";

function dayChart(rows) {
  const W = 720, H = 200, pad = 28;
  // with no spend at all (local models), the bars show turns per day instead
  const spend = rows.some((r) => Number(r.cost_usd) > 0);
  const value = (r) => (spend ? Number(r.cost_usd) : r.turns);
  const fmt = (v) => (spend ? fmtCost(v) : `${v} turn${v === 1 ? "" : "s"}`);
  const max = Math.max(...rows.map(value), 0);
  const bw = (W - pad * 2) / Math.max(rows.length, 1);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-labelledby": "cost-day-title" },
    svg("title", { id: "cost-day-title", text: "Cost per day" }),
    svg("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, class: "axis" }));
  rows.forEach((r, i) => {
    const v = value(r);
    const bh = max ? ((H - pad * 2) * v) / max : 0;
    const rect = svg("rect", { x: pad + i * bw + 1, y: H - pad - bh, width: Math.max(1, bw - 2), height: Math.max(bh, v ? 1 : 0), class: "bar" },
      svg("title", { text: `${r.key}: ${fmtCost(r.cost_usd)} · ${r.turns} turns` }));
    chart.append(rect);
    if (i % Math.ceil(rows.length / 8) === 0) chart.append(svg("text", { x: pad + i * bw, y: H - 8, class: "tick", text: r.key.slice(5) }));
  });
  chart.append(svg("text", { x: pad, y: 16, class: "tick", text: `${spend ? "cost" : "no spend yet: turns"} per day, max ${fmt(max)}` }));
  return chart;
}

function barList(rows, label, link) {
  if (!rows.length) return h("p", { class: "muted" }, "Nothing yet.");
  // like the day chart: with no spend at all the bars show turns
  const spend = rows.some((r) => Number(r.cost_usd) > 0);
  const value = (r) => (spend ? Number(r.cost_usd) : r.turns);
  const max = Math.max(...rows.map(value), 0);
  const W = 480, row = 26, x0 = 200;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${rows.length * row}`, class: "chart hbars", role: "img", "aria-label": label });
  rows.forEach((r, i) => {
    const bw = max ? ((W - x0 - 70) * value(r)) / max : 0;
    const shown = spend ? fmtCost(r.cost_usd) : `${r.turns} turn${r.turns === 1 ? "" : "s"}`;
    chart.append(
      svg("text", { x: 0, y: i * row + 17, class: "tick", text: r.key.length > 24 ? `…${r.key.slice(-21)}` : r.key }),
      svg("rect", { x: x0, y: i * row + 5, width: Math.max(bw, 1), height: row - 10, class: "bar" }, svg("title", { text: `${r.key}: ${fmtCost(r.cost_usd)} · ${r.turns} turns` })),
      svg("text", { x: x0 + 6 + bw, y: i * row + 17, class: "tick", text: shown }));
  });
  const table = h("table", { class: "small" }, h("thead", {}, h("tr", {}, [label, "Cost", "Turns", "Tokens in", "Tokens out"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, h("td", { class: "mono" }, link ? h("a", { href: link(r.key) }, r.key) : r.key), h("td", { class: "num" }, fmtCost(r.cost_usd)), h("td", { class: "num" }, String(r.turns)), h("td", { class: "num" }, fmtInt(r.input_tokens)), h("td", { class: "num" }, fmtInt(r.output_tokens))))));
  return h("div", {}, chart, h("details", {}, h("summary", {}, "Table"), h("div", { class: "table-wrap" }, table)));
}

export function costsView(root) {
  const days = h("select", { id: "cost-days", "aria-label": "Period" }, [7, 30, 90].map((d) => h("option", { value: d, selected: d === 30 }, `last ${d} days`)));
  const body = h("div", { id: "costs" });
  root.append(h("section", { class: "view" },
    h("div", { class: "view-head" }, h("h1", {}, "Costs"), h("div", { class: "filters" }, days)), body));
  async function load() {
    try {
      const c = await api("GET", `/costs?days=${days.value}`);
      body.replaceChildren(
        h("p", { class: "stat big" }, `Total ${fmtCost(c.total_usd)} since ${c.since}`),
        h("section", { class: "panel" }, h("h2", {}, "Per day"), dayChart(c.by_day)),
        h("div", { class: "grid2" },
          h("section", { class: "panel" }, h("h2", {}, "Per model"), barList(c.by_model, "Model")),
          h("section", { class: "panel" }, h("h2", {}, "Per session (top 20)"), barList(c.by_session, "Session", (k) => `#/s/${k}`))));
    } catch (err) { toast(`${err.code}: ${err.message}`); }
  }
  days.addEventListener("change", load);
  load();
  return {};
}
