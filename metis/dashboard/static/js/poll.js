// Polling that rests while the page is hidden: a dashboard left in a background tab asks the
// daemon nothing (a search of many sessions is not free), and once shown again it refreshes at
// once, then goes on every `ms`.

export function whileVisible(refresh, ms) {
  let timer = null;
  let stopped = false;
  function onVisibility() {
    clearTimeout(timer);
    if (!stopped && !document.hidden) refresh();
  }
  document.addEventListener("visibilitychange", onVisibility);
  return {
    // the next refresh in `ms`, unless the page is hidden (then at the moment it is shown)
    next() {
      clearTimeout(timer);
      if (!stopped && !document.hidden) timer = setTimeout(refresh, ms);
    },
    cancel() { clearTimeout(timer); },
    stop() {
      stopped = true;
      clearTimeout(timer);
      document.removeEventListener("visibilitychange", onVisibility);
    },
  };
}
