"""aiohttp's default TLS contexts, made without the system's CA bundle at import, loaded later.

Importing aiohttp makes its two default client contexts at once, and each reads the system's CA
bundle into memory: on the 2-core machine ~50 ms of every `metis` command's start and ~3 MiB of
an idle daemon's resident set, for contexts that metis uses only to reach a daemon at an
`https` URL (the daemon serves plain HTTP on loopback; the provider SDKs and the MCP client
build TLS contexts of their own). `metis.cli.main` imports a command's modules inside
`deferring_ca_bundle()`, where OpenSSL's default CA file and directory point at nothing; the
bundle is read into the verifying context by `load_ca_bundle()`: by the daemon in its executor
once a client has come, by a client command before it talks to an `https` URL. A verifying
context used before that trusts no certificate: its TLS connections fail verification, never
trusting blindly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

_OPENSSL_PATH_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")
_NOWHERE = "/nonexistent/metis-ca-deferred"

# Process-wide, as what they stand for is: the module-level contexts of an imported library.
_pending: list[tuple[ssl.SSLContext, ssl.Purpose]] = []
_lock = threading.Lock()


@contextlib.contextmanager
def deferring_ca_bundle() -> Iterator[None]:
    """Within it, `ssl.create_default_context()` and `SSLContext.set_default_verify_paths()`
    read no CA file; the verifying contexts `create_default_context` returns are kept for
    `load_ca_bundle`. It changes the environment and the `ssl` module while it lasts (both
    restored after): for the single-threaded start of a process only."""
    saved = {name: os.environ.get(name) for name in _OPENSSL_PATH_VARIABLES}
    make_default = ssl.create_default_context

    def recording(
        purpose: ssl.Purpose = ssl.Purpose.SERVER_AUTH,
        *,
        cafile: Any = None,
        capath: Any = None,
        cadata: Any = None,
    ) -> ssl.SSLContext:
        context = make_default(purpose, cafile=cafile, capath=capath, cadata=cadata)
        explicit = cafile is not None or capath is not None or cadata is not None
        if not explicit and context.verify_mode != ssl.CERT_NONE:
            with _lock:
                _pending.append((context, purpose))
        return context

    os.environ.update(dict.fromkeys(_OPENSSL_PATH_VARIABLES, _NOWHERE))
    ssl.create_default_context = recording
    try:
        yield
    finally:
        ssl.create_default_context = make_default
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load_ca_bundle() -> None:
    """Load the default CA certificates into every context made while deferring, once (the
    environment as it is now says where they are, as it would have at import). Reading takes
    tens of milliseconds: the daemon runs this in its loop's executor, whose threads are
    joined before the process exits (a daemon thread still inside OpenSSL when the
    interpreter finalized crashed the process)."""
    with _lock:
        pending = list(_pending)
        _pending.clear()
    for context, purpose in pending:
        try:
            context.load_default_certs(purpose)
        except (ssl.SSLError, OSError) as exc:  # TLS through it fails verification, as before
            log.warning("the system's CA bundle could not be read: %s", exc)
            continue
        log.debug(
            "CA bundle loaded into a default TLS context (%d certificates)",
            context.cert_store_stats()["x509_ca"],
        )
