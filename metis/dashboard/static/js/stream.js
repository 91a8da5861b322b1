// One session's live events over the WebSocket, re-attached by itself after any drop.
//
// The first attach asks for a snapshot; every re-attach subscribes with `since` = the id of
// the last bus event handled, so the daemon replays exactly what was missed (no gap) and
// events already handled are dropped by id (no duplicate). Streaming frames are never
// replayed: after a re-attach the view re-reads the newest messages (`onResync`).

import { api } from "./api.js";

const FINAL_CODES = new Set(["session_ended", "session_purged"]);

export class SessionStream {
  constructor(sessionId, handlers) {
    this.sessionId = sessionId;
    this.handlers = handlers; // {onSnapshot, onEvent, onResync, onState, onGone}
    this.lastId = null;
    this.seen = new Set();
    this.ws = null;
    this.closed = false;
    this.retry = 0;
    this.timer = null;
  }

  start() {
    this.connect();
  }

  stop() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000);
  }

  state(s) {
    this.handlers.onState?.(s);
  }

  async connect() {
    if (this.closed) return;
    this.state(this.lastId ? "reconnecting" : "connecting");
    let session;
    try {
      session = await api("GET", `/sessions/${this.sessionId}`);
    } catch (err) {
      if (this.closed) return;
      // unknown here: never created, or purged before this view opened (a purge while
      // following ends the socket with `session_purged` instead)
      if (err.code === "session_not_found") return this.handlers.onGone?.("not found");
      return this.later();
    }
    // the view was left while the daemon answered: no socket for a page that is gone
    if (this.closed) return;
    if (!session.ws_url) {
      // ended: nothing live to follow; the view shows the stored transcript
      this.handlers.onGone?.("ended", session);
      return;
    }
    const ws = new WebSocket(session.ws_url);
    this.ws = ws;
    let resumed = this.lastId !== null;
    ws.onopen = () => {
      const sub = resumed
        ? { type: "subscribe", filter: "preset:full", since: this.lastId }
        : { type: "subscribe", filter: "preset:full", snapshot: true };
      ws.send(JSON.stringify(sub));
    };
    ws.onmessage = (msg) => {
      if (this.closed) return; // a frame already on its way when the view was left
      let frame;
      try {
        frame = JSON.parse(msg.data);
      } catch {
        return;
      }
      if (frame.type === "ping") {
        ws.send(JSON.stringify({ type: "pong", nonce: frame.nonce }));
      } else if (frame.type === "subscribe_ack") {
        this.retry = 0;
        this.state("live");
        if (resumed) this.handlers.onResync?.("replayed");
      } else if (frame.type === "subscribe_error") {
        if (frame.code === "cursor_expired" || frame.code === "replay_too_large") {
          this.lastId = null; // start over from a snapshot
          resumed = false;
        }
      } else if (frame.type === "snapshot") {
        this.lastId = frame.snapshot_at_event_id;
        this.handlers.onSnapshot?.(frame);
      } else if (frame.type === "event") {
        const ev = frame.event;
        if (ev.id) {
          if (this.seen.has(ev.id)) return;
          this.seen.add(ev.id);
          this.lastId = ev.id;
        }
        this.handlers.onEvent?.(ev, frame);
      }
    };
    ws.onclose = (e) => {
      if (this.ws !== ws) return;
      this.ws = null;
      let code = null;
      try {
        code = JSON.parse(e.reason || "{}").code;
      } catch {
        code = null;
      }
      if (this.closed) return;
      if (FINAL_CODES.has(code)) {
        this.state("ended");
        return this.handlers.onGone?.(code === "session_purged" ? "purged" : "ended");
      }
      this.later();
    };
  }

  later() {
    if (this.closed) return;
    this.state("reconnecting");
    const delay = Math.min(5000, 250 * 2 ** this.retry);
    this.retry += 1;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), delay);
  }
}
