"""`GET /openapi.json` is a valid OpenAPI 3.1 document, and the live daemon keeps to it.

The document is checked with openapi-spec-validator; then schemathesis generates requests from
it (valid and invalid ones, a few per operation, derandomized) and sends them to a real
`metis serve` subprocess on a loopback port (scripted model, offline) with the daemon's key.
Every check runs on every answer: no 5xx, only declared status codes and content types,
bodies matching their schemas, invalid requests refused, valid ones accepted, the key required.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import hypothesis
import pytest
import schemathesis
from openapi_spec_validator import validate
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import Failure

from metis.testing.serving import SERVE_START_DEADLINE_S, free_port

# Requests the document calls valid that a daemon still refuses, by what they name: things
# that exist on this machine, in this configuration or in this session's state, which no schema
# states (a workspace directory, a configured model or agent, a cursor this server issued, the
# order of a seed history, answers to calls that are pending, a time zone). Any other 4xx of a
# valid request is a limit the document fails to declare.
_AAP_TURN = frozenset({"invalid_option", "invalid_tools", "invalid_tool_answers"})
REFUSED_BY_STATE: dict[tuple[str, str], frozenset[str]] = {
    ("POST", "/sessions"): frozenset(
        {"workspace_not_found", "invalid_workspace", "model_not_configured"}
    ),
    # cursor_invalid only (see below); a `~user` this machine does not know
    ("GET", "/sessions"): frozenset({"validation_error", "invalid_workspace"}),
    ("GET", "/sessions/{session_id}/messages"): frozenset({"validation_error"}),
    ("GET", "/costs"): frozenset({"validation_error"}),  # a time zone this machine does not know
    ("GET", "/sessions/{session_id}/events"): frozenset({"validation_error"}),
    ("PATCH", "/sessions/{session_id}"): frozenset({"model_not_configured"}),
    ("POST", "/sessions/{session_id}/turns"): frozenset({"model_not_configured"}),
    ("POST", "/models/{model}/reset"): frozenset({"model_not_configured"}),
    ("GET", "/aap/sessions"): frozenset({"invalid_cursor"}),
    ("GET", "/aap/sessions/{session_id}/history"): frozenset({"history_type_not_supported"}),
    ("GET", "/aap/v1/sessions"): frozenset({"invalid_cursor"}),
    ("POST", "/aap/sessions"): frozenset(
        {"unknown_agent", "invalid_option", "invalid_tools", "invalid_seed"}
    ),
    ("PUT", "/aap/v1/session"): frozenset(
        {"unknown_agent", "invalid_option", "invalid_tools", "invalid_seed"}
    ),
    ("POST", "/aap/sessions/{session_id}/turns"): _AAP_TURN,
    ("POST", "/aap/v1/session/{session_id}"): _AAP_TURN,
}
# validation_error types that name a thing rather than a malformed value (a cursor, a time
# zone), and `exclusive` (`before` and `after` together): OpenAPI parameters cannot say "one
# of" (the document's descriptions do)
STATE_VALIDATION_TYPES = frozenset(
    {"cursor_invalid", "cursor_not_found", "exclusive", "unknown_time_zone"}
)


def valid_requests_are_accepted(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """schemathesis's positive_data_acceptance, but a refusal for a state the request names
    (REFUSED_BY_STATE) is not a defect of the document."""
    try:
        return schemathesis.checks.positive_data_acceptance(ctx, response, case)
    except Failure:
        error = _error_of(response)
        allowed = REFUSED_BY_STATE.get((case.method.upper(), case.path), frozenset())
        if error is None or error.get("code") not in allowed:
            raise
        if error["code"] == "validation_error":
            types = {e.get("type") for e in error.get("details", {}).get("errors", [])}
            if not types <= STATE_VALIDATION_TYPES:
                raise
        return None


def _error_of(response: Any) -> dict[str, Any] | None:
    try:
        return response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return None


# The contract pass below makes ~2,000 requests (every operation's boundary cases and wrong
# methods, then generated ones): the module's daemon and that pass start first in a run.
pytestmark = pytest.mark.runs_long

# A few examples per operation keep the pass near 30 s on a slow host; derandomized, the same
# cases run every time (a failure reproduces).
MAX_EXAMPLES = 3
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_headers_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.negative_data_rejection,
    valid_requests_are_accepted,
    schemathesis.checks.missing_required_header,
    schemathesis.checks.unsupported_method,
    schemathesis.checks.ignored_auth,
]


@dataclass(frozen=True)
class Live:
    base_url: str
    key: str
    metis_session: str
    metis_turn: str
    aap_session: str


def _call(live_url: str, key: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(live_url + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def _wait_serving(url: str, process: subprocess.Popen[bytes]) -> None:
    give_up = time.monotonic() + SERVE_START_DEADLINE_S
    while time.monotonic() < give_up:
        assert process.poll() is None, "metis serve exited during start-up"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("metis serve did not start")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """`metis serve` as a user runs it, with one metis session that ran a turn and one AAP
    session: the ids the generated requests use, so operations reach past their 404."""
    root = tmp_path_factory.mktemp("openapi-contract")
    home, workspace = root / "home", root / "workspace"
    workspace.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "METIS_API_KEY", "METIS_HOST")
    }
    env.update(METIS_HOME=str(home), METIS_OFFLINE="1")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "metis.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_serving(url, process)
        key = (home / "api_key").read_text().strip()
        session = _call(url, key, "POST", "/sessions", {"workspace_path": str(workspace)})
        turn = _call(
            url,
            key,
            "POST",
            f"/sessions/{session['id']}/turns",
            {"content": [{"type": "text", "text": "hello"}]},
        )
        agent = _call(url, key, "GET", "/aap/meta")["agents"][0]["name"]
        aap = _call(url, key, "POST", "/aap/sessions", {"agent": {"name": agent}})
        yield Live(url, key, session["id"], turn["turn_id"], aap["sessionId"])
    finally:
        process.terminate()
        process.wait(timeout=60)


def _fetch_document(live: Live) -> dict[str, Any]:
    with urllib.request.urlopen(live.base_url + "/openapi.json", timeout=10) as response:
        return json.loads(response.read())


def test_the_document_is_valid_openapi_3_1(live: Live) -> None:
    validate(_fetch_document(live))


@pytest.fixture(scope="module")
def api_schema(live: Live) -> Any:
    config = SchemathesisConfig.from_dict(
        {
            "headers": {"Authorization": f"Bearer {live.key}"},
            "generation": {"database": "none", "deterministic": True},
            "operations": [
                {
                    "include-path-regex": "^/aap/",
                    "parameters": {"session_id": live.aap_session},
                },
                {
                    "include-path-regex": "^/sessions/",
                    "parameters": {"session_id": live.metis_session, "turn_id": live.metis_turn},
                },
            ],
        }
    )
    return schemathesis.openapi.from_dict(_fetch_document(live), config=config)


# Not stateless: the WebSocket upgrade needs an attach token minted by an earlier request, and
# an upgrade is no HTTP request/response pair (tests/server/ws covers it).
schema = schemathesis.pytest.from_fixture("api_schema").exclude(
    path="/sessions/{session_id}/stream"
)


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_the_live_daemon_keeps_to_its_document(case: schemathesis.Case, live: Live) -> None:
    case.call_and_validate(base_url=live.base_url, checks=CHECKS, timeout=30)


def test_limits_are_the_settings_in_force(live: Live) -> None:
    """Declared limits come from the daemon's settings (defaults here), not from copies."""
    doc = _fetch_document(live)
    schemas = doc["components"]["schemas"]
    assert schemas["ConfirmationRequestBody"]["properties"]["reason"]["maxLength"] == 1000
    listing = doc["paths"]["/sessions"]["get"]["parameters"]
    assert {p["name"]: p["schema"].get("maximum") for p in listing}["limit"] == 200
