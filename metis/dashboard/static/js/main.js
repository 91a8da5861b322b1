// The dashboard's router: #/ sessions, #/s/<id> a session, #/s/<id>/trace its trace,
// #/routing routing & models, #/costs costs, #/mcp MCP servers.

import { sessionsView } from "./views/sessions.js";
import { sessionView } from "./views/session.js";
import { traceView } from "./views/trace.js";
import { routingView } from "./views/routing.js";
import { costsView } from "./views/costs.js";
import { mcpView } from "./views/mcp.js";
import { clear, h } from "./dom.js";
import { api } from "./api.js";
import { adoptLoginFragment, credential, followOtherTabs, forget, signedIn } from "./auth.js";

const app = document.getElementById("app");
let current = null;

// What the browser's tab and history say of each page (a session's view names its session).
const TITLES = { sessions: "Sessions", routing: "Routing & models", costs: "Costs", mcp: "MCP servers" };

function route() {
  if (current?.stop) current.stop();
  current = null;
  clear(app);
  const hash = location.hash.replace(/^#/, "") || "/";
  let m;
  let nav = "sessions"; // a session and its trace belong to Sessions; null: to no nav link
  if ((m = hash.match(/^\/s\/([\w-]+)\/trace$/))) current = traceView(app, m[1]);
  else if ((m = hash.match(/^\/s\/([\w-]+)(?:\?at=([\w-]+))?$/))) current = sessionView(app, m[1], m[2] || null);
  else if (hash === "/routing") (current = routingView(app)), (nav = "routing");
  else if (hash === "/costs") (current = costsView(app)), (nav = "costs");
  else if (hash === "/mcp") (current = mcpView(app)), (nav = "mcp");
  else if (hash === "/" || hash.startsWith("/?")) current = sessionsView(app);
  else (nav = null), notFound(hash);
  if (!m) document.title = `${nav ? TITLES[nav] : "Page not found"} · metis`;
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (a.dataset.nav === nav) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  app.dataset.ready = "1";
}

// An address no view answers (a mistyped or outdated link) says so rather than showing another
// page as if it were the one asked for.
function notFound(hash) {
  app.append(h("section", { class: "view" },
    h("div", { class: "view-head" }, h("h1", {}, "Page not found")),
    h("p", {}, "Nothing here answers ", h("code", {}, `#${hash}`), "."),
    h("p", {}, h("a", { href: "#/" }, "Go to the sessions"))));
}

// Without a valid browser session the page only says how to log in (#login).
function showLogin() {
  if (current?.stop) current.stop();
  current = null;
  document.body.classList.add("login");
  for (const el of document.querySelectorAll(".skip, header.top, #app")) el.hidden = true;
  document.getElementById("login").hidden = false;
}

async function logOut() {
  const button = document.getElementById("logout");
  button.disabled = true;
  try {
    await api("POST", "/logout");
  } catch {
    // unreachable or already over: forgetting the secret here still logs this browser out
  }
  forget();
  history.replaceState(null, "", "/");
  location.reload();
}

async function boot() {
  await adoptLoginFragment(); // `/#login=<secret>`, right after a login link
  if (!(await signedIn())) return showLogin();
  for (const el of document.querySelectorAll(".skip, header.top, #app")) el.hidden = false;
  const logout = document.getElementById("logout");
  logout.hidden = !credential(); // with `auth.required: false` there is no session to end
  logout.addEventListener("click", logOut);
  followOtherTabs(() => location.reload());
  // "Skip to content" moves the keyboard to the view; followed as a link, its #app would be
  // read as an address by the router above, and replace the view with "Page not found"
  document.querySelector(".skip").addEventListener("click", (e) => {
    e.preventDefault();
    app.focus();
  });
  window.addEventListener("hashchange", () => {
    route();
    app.focus({ preventScroll: true });
  });
  route();
}

boot();
