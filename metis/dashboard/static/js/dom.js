// Small DOM helpers: elements are built with textContent only; the one HTML sink is
// `setHtml`, fed exclusively by the server's sanitized markdown rendering.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") el.textContent = v;
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) if (c) el.append(c);
  return el;
}

// The only HTML sink: `html` comes from POST /render/markdown (markdown-it + nh3 on the server).
export function setHtml(el, html) {
  el.innerHTML = html;
  for (const a of el.querySelectorAll("a[href]")) {
    a.target = "_blank";
    a.rel = "noopener noreferrer nofollow";
  }
}

// A "Copy" button that puts `text()` on the clipboard and says "Copied" for a moment. The
// daemon's loopback origin is a secure context, so the browser's clipboard is there to ask; a
// refusal is shown, never swallowed.
export function copyButton(what, text) {
  const button = h("button", { type: "button", class: "copy", title: `Copy ${what}`, "aria-label": `Copy ${what}` }, "Copy");
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text());
      button.textContent = "Copied";
      clearTimeout(button.timer);
      button.timer = setTimeout(() => (button.textContent = "Copy"), 1500);
    } catch {
      toast("Copy failed: the browser did not allow access to the clipboard");
    }
  });
  return button;
}

// A block with a Copy button at its top right: beside the block rather than in it, so the
// block's text stays what a selection copies.
export function withCopy(pre, what, text) {
  return h("div", { class: "code-box" }, pre, copyButton(what, text));
}

// Each code block of rendered markdown gets its own Copy button (the code as written, without
// the line end that closes the block).
export function addCodeCopy(el) {
  for (const pre of el.querySelectorAll("pre")) {
    const [parent, next] = [pre.parentNode, pre.nextSibling];
    parent.insertBefore(withCopy(pre, "code", () => pre.textContent.replace(/\n$/, "")), next);
  }
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export function fmtCost(v) {
  const n = Number(v || 0);
  if (n === 0) return "$0";
  if (n < 0.01) return `$${n.toFixed(4)}`;
  return `$${n.toFixed(2)}`;
}

export function fmtInt(n) {
  return Number(n || 0).toLocaleString("en-US");
}

// The tokens a call or a turn read: its three input buckets are disjoint, and with prompt
// caching most of a long session's input is read from the cache.
export function tokensIn(p) {
  return (p.input_tokens || 0) + (p.cache_read_tokens || 0) + (p.cache_write_tokens || 0);
}

// "1 turn", "3 turns", "1,024 events": the count with its noun, singular for one.
export function plural(n, one, many = `${one}s`) {
  return `${fmtInt(n)} ${Number(n) === 1 ? one : many}`;
}

// Text whose long names may break after their underscores and dots (mcp__server__tool_name,
// session.instructions_loaded) rather than anywhere, when a line is too short for them.
export function breakable(text) {
  return text.split(/(?<=[_.])(?![_.])/).flatMap((part, i) => (i ? [h("wbr"), part] : [part]));
}

// A model's id (provider:model) that breaks after its provider in a narrow column, never
// inside the model's name ("claude-" on one line and "sonnet-4-6" on the next).
export function modelId(id) {
  const at = id.indexOf(":");
  return [id.slice(0, at + 1), h("wbr"), h("span", { class: "model-name" }, id.slice(at + 1))];
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

export function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

export function ago(iso) {
  if (!iso) return "";
  const s = (Date.now() - new Date(iso).getTime()) / 1000;
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

// A message at the bottom right for 6 s: a failure unless `ok`. A new one replaces the one
// shown, so a success never sits under an older failure's message.
export function toast(message, { ok = false } = {}) {
  const el = document.getElementById("toast");
  el.textContent = message;
  el.classList.toggle("ok", ok);
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (el.hidden = true), 6000);
}

export function shortId(id) {
  return id ? `${id.slice(0, 9)}…${id.slice(-4)}` : "";
}
