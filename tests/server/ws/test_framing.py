"""Bulk server frames (metis/server/ws/framing.py) decode as RFC 6455 says, at every length."""

from __future__ import annotations

import pytest

from metis.server.ws.framing import batches, text_frame, text_frame_header, text_frames


def decode(buffer: bytes) -> list[tuple[int, bytes]]:
    """(first byte, payload) of each unmasked frame in `buffer`; fails on trailing bytes."""
    frames, i = [], 0
    while i < len(buffer):
        first, second = buffer[i], buffer[i + 1]
        assert second & 0x80 == 0, "server frames are never masked"
        length, i = second & 0x7F, i + 2
        if length == 126:
            length, i = int.from_bytes(buffer[i : i + 2], "big"), i + 2
        elif length == 127:
            length, i = int.from_bytes(buffer[i : i + 8], "big"), i + 8
        frames.append((first, buffer[i : i + length]))
        i += length
    assert i == len(buffer)
    return frames


@pytest.mark.parametrize("length", [0, 1, 125, 126, 65535, 65536, 200_000])
def test_each_length_class_round_trips_as_a_final_text_frame(length: int) -> None:
    payload = b"x" * length
    assert decode(text_frames([payload])) == [(0x81, payload)]
    assert text_frame(payload) == text_frames([payload])  # one frame, memoised for many sockets


def test_header_uses_the_shortest_length_encoding() -> None:
    assert len(text_frame_header(125)) == 2
    assert len(text_frame_header(126)) == 4
    assert len(text_frame_header(65535)) == 4
    assert len(text_frame_header(65536)) == 10


def test_many_payloads_keep_their_order_and_boundaries() -> None:
    payloads = [f'{{"n":{n}}}'.encode() * (1 + n * 97) for n in range(50)]
    assert [p for _, p in decode(text_frames(payloads))] == payloads


def test_batches_close_at_the_byte_limit_and_never_come_out_empty() -> None:
    payloads = [b"a" * 10, b"b" * 10, b"c" * 100, b"d" * 5]
    assert list(batches(payloads, 20)) == [payloads[:2], payloads[2:3], payloads[3:]]
    assert list(batches(payloads, 1)) == [[p] for p in payloads]
    assert list(batches([], 20)) == []
