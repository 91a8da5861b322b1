"""Identifiers: ULIDs (time-ordered, Crockford base32) and the session and tool-use ids built on them.

One generator for every id metis mints, so ids sort by creation time across sessions, turns
and messages, and the pattern the OpenAPI document declares is the one checked here.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

# A ULID's 26 Crockford base32 characters (the first at most 7: 128 bits); also the pattern
# the OpenAPI document declares for ids, so the two cannot differ.
ULID_CHARS = "[0-7][0-9A-HJKMNP-TV-Z]{25}"
_ULID_RE = re.compile(rf"^{ULID_CHARS}\Z")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits → two characters
_ulid_lock = threading.Lock()
_ulid_random = random.Random(os.urandom(16))
_last_ulid = 0


def _encode_ulid(value: int) -> str:
    """128 bits as 26 Crockford base32 characters: 48-bit time (10), 80 random bits (16).

    Encoded in three word-sized parts (shifting one 128-bit integer twelve times costs more
    than everything else in `new_ulid`).
    """
    p = _PAIRS
    ts, rnd = value >> 80, value & 0xFFFFFFFFFFFFFFFFFFFF
    hi, lo = rnd >> 40, rnd & 0xFFFFFFFFFF
    return (
        p[ts >> 40]
        + p[(ts >> 30) & 0x3FF]
        + p[(ts >> 20) & 0x3FF]
        + p[(ts >> 10) & 0x3FF]
        + p[ts & 0x3FF]
        + p[hi >> 30]
        + p[(hi >> 20) & 0x3FF]
        + p[(hi >> 10) & 0x3FF]
        + p[hi & 0x3FF]
        + p[lo >> 30]
        + p[(lo >> 20) & 0x3FF]
        + p[(lo >> 10) & 0x3FF]
        + p[lo & 0x3FF]
    )


def new_ulid() -> str:
    """A ULID strictly greater than every earlier one of this process.

    Id order must equal creation order (cursors, message pages and replay rely on it), which a
    plain ULID only promises across milliseconds. Generated here rather than with python-ulid:
    its constructor costs ~20 µs, over half of an event's budget on the bus.
    """
    global _last_ulid
    with _ulid_lock:
        value = (time.time_ns() // 1_000_000) << 80 | _ulid_random.getrandbits(80)
        if value <= _last_ulid:
            value = _last_ulid + 1
        _last_ulid = value
    return _encode_ulid(value)


def is_ulid(value: object) -> bool:
    """Whether a value is a 26-character Crockford ULID (turn, message and event ids)."""
    return isinstance(value, str) and _ULID_RE.match(value) is not None


def new_session_id() -> str:
    """A fresh session id: `sess_` and a ULID, so ids sort by creation time."""
    return f"sess_{new_ulid()}"


def new_tool_use_id() -> str:
    """A tool use id minted by metis (`tu_` and a ULID) for providers whose call ids are not ours;
    the provider's id is mapped back on the next call."""
    return f"tu_{new_ulid()}"


def is_session_id(value: object) -> bool:
    """Whether a value has the shape of a session id; a check of form, not of existence."""
    return isinstance(value, str) and value.startswith("sess_") and is_ulid(value[5:])
