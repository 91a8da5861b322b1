// The browser session's credential. After a one-time login link, the daemon redirects to
// `/#login=<secret>`: a URL fragment is never sent to a server. The page moves the secret into
// localStorage, which only this origin (scheme, host and port) can read — unlike a cookie,
// which a browser sends to every port of 127.0.0.1 — drops it from the URL, and sends it as
// `Authorization: Bearer <secret>` with every API call. Logging out forgets it here and ends it
// on the daemon (POST /logout).

const STORAGE_KEY = "metis.session";
let inMemory = null; // when storage is unavailable, the secret lasts as long as the page

// The secret of `/#login=<secret>` replaces the stored one only once the daemon has accepted
// it: a link to this address in a model's reply (`/#login=anything`) must not overwrite a
// working session with a refused secret and so log every tab out. Kept in memory only where
// storage fails: a copy in memory beside the stored one would outlive a logout in another tab.
export async function adoptLoginFragment() {
  const m = location.hash.match(/^#login=([A-Za-z0-9_-]+)$/);
  if (!m) return;
  history.replaceState(null, "", location.pathname + location.search);
  if (credential() && !(await accepted(m[1]))) return;
  try {
    localStorage.setItem(STORAGE_KEY, m[1]);
    inMemory = null;
  } catch {
    inMemory = m[1]; // private mode or storage disabled: it lasts as long as the page
  }
}

async function accepted(secret) {
  try {
    const response = await fetch("/server/version", {
      headers: { Authorization: `Bearer ${secret}` },
      credentials: "omit",
    });
    return response.status !== 401;
  } catch {
    return false; // the daemon does not answer: the session in use stays
  }
}

export function credential() {
  try {
    return localStorage.getItem(STORAGE_KEY) ?? inMemory;
  } catch {
    return inMemory;
  }
}

export function forget() {
  inMemory = null;
  try {
    localStorage.removeItem(STORAGE_KEY);
  } catch {
    // nothing stored
  }
}

export function authHeaders() {
  const secret = credential();
  return secret ? { Authorization: `Bearer ${secret}` } : {};
}

// Whether this page may use the API: its stored secret is valid (or the daemon runs with
// `auth.required: false`). A refused secret is forgotten. A daemon that does not answer counts
// as signed in: the views then say it is not reachable.
export async function signedIn() {
  let response;
  try {
    response = await fetch("/server/version", { headers: authHeaders(), credentials: "omit" });
  } catch {
    return true;
  }
  if (response.status === 401) {
    forget();
    return false;
  }
  return true;
}

// Another tab logged out (or the storage was cleared): this one follows.
export function followOtherTabs(onLoggedOut) {
  window.addEventListener("storage", (e) => {
    if ((e.key === STORAGE_KEY || e.key === null) && !credential()) onLoggedOut();
  });
}
