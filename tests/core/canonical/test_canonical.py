"""Canonical vocabulary: ids, time, Decimal strings, content rules and lenient reads."""

from __future__ import annotations

import base64
import json
import logging
from datetime import datetime
from decimal import Decimal

import pytest

from metis.core.canonical.content import (
    CONTENT_BLOCK_ADAPTER,
    MAX_IMAGE_BYTES,
    TOOL_NAME_RE,
    ThinkingBlock,
    interrupted_form,
    parse_user_content,
)
from metis.core.canonical.ids import _encode_ulid, is_session_id, is_ulid, new_session_id, new_ulid
from metis.core.canonical.jsontext import parse_client_json
from metis.core.canonical.messages import (
    Message,
    MessageMetadata,
    decode_content_lenient,
    validate_message,
)
from metis.core.canonical.money import decimal_str
from metis.core.canonical.redaction import redact, register_secret
from metis.core.canonical.times import datetime_to_us, format_us
from metis.core.canonical.usage import TokenUsage, compute_cost
from metis.core.errors import InvalidContent


def test_ulids_are_strictly_increasing_even_within_one_millisecond() -> None:
    ids = [new_ulid() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(is_ulid(i) for i in ids)


def test_malformed_ulids_are_recognised() -> None:
    assert not is_ulid("nope")
    assert not is_ulid("8" + "0" * 25)  # first char beyond 7 overflows 128 bits
    assert not is_ulid(None)
    assert is_session_id(new_session_id())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Decimal("1E-7"), "0.0000001"),
        (Decimal("0"), "0"),
        (Decimal("0.000"), "0"),
        (Decimal("3.50"), "3.5"),
        (Decimal("100"), "100"),
        (Decimal("1E+2"), "100"),
        (Decimal("-0.25"), "-0.25"),
        ("0.0000891", "0.0000891"),
    ],
)
def test_decimal_strings_are_plain_positional(value: Decimal | str, expected: str) -> None:
    assert decimal_str(value) == expected


def test_naive_datetimes_are_rejected() -> None:
    with pytest.raises(ValueError):
        datetime_to_us(datetime(2026, 1, 1))


def test_wire_timestamps_have_six_fractional_digits() -> None:
    assert format_us(1_700_000_000_000_001) == "2023-11-14T22:13:20.000001Z"
    assert format_us(0) == "1970-01-01T00:00:00.000000Z"  # whole seconds keep their digits
    assert format_us(None) is None


def test_a_wire_timestamp_reads_back_as_the_same_microsecond() -> None:
    for us in (1, 999_999, 1_000_000, 1_795_652_312_701_708, 253_402_300_799_999_999):
        text = format_us(us)
        assert text is not None and text.endswith("Z")
        parsed = datetime.fromisoformat(text.removesuffix("Z") + "+00:00")
        assert datetime_to_us(parsed) == us


ALL_BLOCKS = [
    {"type": "text", "text": "hi"},
    {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(b"x").decode(),
        },
    },
    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
    {"type": "thinking", "thinking": "hmm", "signature": "sig=="},
    {"type": "redacted_thinking", "data": "opaque"},
    {"type": "tool_use", "id": "tu_01", "name": "read_file", "input": {"path": "a"}},
    {
        "type": "tool_result",
        "tool_use_id": "tu_01",
        "content": [{"type": "text", "text": "ok"}],
        "is_error": False,
    },
]


@pytest.mark.parametrize("raw", ALL_BLOCKS, ids=lambda b: b["type"])
def test_every_block_type_round_trips_json_unchanged(raw: dict) -> None:
    block = CONTENT_BLOCK_ADAPTER.validate_python(raw)
    assert json.loads(json.dumps(block.model_dump(mode="json"))) == raw


def test_user_content_refuses_unknown_and_assistant_only_blocks() -> None:
    with pytest.raises(InvalidContent) as info:
        parse_user_content(
            [
                {"type": "text", "text": "a"},
                {"type": "audio"},
                {"type": "tool_use", "id": "x", "name": "n", "input": {}},
            ]
        )
    assert [e["index"] for e in info.value.errors] == [1, 2]


@pytest.mark.parametrize(
    "block",
    [
        {"type": "text", "text": ""},
        {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "eA=="}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "***"}},
        {"type": "image", "source": {"type": "url", "url": "http://example.com/a.png"}},
    ],
)
def test_invalid_user_blocks_raise_invalid_content(block: dict) -> None:
    with pytest.raises(InvalidContent):
        parse_user_content([block])


def test_oversized_images_are_refused() -> None:
    big = base64.b64encode(b"\0" * (MAX_IMAGE_BYTES + 1)).decode()
    with pytest.raises(InvalidContent, match="limit"):
        parse_user_content(
            [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": big},
                }
            ]
        )


def _image(media_type: str, data: bytes) -> dict:
    source = {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()}
    return {"type": "image", "source": source}


SIGNATURES = {
    "image/png": b"\x89PNG\r\n\x1a\n",
    "image/jpeg": b"\xff\xd8\xff\xe0",
    "image/gif": b"GIF89a",
    "image/webp": b"RIFF\x10\0\0\0WEBPVP8 ",
}


@pytest.mark.parametrize("media_type", sorted(SIGNATURES))
def test_an_image_whose_bytes_are_what_its_media_type_says_is_accepted(media_type: str) -> None:
    [block] = parse_user_content([_image(media_type, SIGNATURES[media_type] + b"\0" * 20)])
    assert block.source.media_type == media_type


def test_an_image_whose_bytes_are_another_type_or_none_is_refused_saying_what_they_are() -> None:
    with pytest.raises(InvalidContent) as info:
        parse_user_content(
            [
                {"type": "text", "text": "look"},
                _image("image/jpeg", SIGNATURES["image/png"] + b"\0" * 20),
                _image("image/png", b"hello, not an image"),
            ]
        )
    assert info.value.errors == [
        {"index": 1, "msg": "image data is image/png, not image/jpeg as media_type says"},
        {
            "index": 2,
            "msg": "image data is not png, jpeg, gif or webp (media_type says image/png)",
        },
    ]


def test_empty_user_content_is_refused() -> None:
    with pytest.raises(InvalidContent):
        parse_user_content([])


def _msg(role: str, content: list, **meta: object) -> Message:
    blocks = [CONTENT_BLOCK_ADAPTER.validate_python(b) for b in content]
    return Message(
        id=new_ulid(),
        session_id="sess_x",
        turn_id=None,
        role=role,
        content=blocks,
        created_at_us=1,
        metadata=MessageMetadata(**meta),
    )


def test_role_block_matrix_is_enforced() -> None:
    validate_message(_msg("user", [ALL_BLOCKS[0]]))
    validate_message(_msg("assistant", [ALL_BLOCKS[3], ALL_BLOCKS[5]]))
    with pytest.raises(InvalidContent):
        validate_message(_msg("user", [ALL_BLOCKS[5]]))
    with pytest.raises(InvalidContent):
        validate_message(_msg("system", [ALL_BLOCKS[1]]))
    with pytest.raises(InvalidContent):
        validate_message(_msg("tool", [ALL_BLOCKS[6], ALL_BLOCKS[6]], tool_use_id="tu_01"))


def test_tool_message_needs_matching_tool_use_id() -> None:
    validate_message(_msg("tool", [ALL_BLOCKS[6]], tool_use_id="tu_01"))
    with pytest.raises(InvalidContent):
        validate_message(_msg("tool", [ALL_BLOCKS[6]], tool_use_id="tu_02"))


def test_interrupted_assistant_messages_keep_no_tool_use() -> None:
    with pytest.raises(InvalidContent):
        validate_message(_msg("assistant", [ALL_BLOCKS[5]], status="cancelled"))
    kept = interrupted_form(
        [CONTENT_BLOCK_ADAPTER.validate_python(b) for b in ALL_BLOCKS[3:6]]
        + [ThinkingBlock(thinking="x")]
    )
    assert [b.type for b in kept] == ["thinking", "redacted_thinking"]


def test_lenient_decode_drops_unknown_blocks_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        blocks, meta = decode_content_lenient(
            "m1", json.dumps([{"type": "audio"}, {"type": "text", "text": "ok"}]), "{}"
        )
    assert [b.type for b in blocks] == ["text"]
    assert meta.status == "complete"
    assert "m1" in caplog.text


def test_lenient_decode_of_corrupt_row_returns_empty_error_message() -> None:
    blocks, meta = decode_content_lenient("m2", "{not json", "{}")
    assert blocks == [] and meta.status == "error"


def test_redact_removes_registered_secrets_and_key_shapes() -> None:
    register_secret("super-secret-value")
    text = redact("failed with super-secret-value and sk-abcdefghijklmnop")
    assert "super-secret-value" not in text and "sk-abcdefgh" not in text


def test_cost_is_exact_decimal_over_four_buckets() -> None:
    from metis.core.models.types import Pricing

    pricing = Pricing(
        input_per_mtok=Decimal("3"),
        output_per_mtok=Decimal("15"),
        cache_read_per_mtok=Decimal("0.30"),
        cache_write_per_mtok=Decimal("3.75"),
    )
    usage = TokenUsage(
        input_tokens=1000, output_tokens=200, cache_read_tokens=5000, cache_write_tokens=100
    )
    assert decimal_str(compute_cost(usage, pricing)) == "0.007875"


def test_cost_is_computed_in_a_28_digit_context() -> None:
    """A result needing more digits is rounded to 28 significant digits."""
    from decimal import Context

    from metis.core.models.types import Pricing

    price = Decimal("1.234567890123456789012345678")
    zero = Decimal(0)
    pricing = Pricing(
        input_per_mtok=price,
        output_per_mtok=zero,
        cache_read_per_mtok=zero,
        cache_write_per_mtok=zero,
    )
    usage = TokenUsage(input_tokens=987_654_321, output_tokens=0)
    context = Context(prec=28)
    expected = context.divide(context.multiply(Decimal(987_654_321), price), Decimal(1_000_000))
    cost = compute_cost(usage, pricing)
    assert cost == expected and len(cost.as_tuple().digits) == 28


def test_ulid_encoding_matches_the_reference_library() -> None:
    import random

    from ulid import ULID

    rng = random.Random(5)
    for _ in range(2000):
        value = rng.getrandbits(126)
        assert _encode_ulid(value) == str(ULID.from_int(value))
    fresh = new_ulid()
    assert str(ULID.from_str(fresh)) == fresh


def test_anchored_patterns_refuse_a_final_newline() -> None:
    """`$` also matches before a final newline; ids and tool names must end where they end."""
    ulid = new_ulid()
    assert is_ulid(ulid) and not is_ulid(ulid + "\n")
    assert TOOL_NAME_RE.match("read_file") and not TOOL_NAME_RE.match("read_file\n")


def test_client_json_is_rfc_8259_and_round_trips() -> None:
    """What parses can be written back as JSON: no NaN, no infinity, no lone surrogate."""
    assert parse_client_json('{"a": [1e300, -2.5e-300, 10]}') == {"a": [1e300, -2.5e-300, 10]}
    for bad in ("NaN", "[Infinity]", '{"a": 1e999}', "[-1E+400]", '"\\ud800"'):
        with pytest.raises(ValueError):
            parse_client_json(bad)


def test_client_json_refuses_a_key_given_twice_at_any_depth() -> None:
    """Never last-wins (a second `"decision"` once overrode the first); the refusal names the
    key, cut short when long. The same key in different objects is no repeat."""
    assert parse_client_json('[{"a": 1}, {"a": {"a": 2}}]') == [{"a": 1}, {"a": {"a": 2}}]
    for text, said in (
        ('{"decision": "deny", "decision": "allow"}', 'key "decision" at line 1 column 33'),
        ('[{"x": {"trust": false, "y": 1, "trust": true}}]', 'key "trust" at line 1 column 41'),
        ('{"a": 1, "\\u0061": 2}', 'key "a" at line 1 column 19'),  # the same key, escaped
    ):
        with pytest.raises(ValueError) as refused:
            parse_client_json(text)
        assert str(refused.value) == f"Detected duplicate {said}", text
    long = "k" * 100_000  # quoted in part: a refusal stays small
    with pytest.raises(ValueError) as refused:
        parse_client_json(f'{{"{long}": 1, "{long}": 2}}')
    message = str(refused.value)
    assert len(message) == 160 and message.startswith('Detected duplicate key "kkk')
    assert message.endswith('kkk" at line 1 column 200012')
