"""What the status bar says about the shown session: workspace, model, cost, tokens, context.

The app refreshes it from many places (a turn's end, a model call, a command, a re-attach), each
with the session and the last model call it knows; what those become on the bar is worked out
here, once. A plain function: it holds nothing between refreshes.
"""

from __future__ import annotations

from typing import Any

from metis.wire.counts import counted, tokens_in


def status_fields(
    session: dict[str, Any],
    last_call: dict[str, Any] | None,
    models: dict[str, dict[str, Any]],
    left_out: int = 0,
) -> dict[str, str]:
    """The bar's fields; the context is the last call's share of its model's window, and how
    many of the conversation's earliest messages that call left out to fit it."""
    how = "pinned" if session.get("sticky_model") else "routing"
    fields = {
        "workspace": session.get("workspace_path", ""),
        "model": f"{session.get('active_model') or '—'} ({how})",
        "cost": f"${session.get('cost_so_far_usd', '0')}",
        "tokens": "",
        "context": "",
    }
    if last_call:
        used = tokens_in(last_call)
        fields["tokens"] = f"{used:,} in / {last_call.get('output_tokens', 0):,} out"
        window = (
            (models.get(last_call.get("model", "")) or {})
            .get("capabilities", {})
            .get("max_context_tokens")
        )
        if window:
            total = used + last_call.get("output_tokens", 0)
            fields["context"] = f"{100 * total / window:.1f}%"
    if left_out:
        shown = fields["context"] or "full"
        fields["context"] = f"{shown}, {counted(left_out, 'message')} left out"
    return fields
