// MCP servers (GET /mcp): each configured server's state, its tools as the model is offered
// them with their confirmation policy, and why it is not ready when it is not. Polled while
// open, since a server starts, crashes and restarts on its own; a poll that changes nothing
// leaves the page as it is (no flicker, no lost selection). "Restart" connects to a server
// again now (POST /mcp/{name}/restart) with its entry as config.yaml has it then, without
// waiting out its restart backoff; "Reload config.yaml" applies every change of the file's mcp
// section (POST /mcp/reload).

import { api, errorText } from "../api.js";
import { h, clear, toast, breakable } from "../dom.js";
import { whileVisible } from "../poll.js";

const POLL_MS = 2000;

const STATE_BADGE = {
  ready: "ok",
  starting: "running",
  restarting: "running",
  stopped: "bad",
  disabled: "muted",
};

const POLICY_TEXT = {
  auto: "runs without asking",
  prompt: "asks every time",
  prompt_once: "asks once per session",
  deny: "never runs",
};

// What a reload did (POST /mcp/reload's `applied`: the servers added, changed, removed).
function reloadSummary({ added, changed, removed }) {
  if (!added.length && !changed.length && !removed.length) return "Reloaded config.yaml: no changes";
  const said = [["added", added], ["changed", changed], ["removed", removed]]
    .filter(([, names]) => names.length)
    .map(([what, names]) => `${what} ${names.join(", ")}`);
  return `Reloaded config.yaml: ${said.join("; ")}`;
}

function serverCard(s, restart) {
  const where = s.transport === "http"
    ? h("code", { class: "mono" }, s.url)
    : h("code", { class: "mono" }, [s.command, ...s.args].join(" "));
  const facts = [
    h("dt", {}, s.transport === "http" ? "URL" : "Command"), h("dd", {}, where),
    h("dt", {}, "Policy"), h("dd", {}, h("code", {}, s.policy), ` — ${POLICY_TEXT[s.policy] || ""}`),
  ];
  if (s.env.length) facts.push(h("dt", {}, "Environment"), h("dd", { class: "mono small" }, s.env.join(", ")));
  if (s.headers.length) facts.push(h("dt", {}, "Headers"), h("dd", { class: "mono small" }, s.headers.join(", ")));
  if (s.restarts) facts.push(h("dt", {}, "Restarts"), h("dd", {}, String(s.restarts)));
  const tools = s.tools.length
    ? h("div", { class: "table-wrap" }, h("table", { class: "small mcp-tools" },
      h("thead", {}, h("tr", {}, ["Tool (as the model sees it)", "Server's name", "Policy", "What it does"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, s.tools.map((t) => h("tr", {},
        h("td", { class: "mono" }, breakable(t.name)),
        // labelled for a phone, where the table's rows are stacked without its head
        h("td", { class: "mono", dataset: { label: "Server's name" } }, breakable(t.remote_name)),
        h("td", { dataset: { label: "Policy" } }, h("span", { title: POLICY_TEXT[t.policy] || "" }, t.policy)),
        // the server's description (plain text, never markup): its first line, at most a few
        // lines' worth of it (some descriptions are pages long), all of it on hover
        h("td", { class: "description", title: t.description }, summary(t.description)))))))
    : h("p", { class: "muted" }, {
      ready: "This server offers no tools.",
      disabled: "None: it is disabled in config.yaml (enabled: false).",
    }[s.state] || "No tools until it is ready.");
  return h("section", { class: "panel mcp-server", dataset: { name: s.name }, "aria-label": `MCP server ${s.name}` },
    h("div", { class: "mcp-head" },
      h("h2", {}, h("span", { class: "mono" }, s.name), " ",
        h("span", { class: `badge ${STATE_BADGE[s.state] || ""} state` }, s.state), " ",
        h("span", { class: "muted small" }, s.transport)),
      s.enabled ? h("button", {
        type: "button", class: "restart", "aria-label": `Restart MCP server ${s.name}`,
        title: "End its connection and connect again now (a tool call running on it fails)",
        onclick: () => restart(s.name),
      }, "Restart") : null),
    s.last_error ? h("p", { class: s.state === "ready" ? "warn last-error" : "error last-error" }, s.last_error) : null,
    h("dl", { class: "kv" }, facts),
    h("h3", {}, `Tools (${s.tools.length})`),
    tools);
}

export function mcpView(root) {
  const body = h("div", { id: "mcp", "aria-live": "polite" });
  const problem = h("p", { class: "error", role: "alert" });
  const hint = h("p", { class: "muted small", id: "mcp-hint" },
    "From ", h("code", {}, "mcp.servers"), " in ", h("code", {}, "config.yaml"),
    ". Edited it? Reload config.yaml applies the changes without restarting the daemon; a server's Restart applies its own entry.");
  const reloadButton = h("button", { type: "button", id: "mcp-reload", title: "Apply config.yaml's mcp section as it is now",
    onclick: () => reload() }, "Reload config.yaml");
  root.append(h("section", { class: "view" },
    h("div", { class: "view-head" }, h("h1", {}, "MCP servers"), reloadButton), hint, problem, body));
  let shown = null;
  let stopped = false;

  const asked = new Set(); // asked, not answered yet: a second press does nothing
  // A restart or a reload, then the page as it is (a refusal is said in a toast, so is a
  // reload's outcome: the page alone would not tell an unchanged file from a refused one).
  async function ask(path, answered) {
    if (asked.has(path)) return; // (not `disabled`: that would take the keyboard away)
    asked.add(path);
    try {
      const answer = await api("POST", path);
      answered?.(answer); // (not `answered?.(await api(…))`, which asks nothing without one)
    } catch (err) {
      toast(errorText(err));
    }
    asked.delete(path);
    if (!stopped) refresh();
  }
  // said, since a quick server is ready again before the next refresh shows it restarting
  const restart = (name) => ask(`/mcp/${encodeURIComponent(name)}/restart`,
    () => toast(`Restarting ${name}: connecting to it again`, { ok: true }));
  function reload() {
    ask("/mcp/reload", (answer) => toast(reloadSummary(answer.applied), { ok: true }));
  }

  async function refresh() {
    try {
      const data = await api("GET", "/mcp");
      problem.textContent = "";
      const text = JSON.stringify(data.servers);
      if (text !== shown) {
        shown = text;
        // a rebuilt card keeps the keyboard on its Restart button
        const focused = document.activeElement?.closest?.(".mcp-server")?.dataset.name;
        clear(body).append(...(data.servers.length
          ? data.servers.map((s) => serverCard(s, restart))
          : [h("section", { class: "panel empty" },
            h("p", {}, "No MCP servers are configured."),
            h("p", { class: "muted" }, "Add them under ", h("code", {}, "mcp.servers"), " in ", h("code", {}, "config.yaml"),
              " in the daemon's home; their tools are then offered to the model as ", h("code", {}, "mcp__<server>__<tool>"), "."))]));
        if (focused !== undefined) {
          [...body.querySelectorAll(".mcp-server")].find((c) => c.dataset.name === focused)?.querySelector("button.restart")?.focus();
        }
      }
    } catch (err) {
      problem.textContent = `Could not load the MCP servers: ${errorText(err, { sentence: false })}`;
    }
    poll.next();
  }
  const poll = whileVisible(refresh, POLL_MS);
  refresh();
  return { stop() { stopped = true; poll.stop(); } };
}

const SUMMARY_CHARS = 240;

function summary(description) {
  const first = description.split("\n")[0];
  return first.length > SUMMARY_CHARS ? `${first.slice(0, SUMMARY_CHARS).trimEnd()}…` : first;
}
