"""The `@alias` prefix."""

from __future__ import annotations

import pytest

from metis.core.canonical.content import Base64Source, ImageBlock, TextBlock
from metis.core.errors import InvalidContent, ModelNotConfigured
from metis.core.models.registry import ModelRegistry
from metis.core.routing.alias import ESCAPE_HINT, resolve_override
from tests.core.routing.routing_kit import make_registry

IMAGE = ImageBlock(source=Base64Source(media_type="image/png", data="aGVsbG8="))


def text(value: str) -> list[TextBlock]:
    return [TextBlock(text=value)]


def test_prefix_sets_the_override_and_is_removed_from_the_text(registry: ModelRegistry) -> None:
    result = resolve_override(text("@haiku   fix the\ntests"), registry)
    assert result.override == "anthropic:haiku"
    assert result.content == text("fix the\ntests")


def test_prefix_token_runs_to_the_first_whitespace_of_any_kind(registry: ModelRegistry) -> None:
    result = resolve_override(text("@Opus\n\nplan it"), registry)
    assert (result.override, result.content) == ("anthropic:opus", text("plan it"))


def test_ids_with_colons_work_as_prefix(registry: ModelRegistry) -> None:
    result = resolve_override(text("@ollama:small:3b hi"), registry)
    assert (result.override, result.content) == ("ollama:small:3b", text("hi"))


@pytest.mark.parametrize("message", ["@ alone", "@", "mail me @haiku", " @haiku leading space"])
def test_lone_or_mid_text_at_is_plain_text(registry: ModelRegistry, message: str) -> None:
    result = resolve_override(text(message), registry)
    assert (result.override, result.content) == (None, text(message))


@pytest.mark.parametrize(("message", "stored"), [("\\@haiku x", "@haiku x"), ("\\\\@x", "\\@x")])
def test_backslash_escape_loses_exactly_one_backslash(
    registry: ModelRegistry, message: str, stored: str
) -> None:
    result = resolve_override(text(message), registry)
    assert (result.override, result.content) == (None, text(stored))


def test_unknown_prefix_is_refused_with_the_documented_details(registry: ModelRegistry) -> None:
    with pytest.raises(ModelNotConfigured) as info:
        resolve_override(text("@nosuch hello"), registry)
    assert info.value.details == {
        "source": "per_message_override",
        "reference": "nosuch",
        "reason": "unknown",
        "hint": ESCAPE_HINT,
    }
    assert ESCAPE_HINT == "start the message with \\@ to send a literal @"


def test_unconfigured_prefix_reports_the_missing_variable() -> None:
    registry = make_registry({"ANTHROPIC_API_KEY": "k"})
    with pytest.raises(ModelNotConfigured) as info:
        resolve_override(text("@gpt5 hello"), registry)
    assert info.value.details["reason"] == "no_credentials"
    assert info.value.details["env_var"] == "OPENAI_API_KEY"
    offline = make_registry({"ANTHROPIC_API_KEY": "k", "METIS_OFFLINE": "1"})
    with pytest.raises(ModelNotConfigured) as info:
        resolve_override(text("@haiku hello"), offline)
    assert info.value.details["reason"] == "offline_forced"
    assert "env_var" not in info.value.details


def test_override_without_a_message_is_invalid_content(registry: ModelRegistry) -> None:
    with pytest.raises(InvalidContent) as info:
        resolve_override(text("@haiku   "), registry)
    assert info.value.errors == [{"index": 0, "msg": "override without a message"}]


@pytest.mark.parametrize(
    ("message", "field"), [("@nosuch", None), ("@haiku", "nosuch"), ("@haiku", "opus")]
)
def test_an_empty_override_is_invalid_content_before_any_reference_is_resolved(
    registry: ModelRegistry, message: str, field: str | None
) -> None:
    """The content check precedes the override check."""
    with pytest.raises(InvalidContent):
        resolve_override(text(message), registry, field=field)


def test_override_with_only_an_image_keeps_the_image(registry: ModelRegistry) -> None:
    result = resolve_override([TextBlock(text="@haiku"), IMAGE], registry)
    assert (result.override, result.content) == ("anthropic:haiku", [IMAGE])


def test_only_the_first_block_is_examined(registry: ModelRegistry) -> None:
    content = [IMAGE, TextBlock(text="@haiku hi")]
    result = resolve_override(content, registry)
    assert (result.override, result.content) == (None, content)


def test_field_wins_and_a_resolving_prefix_is_still_removed(registry: ModelRegistry) -> None:
    result = resolve_override(text("@haiku hello"), registry, field="opus")
    assert (result.override, result.content) == ("anthropic:opus", text("hello"))


def test_field_wins_and_a_non_resolving_prefix_stays_as_text(registry: ModelRegistry) -> None:
    result = resolve_override(text("@someone hello"), registry, field="gpt5")
    assert (result.override, result.content) == ("openai:gpt-5", text("@someone hello"))


def test_unknown_field_is_refused_even_without_a_prefix(registry: ModelRegistry) -> None:
    with pytest.raises(ModelNotConfigured) as info:
        resolve_override(text("hello"), registry, field="nosuch")
    assert info.value.details["reference"] == "nosuch"
    assert info.value.details["source"] == "per_message_override"
