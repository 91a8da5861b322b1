"""The shell's bubblewrap sandbox: the `bwrap` command line, and detecting bwrap at start-up.

`build_argv` is pure. `ShellSandbox.argv` adds the one impure step, looking up which hidden
paths exist right now (a mount over a missing path would fail), and `detect` runs once when
the core starts: it finds the executable and runs a probe with the same namespace flags.

What the command sees (docs/sandbox.md is the user-facing statement):

- `/` read-only; the workspace read-write; a private, empty tmpfs on `/tmp`; a minimal
  `/dev`; a fresh `/proc` of its own PID namespace (the daemon and every other process of the
  machine are invisible);
- METIS_HOME and the user's credential folders and files replaced by an empty read-only tmpfs
  (folders) or `/dev/null` (files); a hidden folder that holds the workspace is hidden all the
  same, and the workspace is mounted back inside it;
- no network (a new network namespace with loopback only) unless `tools.shell.network`;
- no capabilities (`--cap-drop ALL`: a root daemon's command could otherwise remount `/`
  read-write), its own IPC and UTS namespaces;
- `--die-with-parent`: a daemon killed with SIGKILL takes its commands down with it.

`--new-session` is not used: the command must stay in the process group whose members get
SIGTERM at a timeout or cancel (see `shell.py`), and that group already lives in a session of
its own without a controlling terminal (`start_new_session`), which is what `--new-session`
protects against (TIOCSTI).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pwd
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Relative to a home folder: where credentials, keys and tokens usually live.
CREDENTIAL_PATHS: tuple[str, ...] = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".config/gh",
    ".config/hub",
    ".config/git/credentials",
    ".npmrc",
    ".pypirc",
    ".gem/credentials",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
    ".password-store",
    ".local/share/keyrings",
    ".config/op",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
)
# Absolute: a writable Docker socket is root on the host, read-only mount or not.
SYSTEM_HIDDEN_PATHS: tuple[str, ...] = ("/run/docker.sock", "/var/run/docker.sock")

NAMESPACE_FLAGS: tuple[str, ...] = (
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--cap-drop",
    "ALL",
)
SANDBOX_TMP = "/tmp"


def _depth(path: str) -> int:
    return len([part for part in path.split("/") if part])


def build_argv(
    bwrap: str,
    command: str,
    workspace: str,
    *,
    hide_dirs: Iterable[str] = (),
    hide_files: Iterable[str] = (),
    network: bool = False,
) -> list[str]:
    """The full argv running `/bin/sh -c command` in the sandbox, working in `workspace`.

    Paths are absolute and resolved (no symlinks). Mounts are applied shallowest first, so a
    hidden folder holding the workspace is covered before the workspace is bound back into it,
    and a hidden folder inside the workspace is covered after the workspace is bound. A hidden
    path equal to the workspace is not hidden.
    """
    mounts: list[tuple[int, int, list[str]]] = [
        (_depth(SANDBOX_TMP), 0, ["--tmpfs", SANDBOX_TMP]),
        (_depth(workspace), 1, ["--bind", workspace, workspace]),
    ]
    readonly: list[str] = []
    for path in sorted(set(hide_dirs)):
        if path != workspace and path != "/":
            mounts.append((_depth(path), 0, ["--tmpfs", path]))
            readonly += ["--remount-ro", path]
    for path in sorted(set(hide_files)):
        mounts.append((_depth(path), 0, ["--ro-bind", "/dev/null", path]))
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for _, _, args in sorted(mounts, key=lambda m: (m[0], m[1])):
        argv += args
    argv += readonly
    argv += NAMESPACE_FLAGS
    if not network:
        argv.append("--unshare-net")
    argv += ["--chdir", workspace, "/bin/sh", "-c", command]
    return argv


def hidden_candidates(homes: Iterable[str], metis_home: str) -> tuple[str, ...]:
    """METIS_HOME, the credential paths under each home, and the system paths (absolute)."""
    paths = [metis_home]
    for home in dict.fromkeys(h for h in homes if h and os.path.isabs(h)):
        paths += [os.path.join(home, rel) for rel in CREDENTIAL_PATHS]
    return (*paths, *SYSTEM_HIDDEN_PATHS)


def existing(paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """The paths that exist now, resolved, split into folders and other files."""
    dirs: list[str] = []
    files: list[str] = []
    for path in paths:
        real = os.path.realpath(path)
        if os.path.isdir(real):
            dirs.append(real)
        elif os.path.lexists(real):
            files.append(real)
    return dirs, files


def user_homes() -> list[str]:
    """`$HOME` and the account's home from the password database (they may differ)."""
    homes = [os.environ.get("HOME", "")]
    with contextlib.suppress(KeyError):
        homes.append(pwd.getpwuid(os.getuid()).pw_dir)
    return [h for h in homes if h]


@dataclass(frozen=True)
class ShellSandbox:
    """A usable bwrap and what it hides; one per daemon, built by `detect`."""

    bwrap: str
    network: bool
    hidden: tuple[str, ...]
    lookup: Callable[[Iterable[str]], tuple[list[str], list[str]]] = existing

    name = "bubblewrap"

    def argv(self, command: str, workspace: str) -> list[str]:
        """The bwrap command line running `command` in `workspace`; the hidden paths are looked up
        on each call, so a secret file created after start-up is hidden too."""
        dirs, files = self.lookup(self.hidden)
        return build_argv(
            self.bwrap,
            command,
            os.path.realpath(workspace),
            hide_dirs=dirs,
            hide_files=files,
            network=self.network,
        )


def find_bwrap(configured: str | None) -> str | None:
    """The configured path if it is an executable file, else `bwrap` on PATH (None: absent)."""
    if configured is not None:
        path = os.path.expanduser(configured)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which("bwrap")


def probe(bwrap: str, network: bool) -> str | None:
    """Run `true` with the sandbox's namespace flags; None if it works, else why not."""
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *NAMESPACE_FLAGS]
    argv += [] if network else ["--unshare-net"]
    try:
        done = subprocess.run(
            [*argv, "/bin/sh", "-c", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip()
        return reason or f"exit code {done.returncode}"
    return None


@functools.cache
def _probe_once(bwrap: str, network: bool, identity: tuple[int, int, int]) -> str | None:
    """`probe`, asked once per binary (its inode, size and mtime) and network flag in a process.

    A daemon probes once at start-up, but a process that builds several runtimes (an in-process
    restart, the test suite's thousand daemons) would otherwise set up and tear down a set of
    namespaces each time; a replaced or rebuilt binary has another identity and is probed anew.
    """
    return probe(bwrap, network)


def _identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def detect(
    *,
    mode: str,
    bwrap_path: str | None,
    network: bool,
    metis_home: str,
    homes: Sequence[str] | None = None,
) -> tuple[ShellSandbox | None, str]:
    """Start-up: the sandbox to use, or None and why not (logged as one WARNING by the caller)."""
    if mode == "off":
        return None, "tools.shell.sandbox is off"
    found = find_bwrap(bwrap_path)
    if found is None:
        where = bwrap_path if bwrap_path is not None else "bwrap on PATH"
        return None, f"bubblewrap not found ({where})"
    try:
        failure = _probe_once(found, network, _identity(found))
    except OSError as exc:  # gone between finding and probing it
        failure = str(exc)
    if failure is not None:
        return None, f"{found} cannot create a sandbox here: {failure}"
    homes = user_homes() if homes is None else list(homes)
    hidden = hidden_candidates(homes, os.path.realpath(metis_home))
    return ShellSandbox(bwrap=found, network=network, hidden=hidden), ""
