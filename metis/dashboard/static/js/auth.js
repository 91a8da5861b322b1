// The browser session's credential. After a one-time login link, the daemon redirects to
// `/#login=<secret>`: a URL fragment is never sent to a server. The page moves the secret into
// localStorage, which only this origin (scheme, host and port) can read — unlike a cookie,
// which a browser sends to every port of 127.0.0.1 — drops it from the URL, and sends it as
// `Authorization: Bearer <secret>` with every API call. Logging out forgets it here and ends it
// on the daemon (POST /logout).

const STORAGE_KEY = "metis.session";
let inMemory = null; // when storage is unavailable, the secret lasts as long as the page

export function adoptLoginFragment() {
  const m = location.hash.match(/^#login=([A-Za-z0-9_-]+)$/);
  if (!m) return;
  inMemory = m[1];
  try {
    localStorage.setItem(STORAGE_KEY, m[1]);
  } catch {
    // private mode or storage disabled: keep it in memory only
  }
  history.replaceState(null, "", location.pathname + location.search);
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
