// REST calls with the browser session cookie (same origin; the browser adds Origin to writes).

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

export async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "network_error", "the daemon is not reachable", {});
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const e = (data && data.error) || {};
    if (response.status === 401 && e.code === "unauthorized") {
      location.reload(); // the session expired: the page now shows how to log in
    }
    throw new ApiError(response.status, e.code || "http_error", e.message || response.statusText, e.details);
  }
  return data;
}

const renderCache = new Map();

// Markdown → sanitized HTML, rendered by the daemon (model output is untrusted).
export async function renderMarkdown(texts) {
  const missing = [...new Set(texts.filter((t) => !renderCache.has(t)))];
  if (missing.length) {
    const { html } = await api("POST", "/render/markdown", { markdown: missing });
    missing.forEach((t, i) => renderCache.set(t, html[i]));
  }
  return texts.map((t) => renderCache.get(t));
}

export async function allEvents(sessionId, query = {}) {
  const out = [];
  let cursor = null;
  for (;;) {
    const params = new URLSearchParams({ limit: "500", ...query });
    if (cursor) params.set("cursor", cursor);
    const page = await api("GET", `/sessions/${sessionId}/events?${params}`);
    out.push(...page.events);
    cursor = page.next_cursor;
    if (!cursor) return out;
  }
}
