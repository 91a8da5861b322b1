"""`deferring_ca_bundle` and `load_ca_bundle`: TLS contexts made while deferring read no CA file
until loaded."""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator

import pytest

from metis.http.ca_bundle import deferring_ca_bundle, load_ca_bundle

VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")


def _trusted(context: ssl.SSLContext) -> int:
    return context.cert_store_stats()["x509_ca"]


@pytest.fixture
def system_bundle() -> Iterator[int]:
    """How many CA certificates a default context trusts on this machine (skip if none)."""
    count = _trusted(ssl.create_default_context())
    if count == 0:
        pytest.skip("this machine has no CA bundle to defer")
    yield count


def test_contexts_made_while_deferring_trust_nothing_until_loaded(system_bundle: int) -> None:
    with deferring_ca_bundle():
        verifying = ssl.create_default_context()
        plain = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        plain.set_default_verify_paths()
    assert (_trusted(verifying), _trusted(plain)) == (0, 0)
    assert verifying.verify_mode == ssl.CERT_REQUIRED and verifying.check_hostname
    load_ca_bundle()
    assert _trusted(verifying) == system_bundle
    load_ca_bundle()  # once: nothing is left to load
    assert _trusted(verifying) == system_bundle


def test_the_environment_and_the_ssl_module_are_as_they_were_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", "/somewhere/ca.pem")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    make_default = ssl.create_default_context
    with deferring_ca_bundle():
        assert all(os.environ[name] != "/somewhere/ca.pem" for name in VARIABLES)
    assert os.environ["SSL_CERT_FILE"] == "/somewhere/ca.pem"
    assert "SSL_CERT_DIR" not in os.environ
    assert ssl.create_default_context is make_default


def test_a_context_given_its_own_cas_or_verifying_nothing_is_not_deferred(
    system_bundle: int,
) -> None:
    ca = ssl.get_default_verify_paths().cafile
    if ca is None:
        pytest.skip("no default CA file")
    with deferring_ca_bundle():
        own = ssl.create_default_context(cafile=ca)
        client_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # verifies no one
    assert _trusted(own) == system_bundle  # loaded at once, as asked
    load_ca_bundle()
    assert _trusted(client_side) == 0
