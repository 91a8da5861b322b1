"""Ordered schema migrations of the core tables: step i upgrades user_version i → i+1 in one
transaction. A store extension's tables have a named track of their own (`Database.add_track`).

Migrations are additive; a column change uses SQLite's create-copy-rename procedure.
"""

from __future__ import annotations

SCHEMA_V1 = """
CREATE TABLE sessions (id TEXT PRIMARY KEY, workspace_path TEXT NOT NULL, surface TEXT NOT NULL DEFAULT 'metis',
  is_worker INTEGER NOT NULL DEFAULT 0, parent_session_id TEXT, active_model TEXT,
  pending_model_set INTEGER NOT NULL DEFAULT 0, pending_model TEXT, routing_policy_version TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('active','ended')), disposition TEXT, turn_count INTEGER NOT NULL DEFAULT 0,
  input_tokens INTEGER NOT NULL DEFAULT 0, cache_read_tokens INTEGER NOT NULL DEFAULT 0,
  cache_write_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
  cost_so_far_usd TEXT NOT NULL DEFAULT '0', events_floor_seq INTEGER NOT NULL DEFAULT 0,
  created_at_us INTEGER NOT NULL, updated_at_us INTEGER NOT NULL, ended_at_us INTEGER);
CREATE INDEX sessions_workspace ON sessions(workspace_path, id);
CREATE TABLE turns (id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  ordinal INTEGER NOT NULL, status TEXT NOT NULL CHECK (status IN ('running','completed','cancelled','failed')),
  surface TEXT NOT NULL DEFAULT 'metis', trigger TEXT NOT NULL, user_message_id TEXT, resumes_turn_id TEXT,
  model TEXT NOT NULL, confirmation_policy TEXT NOT NULL, stop_reason TEXT, end_reason TEXT, error_message TEXT,
  llm_call_count INTEGER NOT NULL DEFAULT 0, tool_call_count INTEGER NOT NULL DEFAULT 0,
  input_tokens INTEGER NOT NULL DEFAULT 0, cache_read_tokens INTEGER NOT NULL DEFAULT 0,
  cache_write_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
  cost_usd TEXT NOT NULL DEFAULT '0', started_at_us INTEGER NOT NULL, ended_at_us INTEGER,
  UNIQUE (session_id, ordinal));
CREATE INDEX turns_session ON turns(session_id, id);
CREATE INDEX turns_running ON turns(status) WHERE status = 'running';
CREATE TABLE messages (id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  turn_id TEXT, role TEXT NOT NULL, status TEXT NOT NULL, content_json TEXT NOT NULL,
  metadata_json TEXT NOT NULL, created_at_us INTEGER NOT NULL, schema_version INTEGER NOT NULL);
CREATE INDEX messages_session ON messages(session_id, id);
CREATE TABLE tool_calls (id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id)
  ON DELETE CASCADE, turn_id TEXT NOT NULL, message_id TEXT NOT NULL, provider_tool_use_id TEXT,
  name TEXT NOT NULL, side_effects TEXT, origin TEXT NOT NULL DEFAULT 'builtin', status TEXT NOT NULL
  CHECK (status IN ('pending','awaiting_confirmation','awaiting_client','running','completed','failed',
  'cancelled','invalid')), error_class TEXT, is_error INTEGER, result_message_id TEXT UNIQUE,
  input_sha256 TEXT NOT NULL, created_at_us INTEGER NOT NULL, started_at_us INTEGER, ended_at_us INTEGER,
  duration_ms INTEGER);
CREATE INDEX tool_calls_session_status ON tool_calls(session_id, status);
CREATE INDEX tool_calls_turn ON tool_calls(turn_id);
CREATE TABLE confirmations (id TEXT PRIMARY KEY, session_id TEXT NOT NULL
  REFERENCES sessions(id) ON DELETE CASCADE, turn_id TEXT NOT NULL, tool_use_id TEXT NOT NULL UNIQUE,
  tool_name TEXT NOT NULL, policy TEXT NOT NULL CHECK (policy IN ('wait','suspend')), status TEXT NOT NULL
  CHECK (status IN ('pending','allowed','denied','expired','withdrawn')), scope TEXT,
  remembered INTEGER NOT NULL DEFAULT 0, reason TEXT, requested_event_id TEXT, requested_at_us INTEGER NOT NULL,
  expires_at_us INTEGER, resolved_at_us INTEGER, resolved_in_turn_id TEXT);
CREATE INDEX confirmations_session_status ON confirmations(session_id, status);
CREATE TABLE events (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, seq INTEGER NOT NULL, turn_id TEXT,
  parent_event_id TEXT, type TEXT NOT NULL, actor TEXT NOT NULL, timestamp_us INTEGER NOT NULL,
  payload_json TEXT NOT NULL, UNIQUE (session_id, seq));
CREATE INDEX events_turn ON events(turn_id, seq) WHERE turn_id IS NOT NULL;
CREATE INDEX events_session_type ON events(session_id, type, seq);
"""

# v2 is empty. Releases before migration tracks created a surface's own tables in this step;
# such tables now come from that surface's named track (`Database.add_track`), whose first
# step adopts the tables an older database already has (`CREATE … IF NOT EXISTS`). The step
# stays so that the versions of existing databases keep their meaning.
SCHEMA_V2 = ""

# v3: session titles (metis/core/store/titles.py). Releases before it kept them in the metis
# surface's own track ("session_titles", the same table and columns): `IF NOT EXISTS` adopts
# that table with its titles. The old track's row in `schema_tracks` stays; no track of that
# name is registered any more, so nothing reads it.
SCHEMA_V3 = """
CREATE TABLE IF NOT EXISTS session_titles (session_id TEXT PRIMARY KEY
  REFERENCES sessions(id) ON DELETE CASCADE, title TEXT NOT NULL, updated_at_us INTEGER NOT NULL);
"""

# v4: the sessions' search text (metis/core/store/search.py), filled from the messages and
# titles already stored. The two functions are the daemon's own (`search.register_functions`,
# registered on the connection that migrates); a message of a session that no longer exists
# (stored before foreign keys were enforced) gets no row.
SCHEMA_V4 = """
CREATE TABLE session_search_text (session_id TEXT NOT NULL REFERENCES sessions(id)
  ON DELETE CASCADE, source TEXT NOT NULL, text TEXT NOT NULL, PRIMARY KEY (session_id, source));
INSERT INTO session_search_text (session_id, source, text)
  SELECT session_id, id, text FROM (SELECT session_id, id, metis_search_text(content_json) AS text
  FROM messages WHERE role IN ('user', 'assistant') AND session_id IN (SELECT id FROM sessions))
  WHERE text IS NOT NULL;
INSERT INTO session_search_text (session_id, source, text)
  SELECT session_id, 'title', metis_caseless(title) FROM session_titles
  WHERE session_id IN (SELECT id FROM sessions) AND metis_caseless(title) IS NOT NULL;
"""

# MIGRATIONS[i] upgrades a database at user_version i to i + 1.
MIGRATIONS: list[str] = [SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4]
LATEST_VERSION = len(MIGRATIONS)
