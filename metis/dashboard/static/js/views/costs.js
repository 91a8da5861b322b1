// Costs: spend per day as an SVG chart, per model and per session as bars, each with a table
// (GET /costs).

import { api, errorText } from "../api.js";
import { h, svg, fmtCost, fmtInt, plural, shortId, toast } from "../dom.js";

const H = 200, PAD = 28;
const LABEL_PX = 48; // room for one day's label ("11-27" at the chart's 11 px) and a gap

// with no spend at all (local models), the bars show turns instead
function measure(rows) {
  const spend = rows.some((r) => Number(r.cost_usd) > 0);
  return {
    spend,
    value: (r) => (spend ? Number(r.cost_usd) : r.turns),
    shown: (r) => (spend ? fmtCost(r.cost_usd) : plural(r.turns, "turn")),
  };
}

// Drawn `width` pixels wide, the width of its box: its labels keep their size on a phone and its
// bars fill a wide panel.
function dayChart(rows, width) {
  const { spend, value } = measure(rows);
  const max = Math.max(...rows.map(value), 0);
  const bw = (width - PAD * 2) / Math.max(rows.length, 1);
  const every = Math.ceil(rows.length / Math.max(1, Math.floor((width - PAD * 2) / LABEL_PX)));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${H}`, class: "chart", role: "img", "aria-labelledby": "cost-day-title" },
    svg("title", { id: "cost-day-title", text: "Cost per day" }),
    svg("line", { x1: PAD, y1: H - PAD, x2: width - PAD, y2: H - PAD, class: "axis" }));
  rows.forEach((r, i) => {
    const v = value(r);
    const bh = max ? ((H - PAD * 2) * v) / max : 0;
    const rect = svg("rect", { x: PAD + i * bw + 1, y: H - PAD - bh, width: Math.max(1, bw - 2), height: Math.max(bh, v ? 1 : 0), class: "bar" },
      svg("title", { text: `${r.key}: ${fmtCost(r.cost_usd)} · ${plural(r.turns, "turn")}` }));
    chart.append(rect);
    // counted from the newest day, so that today (the last bar) is always labelled
    if ((rows.length - 1 - i) % every === 0) chart.append(svg("text", { x: PAD + i * bw, y: H - 8, class: "tick", text: r.key.slice(5) }));
  });
  const most = spend ? fmtCost(max) : plural(max, "turn");
  chart.append(svg("text", { x: PAD, y: 16, class: "tick", text: `${spend ? "cost" : "no spend yet: turns"} per day, max ${most}` }));
  return chart;
}

// One row a bar: its name (`name(row)`, an element), the bar, the amount; then the figures in
// a table.
function barList(rows, label, name) {
  if (!rows.length) return h("p", { class: "muted" }, "Nothing yet.");
  const { value, shown } = measure(rows);
  const max = Math.max(...rows.map(value), 0);
  const bars = h("ul", { class: "hbars", "aria-label": label }, rows.map((r) => {
    const fill = h("span", { class: "fill" });
    fill.style.width = `${max ? (100 * value(r)) / max : 0}%`;
    return h("li", {}, name(r), h("span", { class: "bar", "aria-hidden": "true" }, fill), h("span", { class: "num" }, shown(r)));
  }));
  const table = h("table", { class: "small" }, h("thead", {}, h("tr", {}, [label, "Cost", "Turns", "Tokens in", "Tokens out"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, h("td", {}, name(r)), h("td", { class: "num" }, fmtCost(r.cost_usd)), h("td", { class: "num" }, String(r.turns)), h("td", { class: "num" }, fmtInt(r.input_tokens)), h("td", { class: "num" }, fmtInt(r.output_tokens))))));
  return h("div", {}, bars, h("details", {}, h("summary", {}, "Table"), h("div", { class: "table-wrap" }, table)));
}

export function costsView(root) {
  const days = h("select", { id: "cost-days", "aria-label": "Period" }, [7, 30, 90].map((d) => h("option", { value: d, selected: d === 30 }, `last ${d} days`)));
  const body = h("div", { id: "costs" });
  root.append(h("section", { class: "view" },
    h("div", { class: "view-head" }, h("h1", {}, "Costs"), h("div", { class: "filters" }, days)), body));
  let byDay = [];
  const dayBox = h("div", { class: "day-chart" });
  function drawDays() {
    const width = Math.floor(dayBox.clientWidth);
    if (width && byDay.length) dayBox.replaceChildren(dayChart(byDay, width));
  }
  const fit = new ResizeObserver(drawDays);
  fit.observe(dayBox);
  async function load() {
    try {
      // days begin at this browser's midnight, not UTC's
      const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
      const c = await api("GET", `/costs?days=${days.value}${zone ? `&tz=${encodeURIComponent(zone)}` : ""}`);
      // a session by its title; untitled (no prompt yet) or purged, by its short id
      const session = (r) => {
        const title = r.title;
        return h("a", { href: `#/s/${r.key}`, class: title ? "name" : "name mono", title: title ? `${title} (${r.key})` : r.key }, title ? h("bdi", {}, title) : shortId(r.key));
      };
      byDay = c.by_day;
      body.replaceChildren(
        h("p", { class: "stat big" }, `Total ${fmtCost(c.total_usd)} since ${c.since}`),
        h("section", { class: "panel" }, h("h2", {}, "Per day"), dayBox),
        h("div", { class: "grid2" },
          h("section", { class: "panel" }, h("h2", {}, "Per model"), barList(c.by_model, "Model", (r) => h("span", { class: "name mono", title: r.key }, r.key))),
          h("section", { class: "panel" }, h("h2", {}, "Per session (top 20)"), barList(c.by_session, "Session", session))));
      drawDays();
    } catch (err) { toast(errorText(err)); }
  }
  days.addEventListener("change", load);
  load();
  return { stop() { fit.disconnect(); } };
}
