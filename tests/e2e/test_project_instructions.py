"""Project instructions: the workspace's AGENTS.md (else CLAUDE.md) reaches the model's system
prompt at every turn, is re-read when it changes, and is announced with
`session.instructions_loaded`; `GET /sessions/{id}` shows the file in use."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from metis.core.sessions.instructions import (
    MAX_FILE_BYTES,
    MAX_INSTRUCTIONS_BYTES,
    InstructionsReader,
    read_instruction_file,
)
from metis.core.tools.base import PermissionDenied
from metis.core.tools.sandbox import MetisHome, Sandbox
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api, api_session
from tests.e2e.test_provider_turns import AUTO_TOOLS, MODEL_OF, models_yaml


def system_text(fake: FakeProviderServer, api_name: str, index: int = -1) -> tuple[str, str]:
    """(stable, volatile) system text of a recorded request."""
    body = fake.requests_for(api_name)[index].body  # type: ignore[arg-type]
    if api_name == "anthropic":
        blocks = body["system"]
        stable = blocks[0]["text"]
        volatile = blocks[1]["text"] if len(blocks) > 1 else ""
        return stable, volatile
    first = body["messages"][0]
    assert first["role"] in ("system", "developer")
    return first["content"], ""


def loaded_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "session.instructions_loaded"]


@pytest.mark.parametrize("api_name", ["anthropic", "openai"])
async def test_agents_md_reaches_the_system_prompt_and_is_announced_once(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path, api_name: str
) -> None:
    _, api, fake = env
    text = "Always run `make check` before you answer.\nUse tabs.\n"
    (workspace / "AGENTS.md").write_text(text)
    sid = (await api.create_session(workspace, initial_active_model=MODEL_OF[api_name]))["id"]
    fake.enqueue(api_name, FakeReply.say("one"), FakeReply.say("two"))
    first, _ = await api.run_turn(sid, "hello")
    await api.run_turn(sid, "again")
    stable, volatile = system_text(fake, api_name, 0)
    assert "Always run `make check` before you answer." in stable and "AGENTS.md" in stable
    if api_name == "anthropic":  # the instructions are in the stable (cacheable) block
        assert "make check" not in volatile and "Current date" in volatile
    assert system_text(fake, api_name, 1)[0] == stable  # unchanged file: same prompt
    events = loaded_events(await api.events(sid))
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert [e["payload"] for e in events] == [
        {"file": "AGENTS.md", "sha256": digest, "bytes": len(text.encode()), "truncated": False}
    ]
    assert events[0]["turn_id"] == first["turn_id"]
    _, session = await api.call("GET", f"/sessions/{sid}")
    assert session["instructions"] == {"file": "AGENTS.md", "sha256": digest, "truncated": False}


async def test_a_change_is_picked_up_on_the_next_turn(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    (workspace / "CLAUDE.md").write_text("Prefer small functions.\n")
    sid = (await api.create_session(workspace, initial_active_model=MODEL_OF["anthropic"]))["id"]
    fake.enqueue("anthropic", FakeReply.say("a"), FakeReply.say("b"), FakeReply.say("c"))
    await api.run_turn(sid, "one")
    assert "Prefer small functions." in system_text(fake, "anthropic")[0]
    # AGENTS.md wins over CLAUDE.md as soon as it exists
    (workspace / "AGENTS.md").write_text("Write docstrings everywhere.\n")
    second, _ = await api.run_turn(sid, "two")
    stable = system_text(fake, "anthropic")[0]
    assert "Write docstrings everywhere." in stable and "Prefer small functions." not in stable
    # an edit with the same size and a restored mtime is still seen (inode/size/mtime + hash)
    path = workspace / "AGENTS.md"
    before = path.stat()
    path.write_text("Write docstrings nowhere.  \n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1))
    third, _ = await api.run_turn(sid, "three")
    assert "Write docstrings nowhere." in system_text(fake, "anthropic")[0]
    events = loaded_events(await api.events(sid))
    assert [e["payload"]["file"] for e in events] == ["CLAUDE.md", "AGENTS.md", "AGENTS.md"]
    assert [e["turn_id"] for e in events[1:]] == [second["turn_id"], third["turn_id"]]
    assert len({e["payload"]["sha256"] for e in events}) == 3


async def test_an_oversized_file_is_cut_with_a_note(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    line = "- rule número ünïcödé\n"
    text = line * (3 * MAX_INSTRUCTIONS_BYTES // len(line.encode()))
    (workspace / "AGENTS.md").write_text(text)
    sid = (await api.create_session(workspace, initial_active_model=MODEL_OF["anthropic"]))["id"]
    fake.enqueue("anthropic", FakeReply.say("ok"))
    await api.run_turn(sid, "go")
    stable = system_text(fake, "anthropic")[0]
    size = len(text.encode())
    assert f"[AGENTS.md is {size:,} bytes; only its first 32,768 bytes are included here.]" in (
        stable
    )
    included = stable.split("workspace root; follow them unless the user says otherwise):\n")[1]
    body = included.rsplit("\n[AGENTS.md is", 1)[0]
    assert text.startswith(body) and 32_000 < len(body.encode()) <= MAX_INSTRUCTIONS_BYTES
    assert "\ufffd" not in body  # never cut inside a character
    (event,) = loaded_events(await api.events(sid))
    assert event["payload"]["truncated"] is True and event["payload"]["bytes"] == size
    _, session = await api.call("GET", f"/sessions/{sid}")
    assert session["instructions"]["truncated"] is True


async def test_no_file_means_no_instructions_and_no_event(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    sid = (await api.create_session(workspace, initial_active_model=MODEL_OF["anthropic"]))["id"]
    _, session = await api.call("GET", f"/sessions/{sid}")
    assert session["instructions"] is None
    fake.enqueue("anthropic", FakeReply.say("a"), FakeReply.say("b"))
    await api.run_turn(sid, "go")
    assert "Project instructions" not in system_text(fake, "anthropic")[0]
    assert loaded_events(await api.events(sid)) == []
    # a file that appears, then goes away: announced both times
    (workspace / "AGENTS.md").write_text("x\n")
    await api.run_turn(sid, "again")
    (workspace / "AGENTS.md").unlink()
    fake.enqueue("anthropic", FakeReply.say("c"))
    await api.run_turn(sid, "third")
    assert "Project instructions" not in system_text(fake, "anthropic")[0]
    events = loaded_events(await api.events(sid))
    assert [e["payload"]["file"] for e in events] == ["AGENTS.md", None]
    _, session = await api.call("GET", f"/sessions/{sid}")
    assert session["instructions"] is None


async def test_an_unchanged_file_is_not_read_again_and_links_out_are_ignored(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    reader = InstructionsReader()
    assert await reader.read(str(ws)) is None
    (ws / "AGENTS.md").write_text("rules\n")
    first = await reader.read(str(ws))
    assert first is not None and first.text == "rules\n" and reader.reads == 1
    for _ in range(5):
        assert await reader.read(str(ws)) is first
    assert reader.reads == 1
    (ws / "AGENTS.md").unlink()
    outside = tmp_path / "secret.txt"
    outside.write_text("not for the model\n")
    (ws / "AGENTS.md").symlink_to(outside)
    (ws / "CLAUDE.md").symlink_to(ws / "inside.md")
    (ws / "inside.md").write_text("inside rules\n")
    found = await reader.read(str(ws))
    assert found is not None and found.file == "CLAUDE.md" and found.text == "inside rules\n"


async def test_a_file_linking_to_the_daemons_key_is_never_sent(
    fake: FakeProviderServer, start_daemon: Any, metis_home: Path
) -> None:
    """In a workspace that holds METIS_HOME (listed, so allowed), AGENTS.md pointing at the
    daemon's key is ignored as a file tool would refuse it; CLAUDE.md is used instead."""
    holder = metis_home.parent
    config = AUTO_TOOLS + f"allowed_workspace_roots: [{holder}]\n"
    d = await start_daemon(config=config, models=models_yaml(fake))
    key = (metis_home / "api_key").read_text().strip()
    (holder / "AGENTS.md").symlink_to(metis_home / "api_key")
    (holder / "CLAUDE.md").write_text("Be brief.\n")
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(holder, initial_active_model=MODEL_OF["anthropic"]))["id"]
        fake.enqueue("anthropic", FakeReply.say("ok"))
        await api.run_turn(sid, "hello")
        _, session = await api.call("GET", f"/sessions/{sid}")
    stable, volatile = system_text(fake, "anthropic", 0)
    assert key not in stable + volatile and "Be brief." in stable
    assert session["instructions"]["file"] == "CLAUDE.md"


async def ignored_until_rewritten(
    ws: Path, caplog: pytest.LogCaptureFixture, *, reads: int, said: str
) -> None:
    """Over three turns the workspace's AGENTS.md is not used, read `reads` times and `said`
    once in the log; rewritten as text, it is used at the next turn."""
    reader = InstructionsReader()
    for _ in range(3):
        assert await reader.read(str(ws)) is None
    assert reader.reads == reads
    assert sum(said in r.getMessage() for r in caplog.records) == 1
    (ws / "AGENTS.md").write_text("now text\n")
    found = await reader.read(str(ws))
    assert found is not None and found.text == "now text\n"


async def test_a_binary_file_is_not_used_and_is_read_once_while_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00binary")
    await ignored_until_rewritten(ws, caplog, reads=1, said="not a text file")


async def test_a_file_of_gigabytes_is_not_read_and_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Hashing a sparse 1 TiB AGENTS.md whole would hold every turn's start for minutes."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with open(ws / "AGENTS.md", "wb") as handle:
        handle.write(b"# Rules\n")
        handle.truncate(1024**4)
    await ignored_until_rewritten(ws, caplog, reads=0, said="not used as instructions")


async def test_a_binary_file_is_refused_by_its_head(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with open(ws / "AGENTS.md", "wb") as handle:
        handle.write(b"\0\0binary")
        handle.truncate(MAX_FILE_BYTES)  # 8 MiB of NULs, of which only the head is read
    assert await InstructionsReader().read(str(ws)) is None


@pytest.mark.parametrize("broken", ["binary", "huge", "link out"])
async def test_an_unusable_agents_md_gives_way_to_claude_md_and_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    agents = ws / "AGENTS.md"
    if broken == "binary":
        agents.write_bytes(b"a\0b")
    elif broken == "huge":
        with open(agents, "wb") as handle:
            handle.truncate(MAX_FILE_BYTES + 1)
    else:
        (tmp_path / "outside.md").write_text("not for the model\n")
        agents.symlink_to(tmp_path / "outside.md")
    (ws / "CLAUDE.md").write_text("claude rules\n")
    reader = InstructionsReader()
    for _ in range(3):
        found = await reader.read(str(ws))
        assert found is not None and found.file == "CLAUDE.md"
        assert found.text == "claude rules\n"
    assert sum("AGENTS.md" in r.getMessage() for r in caplog.records) == 1


def test_a_file_swapped_for_a_link_to_the_daemons_key_after_the_check_is_not_read(
    tmp_path: Path,
) -> None:
    """The race a process writing the workspace could run: AGENTS.md checked as a file inside
    the workspace, then replaced by a link to the daemon's key before it is opened."""
    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    ws.mkdir()
    (home / "api_key").write_text("daemon-secret\n")
    (ws / "AGENTS.md").write_text("rules\n")
    sandbox = Sandbox(str(ws), (), MetisHome.at(home, home / "workspaces"))
    loaded, _ = read_instruction_file(str(ws / "AGENTS.md"), "AGENTS.md", 1024, sandbox)
    assert loaded.text == "rules\n"
    (ws / "AGENTS.md").unlink()
    (ws / "AGENTS.md").symlink_to(home / "api_key")  # after the check, before the read
    with pytest.raises(PermissionDenied):
        read_instruction_file(str(ws / "AGENTS.md"), "AGENTS.md", 1024, sandbox)
    (ws / "AGENTS.md").unlink()
    (tmp_path / "outside.md").write_text("outside\n")
    (ws / "AGENTS.md").symlink_to(tmp_path / "outside.md")
    with pytest.raises(PermissionDenied):
        read_instruction_file(str(ws / "AGENTS.md"), "AGENTS.md", 1024, sandbox)
