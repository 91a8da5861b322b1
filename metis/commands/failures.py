"""How the chat clients (the terminal app and `--plain`) read a failed call to the daemon.

The commands, sending and cancelling a turn, answering a confirmation and the stream each meet
the same failures: one wording for them in either client, and one list of the codes that mean
the session or turn is gone (nothing to retry). Plain functions and constants: there is no
state to hold.
"""

from __future__ import annotations

import aiohttp

from metis.commands.client import SESSION_GONE_CODES, ApiFailure

TURN_GONE_CODES = (*SESSION_GONE_CODES, "turn_not_found", "turn_already_completed")


def failure_text(exc: ApiFailure) -> str:
    """The daemon's error in its words (`ApiFailure.said`); a routing failure also says why
    each model it tried was refused, for those its message does not name (it names them all,
    but for a refused explicit choice)."""
    text = exc.said
    tried = exc.details.get("tried") if isinstance(exc.details, dict) else None
    if tried:
        untold = [
            f"{t.get('model')}: {t.get('message') or str(t.get('reason')).replace('_', ' ')}"
            for t in tried[:4]
            if str(t.get("model")) not in text
        ]
        if untold:
            text += f" ({'; '.join(untold)})"
    return text


def error_text(exc: ApiFailure | aiohttp.ClientError | TimeoutError) -> str:
    """A failed call in words: the daemon's refusal, or why it could not be asked (aiohttp's
    own text, `Cannot connect to host 127.0.0.1:8421 ssl:default [Connect call failed …]`,
    only when it is none of the usual)."""
    if isinstance(exc, ApiFailure):
        return failure_text(exc)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "cannot reach the daemon: is it running?"
    if isinstance(exc, aiohttp.ServerTimeoutError | TimeoutError):
        return "the daemon did not answer in time"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the daemon closed the connection before it answered"
    return f"the daemon did not answer ({exc})"
