"""Edit a JSON-with-comments file in place: replace the values at given key paths and keep
every other byte (comments, blank lines, key order, trailing commas) as the user wrote it.

`value_spans(text, paths)` finds where each path's value starts and ends; `replace_values`
writes new JSON there, indented like the line the value starts on. Comments inside a
replaced value go with it (they described what is replaced). The text must already parse
(clients.strip_jsonc then json.loads); a path not in the text is simply not found.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

Path = tuple[str, ...]


class _Scan:
    def __init__(self, text: str, wanted: set[Path]) -> None:
        self.t, self.i, self.wanted = text, 0, wanted
        self.spans: dict[Path, tuple[int, int]] = {}

    def ws(self) -> None:
        t, n = self.t, len(self.t)
        while self.i < n:
            if t[self.i].isspace():
                self.i += 1
            elif t.startswith("//", self.i):
                j = t.find("\n", self.i)
                self.i = n if j < 0 else j
            elif t.startswith("/*", self.i):
                j = t.find("*/", self.i + 2)
                self.i = n if j < 0 else j + 2
            else:
                return

    def string(self) -> str:
        t, start = self.t, self.i
        j = start + 1
        while t[j] != '"':
            j += 2 if t[j] == "\\" else 1
        self.i = j + 1
        value: str = json.loads(t[start : self.i])
        return value

    def value(self, path: Path | None) -> None:
        self.ws()
        start, c = self.i, self.t[self.i]
        if c == "{":
            self._members(path)
        elif c == "[":
            self._items()
        elif c == '"':
            self.string()
        else:
            while self.i < len(self.t) and self.t[self.i] not in ",]}/" and not self.t[self.i].isspace():
                self.i += 1
        if path is not None and path in self.wanted:
            self.spans[path] = (start, self.i)

    def _members(self, path: Path | None) -> None:
        self.i += 1
        while True:
            self.ws()
            if self.t[self.i] == "}":
                self.i += 1
                return
            key = self.string()
            self.ws()
            self.i += 1  # ':'
            self.value(None if path is None else (*path, key))
            self.ws()
            if self.t[self.i] == ",":
                self.i += 1

    def _items(self) -> None:
        self.i += 1
        while True:
            self.ws()
            if self.t[self.i] == "]":
                self.i += 1
                return
            self.value(None)  # nothing inside an array is edited
            self.ws()
            if self.t[self.i] == ",":
                self.i += 1


def value_spans(text: str, paths: Iterable[Path]) -> dict[Path, tuple[int, int]]:
    """(start, end) offsets in `text` of the value at each of `paths` that the text has."""
    scan = _Scan(text, set(paths))
    scan.value(())
    return scan.spans


def replace_values(text: str, values: Mapping[Path, Any], indent: int | str) -> str | None:
    """`text` with the value at each path replaced by `values[path]` as JSON; None when a
    path is not in the text (the caller writes the whole file instead)."""
    spans = value_spans(text, values)
    if set(spans) != set(values):
        return None
    for path, (start, end) in sorted(spans.items(), key=lambda kv: kv[1][0], reverse=True):
        line_start = text.rfind("\n", 0, start) + 1
        line = text[line_start:start]
        lead = line[: len(line) - len(line.lstrip())]
        dumped = json.dumps(values[path], indent=indent, ensure_ascii=False).replace("\n", "\n" + lead)
        text = text[:start] + dumped + text[end:]
    return text


__all__ = ["replace_values", "value_spans"]
