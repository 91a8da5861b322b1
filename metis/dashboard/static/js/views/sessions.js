// Sessions: a live list (polled) with filters, new session, end and purge.
//
// A poll touches only the rows whose session changed, so keyboard focus (and the Purge
// dialog's return of focus to its button) survives it; a rebuilt row gets focus back on the
// same control.

import { api, errorText } from "../api.js";
import { h, fmtCost, ago, fmtTime, modelId, toast } from "../dom.js";
import { confirmDialog } from "./dialog.js";
import { whileVisible } from "../poll.js";

const POLL_MS = 2000;
const PAGE = 100;
const SEARCH_PAUSE_MS = 250;
const SEARCH_CHARS = 200; // the daemon refuses a longer search

export function sessionsView(root) {
  let stopped = false;
  // The filters live in the address (#/?q=…&status=…&workspace=…): Back from a session returns
  // to the list as it was, and a filtered list can be bookmarked.
  const given = new URLSearchParams(location.hash.split("?")[1] || "");
  const filters = {
    status: ["active", "ended"].includes(given.get("status")) ? given.get("status") : "all",
    workspace: (given.get("workspace") || "").trim(),
    q: (given.get("q") || "").trim().slice(0, SEARCH_CHARS),
  };

  const status = h("select", { id: "f-status", "aria-label": "Status" },
    h("option", { value: "all" }, "all"),
    h("option", { value: "active" }, "active"),
    h("option", { value: "ended" }, "ended"));
  const wsFilter = h("input", { id: "f-workspace", type: "search", placeholder: "workspace path", "aria-label": "Workspace filter" });
  // searched as you type, once typing pauses: a search reads every session's conversation
  const search = h("input", { id: "f-search", type: "search", maxlength: SEARCH_CHARS, placeholder: "words said, or an id  ( / )", "aria-label": "Search sessions", "aria-keyshortcuts": "/", autocomplete: "off" });
  // "/" anywhere on the list but in a field goes to the search, as on most sites with one
  function slash(e) {
    if (e.key !== "/" || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.target.closest?.("input, textarea, select, [contenteditable], dialog")) return;
    e.preventDefault();
    search.focus();
    search.select();
  }
  document.addEventListener("keydown", slash);
  const typing = {}; // a pending filter per field, applied once typing pauses
  status.value = filters.status;
  wsFilter.value = filters.workspace;
  search.value = filters.q;

  function filtered() {
    const shown = new URLSearchParams();
    if (filters.q) shown.set("q", filters.q);
    if (filters.status !== "all") shown.set("status", filters.status);
    if (filters.workspace) shown.set("workspace", filters.workspace);
    const query = shown.toString();
    const hash = query ? `#/?${query}` : "#/";
    if (location.hash !== hash) history.replaceState(null, "", hash);
    pages = 1;
    refresh();
  }
  status.addEventListener("change", () => { filters.status = status.value; filtered(); });
  // both text filters apply once typing pauses, and at once on Enter or the field's ×
  function typed(field, name, now) {
    clearTimeout(typing[name]);
    const apply = () => {
      if (field.value.trim() === filters[name]) return;
      filters[name] = field.value.trim();
      filtered();
    };
    if (now) apply();
    else typing[name] = setTimeout(apply, SEARCH_PAUSE_MS);
  }
  for (const [field, name] of [[search, "q"], [wsFilter, "workspace"]]) {
    field.addEventListener("input", () => typed(field, name, !field.value));
    field.addEventListener("change", () => typed(field, name, true));
  }

  const pathInput = h("input", { id: "new-workspace", type: "text", required: true, placeholder: "/path/to/workspace", "aria-describedby": "new-error", autocomplete: "off" });
  const newError = h("p", { id: "new-error", class: "error", role: "alert" });
  const form = h("form", { class: "new-session", "aria-label": "New session" },
    h("label", { for: "new-workspace" }, "New session on workspace"),
    pathInput,
    h("button", { type: "submit", class: "primary" }, "Create"),
    newError);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    newError.textContent = "";
    try {
      const s = await api("POST", "/sessions", { workspace_path: pathInput.value.trim() });
      location.hash = `#/s/${s.id}`;
    } catch (err) {
      newError.textContent = errorText(err);
      pathInput.setAttribute("aria-invalid", "true");
    }
  });

  const tbody = h("tbody");
  // what an empty list says: how to make the first session (no filter), or that none match
  const NONE_YET = "No sessions yet: create one above on a project directory, or run metis chat in a terminal there.";
  const empty = h("p", { class: "muted", id: "sessions-empty", hidden: true }, NONE_YET);
  // a filtered list that shows nothing offers the way back to all of them
  const clearFilters = h("button", { type: "button", id: "clear-filters", hidden: true, onclick: () => {
    const keys = clearFilters.matches(":focus-visible"); // not a tap: no on-screen keyboard
    Object.values(typing).forEach(clearTimeout);
    Object.assign(filters, { status: "all", workspace: "", q: "" });
    status.value = "all";
    wsFilter.value = search.value = "";
    filtered();
    if (keys) search.focus();
  } }, "Clear the filters");
  // the list shows `pages` pages, newest first; "Show more" adds one (the poll keeps them all)
  let pages = 1;
  const more = h("button", { type: "button", id: "more-sessions", hidden: true, onclick: () => { shownBefore = tbody.rows.length; pages += 1; refresh(); } }, "Show older sessions");
  let shownBefore = 0; // the rows shown before the last "Show older sessions"
  const count = h("p", { class: "muted small", id: "sessions-count", "aria-live": "polite" });
  const table = h("table", { class: "sessions" },
    h("caption", { class: "sr-only" }, "Sessions"),
    h("thead", {}, h("tr", {},
      ["Session", "Workspace", "Surface", "Status", "Model", "Turns", "Cost", "Last activity", ""].map((t) => h("th", { scope: "col" }, t)))),
    tbody);

  root.append(
    h("section", { class: "view" },
      h("div", { class: "view-head" }, h("h1", {}, "Sessions"),
        h("div", { class: "filters" },
          // each label wraps to the next line with its control, never apart from it
          h("span", { class: "filter" }, h("label", { for: "f-search" }, "Search"), search),
          h("span", { class: "filter" }, h("label", { for: "f-status" }, "Status"), status),
          h("span", { class: "filter" }, h("label", { for: "f-workspace" }, "Workspace"), wsFilter))),
      form,
      h("div", { class: "table-wrap" }, table),
      empty, clearFilters,
      h("div", { class: "row list-more" }, count, more)));

  async function end(s) {
    const ok = await confirmDialog(
      "End session?",
      `${s.title || s.id} takes no more turns${s.current_turn_id ? "; its running turn is cancelled" : ""}. Its transcript and trace stay (Purge deletes them).`,
      "End");
    if (!ok) {
      control(s.id, "end")?.focus();
      return;
    }
    try {
      await api("DELETE", `/sessions/${s.id}`);
      refresh();
    } catch (err) { toast(errorText(err)); }
  }

  async function purge(s) {
    const ok = await confirmDialog(
      "Purge session?",
      // the session as End's dialog names it: by its title (else its id), then its id
      `This deletes every message and event of ${s.title ? `${s.title} (${s.id})` : `${s.id} (${s.workspace_path})`}. It cannot be undone.`,
      "Purge");
    if (!ok) {
      control(s.id, "purge")?.focus(); // the dialog's opener may have been rebuilt meanwhile
      return;
    }
    try {
      await api("DELETE", `/sessions/${s.id}?purge=true`);
      refresh();
    } catch (err) { toast(errorText(err)); }
  }

  // Where a searched session says the words, when not in its title (shown above it): the
  // words around them, each searched word marked (as typed, any case).
  const SAID_IN = { user: "in a prompt", assistant: "in a reply" };
  function said(match) {
    const words = filters.q.split(/\s+/).filter(Boolean)
      .map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    if (!match || !SAID_IN[match.where] || !words.length) return null;
    const parts = match.excerpt.split(new RegExp(`(${words.join("|")})`, "iu"));
    return h("div", { class: "said small clamp" }, h("span", { class: "muted" }, `${SAID_IN[match.where]}: `),
      h("bdi", {}, ...parts.map((part, i) => (i % 2 ? h("mark", {}, part) : part))));
  }

  // a session found by words of a message opens at that message
  const atMatch = (match) => (match?.message_id ? `?at=${match.message_id}` : "");

  function row(s) {
    const running = s.current_turn_id ? h("span", { class: "badge running" }, "running") : null;
    // the sessions waiting for their user stand out: a tool call to allow or deny
    const asks = s.pending_confirmation_count;
    const waiting = asks
      ? h("span", { class: "badge s-awaiting-confirmation", title: "Open the session to allow or deny" }, `${asks} to confirm`)
      : null;
    return h("tr", { dataset: { id: s.id }, class: s.status },
      // a long first prompt is clamped to two lines; the tooltip holds all of it
      h("td", { class: "title" }, h("a", { href: `#/s/${s.id}${atMatch(s.match)}`, class: "clamp", title: s.title || null }, s.title ? h("bdi", {}, s.title) : h("span", { class: "muted" }, "(no prompt yet)")), said(s.match), h("div", { class: "muted small mono" }, s.id)),
      h("td", { class: "workspace mono small wrap" }, s.workspace_path),
      h("td", {}, h("span", { class: `badge surface-${s.surface}` }, s.surface)),
      h("td", { class: "status" }, h("span", { class: `badge ${s.status}` }, s.status), " ", running, " ", waiting),
      // "pinned" in words, as the session's page says it: an emoji is a box without an emoji font
      h("td", { class: "model mono small" }, s.active_model ? modelId(s.active_model) : "", s.sticky_model ? h("span", { class: "muted" }, " · pinned") : null),
      // on a phone the table's head is hidden: the count says what it counts
      h("td", { class: "num turns" }, String(s.turn_count), h("span", { class: "unit" }, s.turn_count === 1 ? " turn" : " turns")),
      h("td", { class: "num" }, fmtCost(s.cost_so_far_usd)),
      h("td", { class: "when", title: fmtTime(s.updated_at) }, ago(s.updated_at)),
      h("td", { class: "actions" },
        s.status === "active" ? h("button", { type: "button", dataset: { control: "end" }, onclick: () => end(s), "aria-label": `End session ${s.id}` }, "End") : null,
        h("button", { type: "button", class: "danger", dataset: { control: "purge" }, onclick: () => purge(s), "aria-label": `Purge session ${s.id}` }, "Purge")));
  }

  // The row's link, End or Purge button (null when the row or the control is gone).
  function control(id, name) {
    const tr = [...tbody.rows].find((r) => r.dataset.id === id);
    return tr?.querySelector(name === "link" ? "td.title a" : `[data-control="${name}"]`) || null;
  }

  const shown = new Map(); // session id → {tr, key: what the row shows but the relative time}

  function update(sessions) {
    const focused = document.activeElement;
    const inRow = focused?.closest?.("tbody tr");
    const lost = inRow && tbody.contains(inRow)
      ? { id: inRow.dataset.id, name: focused.matches("td.title a") ? "link" : focused.dataset.control, at: inRow.sectionRowIndex }
      : null;
    const keep = new Set(sessions.map((s) => s.id));
    for (const [id, item] of shown) {
      if (keep.has(id)) continue;
      item.tr.remove();
      shown.delete(id);
    }
    sessions.forEach((s, i) => {
      const { updated_at: _, ...rest } = s;
      const key = JSON.stringify(rest);
      let item = shown.get(s.id);
      if (!item || item.key !== key) {
        const tr = row(s);
        if (item) item.tr.replaceWith(tr);
        item = { tr, key };
        shown.set(s.id, item);
      } else {
        const when = item.tr.querySelector("td.when");
        when.textContent = ago(s.updated_at);
        when.title = fmtTime(s.updated_at);
      }
      // move only a row out of place: moving a row takes focus from what it holds
      const there = tbody.children[i] || null;
      if (item.tr !== there) tbody.insertBefore(item.tr, there);
    });
    if (lost && document.activeElement !== focused) refocus(lost);
  }

  // The keyboard's place once its control is gone: the same control of the rebuilt row; else
  // (an ended session has no End) its Purge, then its link; else (purged, or filtered out) the
  // row now in its place, else the search field.
  function refocus({ id, name, at }) {
    const again = control(id, name) || control(id, "purge") || control(id, "link");
    if (again) return again.focus();
    const near = tbody.rows[Math.min(at, tbody.rows.length - 1)];
    (near?.querySelector("td.title a") || search).focus();
  }

  // An empty list is said in words, without the head of a table that has no rows; a filtered
  // one has "Clear the filters" below (the keyboard on it moves to the search field when it goes).
  function showTable(rows) {
    table.hidden = !rows;
    const narrowed = filters.status !== "all" || filters.workspace || filters.q;
    if (clearFilters.matches(":focus-visible") && (rows || !narrowed)) search.focus();
    clearFilters.hidden = rows || !narrowed;
  }

  // A refresh started later (a filter changed meanwhile) supersedes one still waiting for the
  // daemon: only the latest one's answer is shown, and only it schedules the next poll.
  let latest = 0;

  async function refresh() {
    poll.cancel();
    const mine = ++latest;
    const narrowed = filters.status !== "all" || filters.workspace || filters.q;
    try {
      const sessions = [];
      let cursor = null;
      for (let page = 0; page < pages; page += 1) {
        const params = new URLSearchParams({ limit: String(PAGE), status: filters.status });
        if (filters.workspace) params.set("workspace_path", filters.workspace);
        if (filters.q) params.set("q", filters.q);
        if (cursor) params.set("cursor", cursor);
        const got = await api("GET", `/sessions?${params}`);
        if (stopped || mine !== latest) return;
        sessions.push(...got.sessions);
        cursor = got.next_cursor;
        if (!cursor) break;
      }
      update(sessions);
      wsFilter.removeAttribute("aria-invalid");
      empty.classList.remove("error");
      empty.textContent = narrowed ? "No sessions match these filters." : NONE_YET;
      empty.hidden = sessions.length > 0;
      showTable(sessions.length > 0);
      const hadKeys = document.activeElement === more;
      more.hidden = !cursor;
      // the last page is in: the keyboard goes from the button that went to the rows it added
      if (hadKeys && more.hidden) (tbody.rows[shownBefore]?.querySelector("td.title a") || search).focus();
      const kind = filters.q ? "matching sessions" : narrowed ? "sessions shown" : "sessions";
      count.textContent = !sessions.length ? ""
        : cursor ? `The newest ${sessions.length} ${kind}.`
        : `${sessions.length} ${sessions.length === 1 ? kind.replace("sessions", "session") : kind}.`;
    } catch (err) {
      if (stopped || mine !== latest) return;
      if (err.code === "invalid_workspace" || err.code === "validation_error") {
        // a filter the daemon refuses lists nothing: say why where the rows were
        update([]);
        if (err.code === "invalid_workspace") wsFilter.setAttribute("aria-invalid", "true");
        empty.classList.add("error");
        empty.textContent = `No sessions listed: ${err.message}`;
        empty.hidden = false;
        showTable(false);
        more.hidden = true;
        count.textContent = "";
      } else if (err.code !== "network_error") {
        // an unreachable daemon is shown in the header (api.js), not toasted at every poll
        toast(errorText(err));
      }
    }
    poll.next();
  }

  const poll = whileVisible(refresh, POLL_MS);
  refresh();
  return { stop() { stopped = true; poll.stop(); Object.values(typing).forEach(clearTimeout); document.removeEventListener("keydown", slash); } };
}
