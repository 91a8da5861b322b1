"""Timestamps shown in the terminal: the daemon's UTC in the machine's own time zone."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from metis.wire.when import local_time


@pytest.fixture
def in_new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "EST+5EDT,M3.2.0,M11.1.0")  # POSIX rule: no tz database needed
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_daemon_timestamp_is_shown_in_the_local_time_zone(in_new_york: None) -> None:
    assert local_time("2026-11-28T13:43:56.123456Z") == "2026-11-28 08:43"
    assert local_time("2026-07-01T02:05:00Z", seconds=True) == "2026-06-30 22:05:00"  # summer
    # a line that stands alone names the zone
    assert local_time("2026-11-28T13:43:56Z", seconds=True, zone=True) == "2026-11-28 08:43:56 EST"


def test_what_is_not_a_timestamp_is_shown_as_it_came() -> None:
    assert local_time(None) == "" and local_time("") == ""
    assert local_time("soon") == "soon"
    assert local_time("2026-11-28T13:43:56") == "2026-11-28T13:43:56"  # no zone: not placed
