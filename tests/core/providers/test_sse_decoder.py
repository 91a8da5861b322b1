"""The event-stream decoder under both adapters: every event exactly once, whatever the chunking."""

from __future__ import annotations

import pytest

from metis.core.providers.sse import ServerEvent, SseDecoder

BODY = (
    b"event: message_start\n"
    b'data: {"type":"message_start"}\n\n'
    b": a comment line\n"
    b"event: content_block_delta\n"
    b"id: 7\n"
    b"retry: 1000\n"
    b'data: {"text":"h\xc3\xa9"}\n\n'
    b'data: {"first":1}\n'
    b"data:second line\n\n"
    b"event: ping\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    ServerEvent("message_start", b'{"type":"message_start"}'),
    ServerEvent("content_block_delta", b'{"text":"h\xc3\xa9"}'),
    ServerEvent(None, b'{"first":1}\nsecond line'),
    ServerEvent(None, b"[DONE]"),
]


def decode_in_pieces(body: bytes, cuts: list[int]) -> list[ServerEvent]:
    decoder = SseDecoder()
    events: list[ServerEvent] = []
    start = 0
    for cut in [*cuts, len(body)]:
        events.extend(decoder.feed(body[start:cut]))
        start = cut
    return events


def test_whole_body_decodes_to_each_event_once() -> None:
    assert decode_in_pieces(BODY, []) == EXPECTED


def test_every_split_point_gives_the_same_events() -> None:
    for cut in range(1, len(BODY)):
        assert decode_in_pieces(BODY, [cut]) == EXPECTED, cut


def test_byte_by_byte_feeding_gives_the_same_events() -> None:
    assert decode_in_pieces(BODY, list(range(1, len(BODY)))) == EXPECTED


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"], ids=["crlf", "cr"])
def test_crlf_and_cr_line_endings_even_when_split_between_chunks(newline: bytes) -> None:
    body = BODY.replace(b"\n", newline)
    assert decode_in_pieces(body, []) == EXPECTED
    for cut in range(1, len(body)):
        assert decode_in_pieces(body, [cut]) == EXPECTED, cut


def test_a_block_without_data_dispatches_nothing() -> None:
    assert SseDecoder().feed(b"event: ping\n\n: keep-alive\n\nid: 3\n\n") == []


def test_an_unterminated_last_event_is_not_dispatched() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b'event: message_stop\ndata: {"type":"message_stop"}\n') == []


def test_data_without_a_space_after_the_colon_keeps_its_value() -> None:
    assert SseDecoder().feed(b"event:x\ndata:{}\n\n") == [ServerEvent("x", b"{}")]
