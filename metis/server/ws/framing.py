"""Server-to-client WebSocket text frames, many to one socket write (RFC 6455 §5.2).

aiohttp's `send_frame` writes one frame per call, and each call is a system call on the socket:
with one event per frame, those calls were most of what a streamed delta cost on the wire. A
connection with several events queued therefore frames them here and writes them at once.

Only what this surface sends is covered: final, unfragmented text frames, never masked (servers
do not mask) and never compressed (the upgrade sets `compress=False`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

_FIN_TEXT = 0x81  # FIN bit + opcode 0x1 (text)
_LEN16 = 126  # the payload length follows as 16 bits
_LEN64 = 127  # … as 64 bits


def text_frame_header(payload_length: int) -> bytes:
    """The 2-, 4- or 10-byte header of an unmasked final text frame of that payload length."""
    if payload_length < _LEN16:
        return bytes((_FIN_TEXT, payload_length))
    if payload_length < 1 << 16:
        return bytes((_FIN_TEXT, _LEN16)) + payload_length.to_bytes(2, "big")
    return bytes((_FIN_TEXT, _LEN64)) + payload_length.to_bytes(8, "big")


def text_frame(payload: bytes) -> bytes:
    """One frame, header and payload in one buffer: built once for every socket that sends it."""
    return text_frame_header(len(payload)) + payload


def text_frames(payloads: Iterable[bytes]) -> bytes:
    """The frames of `payloads` (UTF-8 text), in order, as one buffer."""
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(text_frame_header(len(payload)))
        parts.append(payload)
    return b"".join(parts)


def batches(payloads: Sequence[bytes], max_bytes: int) -> Iterator[Sequence[bytes]]:
    """Consecutive runs of `payloads`, each closed once it holds `max_bytes` or more (so every
    run has at least one payload, however large)."""
    start = 0
    while start < len(payloads):
        end, size = start + 1, len(payloads[start])
        while end < len(payloads) and size < max_bytes:
            size += len(payloads[end])
            end += 1
        yield payloads[start:end]
        start = end
