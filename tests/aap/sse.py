"""A spec-following parser for `text/event-stream` (WHATWG HTML, "Interpreting an event stream").

Written from the standard, not from metis's writer: it accepts CRLF, LF and CR line ends, a
leading BOM, comments, fields without a colon, one optional space after the colon, multi-line
`data`, `id`/`retry`, and discards an unterminated last event. Bytes may arrive in any chunking.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str
    last_event_id: str = ""

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SseParser:
    events: list[SseEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    _buffer: str = ""
    _pending_cr: bool = False
    _started: bool = False
    _event_type: str = ""
    _data: list[str] = field(default_factory=list)
    _has_data: bool = False
    _last_id: str = ""
    retry_ms: int | None = None
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")()
    )

    def feed(self, chunk: bytes | str) -> list[SseEvent]:
        """Parse more of the stream (a multi-byte character may be split across chunks)."""
        text = self._decoder.decode(chunk) if isinstance(chunk, bytes) else chunk
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        before = len(self.events)
        for ch in text:
            if self._pending_cr:
                self._pending_cr = False
                if ch == "\n":
                    continue  # the LF of a CRLF pair
            if ch in "\r\n":
                self._pending_cr = ch == "\r"
                self._line(self._buffer)
                self._buffer = ""
            else:
                self._buffer += ch
        return self.events[before:]

    def _line(self, line: str) -> None:
        if line == "":
            self._dispatch()
            return
        if line.startswith(":"):
            self.comments.append(line[1:].removeprefix(" "))
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event_type = value
        elif name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)

    def _dispatch(self) -> None:
        if not self._has_data:
            self._event_type = ""
            return
        self.events.append(
            SseEvent(self._event_type or "message", "\n".join(self._data), self._last_id)
        )
        self._event_type, self._data, self._has_data = "", [], False


def parse_all(body: bytes | str) -> SseParser:
    parser = SseParser()
    parser.feed(body)
    return parser
