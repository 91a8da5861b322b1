"""aiohttp's default TLS contexts, made without the system's CA bundle at import, loaded later.

Importing aiohttp makes its two default client contexts at once, and each reads the system's CA
bundle into memory: on the 2-core machine ~50 ms of a `metis serve` start and ~3 MiB of an
idle daemon's resident set, for contexts the daemon itself never uses (it serves plain HTTP on
loopback; the provider SDKs and the MCP client build TLS contexts of their own). `metis serve`
imports aiohttp inside `deferred_ca_bundle()`, where OpenSSL's default CA file and directory
point at nothing, and loads the bundle into the verifying context once a client has come
(`DeferredCaBundle.load`, in a thread). A verifying context used before that has no trusted
certificate: a TLS connection through it fails verification, it is never trusted blindly.
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


class DeferredCaBundle:
    """The verifying contexts made inside `deferred_ca_bundle()`, each with its purpose."""

    def __init__(self) -> None:
        self._pending: list[tuple[ssl.SSLContext, ssl.Purpose]] = []
        self._lock = threading.Lock()

    def record(self, context: ssl.SSLContext, purpose: ssl.Purpose) -> None:
        with self._lock:
            self._pending.append((context, purpose))

    def load(self) -> None:
        """Load the default CA certificates into every recorded context, once (the environment
        as it is now decides where they come from, as it would have at import)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for context, purpose in pending:
            context.load_default_certs(purpose)
            log.debug(
                "CA bundle loaded into aiohttp's default TLS context (%d certificates)",
                context.cert_store_stats()["x509_ca"],
            )

    def load_in_background(self) -> None:
        """`load` in a daemon thread: reading the bundle takes tens of milliseconds."""
        threading.Thread(target=self.load, name="metis-load-ca-bundle", daemon=True).start()


@contextlib.contextmanager
def deferred_ca_bundle() -> Iterator[DeferredCaBundle]:
    """Within it, `ssl.create_default_context()` and `SSLContext.set_default_verify_paths()`
    read no CA file; the verifying contexts `create_default_context` returns are recorded for
    `DeferredCaBundle.load`. Process-wide (the environment and the `ssl` module): for the
    single-threaded start of a process only."""
    deferred = DeferredCaBundle()
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
            deferred.record(context, purpose)
        return context

    os.environ.update(dict.fromkeys(_OPENSSL_PATH_VARIABLES, _NOWHERE))
    ssl.create_default_context = recording
    try:
        yield deferred
    finally:
        ssl.create_default_context = make_default
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
