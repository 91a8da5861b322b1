// REST calls with the browser session secret as a bearer header (auth.js); the browser adds Origin to writes.
// Every call also tells the header whether the daemon answers (`#conn`): the sessions list
// polls and the session view re-attaches, so the indicator follows the daemon on its own.

import { authHeaders, credential, forget } from "./auth.js";

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

// What a refused or failed call says to a person: the daemon's message (its code is for scripts;
// an answer without a message falls back to it), begun with a capital unless it sits inside a
// sentence of the page's own.
export function errorText(err, { sentence = true } = {}) {
  const text = (err && (err.message || err.code)) || String(err);
  return sentence && /^[a-z]+(\s|$)/.test(text) ? text[0].toUpperCase() + text.slice(1) : text;
}

export async function api(method, path, body) {
  // the browser session travels as a header, never as a cookie (auth.js)
  const init = { method, credentials: "omit", headers: authHeaders() };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    reachable(false);
    throw new ApiError(0, "network_error", "the daemon is not reachable", {});
  }
  reachable(true);
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) throw refused(response, data);
  return data;
}

// The error of a refused call (`data`: its parsed body, if any). A refused browser session
// (expired, or ended elsewhere) is forgotten and the page reloads to say how to log in again.
function refused(response, data) {
  const e = (data && data.error) || {};
  if (response.status === 401 && e.code === "unauthorized" && credential()) {
    forget();
    location.reload();
  }
  return new ApiError(response.status, e.code || "http_error", e.message || response.statusText, e.details);
}

// A file the daemon makes (a session's export), saved by the browser under the name the daemon
// gives it: fetched with the session's bearer header, which a plain link could not carry.
export async function download(path) {
  let response;
  try {
    response = await fetch(path, { credentials: "omit", headers: authHeaders() });
  } catch {
    reachable(false);
    throw new ApiError(0, "network_error", "the daemon is not reachable", {});
  }
  reachable(true);
  if (!response.ok) {
    let data = null;
    try { data = await response.json(); } catch { /* not the envelope */ }
    throw refused(response, data);
  }
  const named = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") || "");
  const url = URL.createObjectURL(await response.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = named ? named[1] : "export";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

function reachable(yes) {
  const conn = document.getElementById("conn");
  if (conn) conn.textContent = yes ? "" : "daemon not reachable";
}

const renderCache = new Map();
// POST /render/markdown takes at most 200 texts and 1,000,000 characters in all
// (MAX_RENDER_TEXTS and MAX_RENDER_CHARS in metis/dashboard/routes.py)
const RENDER_MAX_TEXTS = 200;
export const RENDER_MAX_CHARS = 1_000_000;

// Markdown → sanitized HTML, rendered by the daemon (model output is untrusted), in as few
// requests as the daemon's limits allow. A text longer than the limit is never sent: its entry
// is null, and the caller shows it as plain text. A refused or failed request throws.
export async function renderMarkdown(texts) {
  const missing = [...new Set(texts.filter((t) => t.length <= RENDER_MAX_CHARS && !renderCache.has(t)))];
  const batches = [];
  let batch = [];
  let chars = 0;
  for (const t of missing) {
    if (batch.length && (batch.length === RENDER_MAX_TEXTS || chars + t.length > RENDER_MAX_CHARS)) {
      batches.push(batch);
      batch = [];
      chars = 0;
    }
    batch.push(t);
    chars += t.length;
  }
  if (batch.length) batches.push(batch);
  await Promise.all(batches.map(async (b) => {
    const { html } = await api("POST", "/render/markdown", { markdown: b });
    b.forEach((t, i) => renderCache.set(t, html[i]));
  }));
  return texts.map((t) => (renderCache.has(t) ? renderCache.get(t) : null));
}

// Every text and thinking block of `messages` rendered ahead (then `renderMarkdown` answers
// them from the cache, without a round trip each). Never throws: a text it could not render
// is tried again, and shown anyway, by its own message.
export async function prerender(messages) {
  const texts = [];
  for (const m of messages) {
    if (m.role !== "user" && m.role !== "assistant") continue;
    for (const b of m.content) {
      if (b.type === "text") texts.push(b.text);
      else if (b.type === "thinking") texts.push(b.thinking || "");
    }
  }
  try {
    await renderMarkdown(texts);
  } catch { /* as said above */ }
}

export async function allEvents(sessionId, query = {}) {
  const out = [];
  let cursor = null;
  for (;;) {
    const params = new URLSearchParams({ limit: "1000", ...query });
    if (cursor) params.set("cursor", cursor);
    const page = await api("GET", `/sessions/${sessionId}/events?${params}`);
    out.push(...page.events);
    cursor = page.next_cursor;
    if (!cursor) return out;
  }
}
