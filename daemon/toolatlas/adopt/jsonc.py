"""Edit a JSON-with-comments file in place: remove and add members of given objects (the
client's server tables) and keep every other byte (comments, commented-out entries, blank
lines, key order, trailing commas) as the user wrote it.

`edit_tables(text, edits, indent)` removes the named members of each table (a member's
key, value and comma; comments inside its value go with it, those beside it stay) and adds
at most one new member after the last one kept, indented like it. The text must already
parse (clients.strip_jsonc then json.loads); a table not in the text is simply not found.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Path = tuple[str, ...]
# Per table: the keys to remove, and the (key, value) to add, if any.
Edit = tuple[frozenset[str], "tuple[str, Any] | None"]


@dataclass(frozen=True)
class _Member:
    key: str
    start: int  # the key's opening quote
    end: int  # just past the value
    comma: int | None  # the comma after it, if any


class _Scan:
    def __init__(self, text: str, wanted: set[Path]) -> None:
        self.t, self.i, self.wanted = text, 0, wanted
        self.tables: dict[Path, tuple[int, int, list[_Member]]] = {}  # path -> (its '{', its '}', its members)

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
        c = self.t[self.i]
        if c == "{":
            self._members(path)
        elif c == "[":
            self._items()
        elif c == '"':
            self.string()
        else:
            while self.i < len(self.t) and self.t[self.i] not in ",]}/" and not self.t[self.i].isspace():
                self.i += 1

    def _members(self, path: Path | None) -> None:
        brace, members = self.i, list[_Member]()
        self.i += 1
        while True:
            self.ws()
            if self.t[self.i] == "}":
                if path is not None and path in self.wanted:
                    self.tables[path] = (brace, self.i, members)
                self.i += 1
                return
            start = self.i
            key = self.string()
            self.ws()
            self.i += 1  # ':'
            self.value(None if path is None else (*path, key))
            end = self.i
            self.ws()
            comma = self.i if self.t[self.i] == "," else None
            self.i += comma is not None
            members.append(_Member(key, start, end, comma))

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


def _line_end(text: str, pos: int) -> int:
    """The end of `pos`'s line when only blanks and comments follow it there, else `pos`."""
    j = pos
    while j < len(text) and (text[j] in " \t\r" or text.startswith("/*", j)):
        if text[j] == "/":
            close = text.find("*/", j + 2)
            if close < 0 or "\n" in text[j:close]:
                return pos
            j = close + 1
        j += 1
    if text.startswith("//", j):
        found = text.find("\n", j)
        return len(text) if found < 0 else found
    return j if j == len(text) or text[j] == "\n" else pos


def _lead(text: str, pos: int) -> str:
    line = text[text.rfind("\n", 0, pos) + 1 : pos]
    return line[: len(line) - len(line.lstrip())]


def _removal(text: str, m: _Member) -> tuple[int, int, str]:
    """The span of member `m` with its comma; its whole line when nothing else is on it (a //
    comment after it on the line stays)."""
    end = m.comma + 1 if m.comma is not None else m.end
    line_start = text.rfind("\n", 0, m.start) + 1
    after = _line_end(text, end)
    if text[end:after].strip():  # a // comment: it stays where it was on the line
        return m.start, end + len(text[end:after]) - len(text[end:after].lstrip()), ""
    alone = not text[line_start : m.start].strip() and after < len(text) and text[after] == "\n"
    return (line_start, after + 1, "") if alone else (m.start, end, "")


def _edits(text: str, braces: tuple[int, int], members: list[_Member], edit: Edit,
           indent: int | str) -> list[tuple[int, int, str]]:
    remove, add = edit
    cuts = [_removal(text, m) for m in members if m.key in remove]
    kept = [m for m in members if m.key not in remove]
    trailing = bool(members) and members[-1].comma is not None  # the file's style: a comma after the last
    last = kept[-1] if kept else None
    if add is None:
        if last is not None and last.comma is not None and not trailing:
            cuts.append((last.comma, last.comma + 1, ""))
        return cuts
    brace, close = braces
    if last is not None:
        lead = _lead(text, last.start)
    else:
        lead = _lead(text, brace) + ("\t" if indent == "\t" else " " * int(indent))
    dumped = json.dumps(add[1], indent=indent, ensure_ascii=False).replace("\n", "\n" + lead)
    member = f"\n{lead}{json.dumps(add[0], ensure_ascii=False)}: {dumped}" + ("," if trailing and last else "")
    if last is None and not text[brace + 1 : close].strip():  # {} (or blanks): the member, then '}' on its line
        return [(brace + 1, close, member + "\n" + _lead(text, brace))]
    if last is None:
        return [*cuts, (brace + 1, brace + 1, member)]
    if last.comma is not None:
        at = _line_end(text, last.comma + 1)
        return [*cuts, (at, at, member)]
    at = _line_end(text, last.end)
    return [*cuts, (last.end, at, "," + text[last.end : at] + member)]


def edit_tables(text: str, edits: Mapping[Path, Edit], indent: int | str) -> str | None:
    """`text` with each table's members removed and added as `edits` says (see the module
    docstring); None when a table is not in the text (the caller writes the whole file)."""
    scan = _Scan(text, set(edits))
    scan.value(())
    if set(scan.tables) != set(edits):
        return None
    cuts = [cut for path, (brace, close, members) in scan.tables.items()
            for cut in _edits(text, (brace, close), members, edits[path], indent)]
    for start, end, new in sorted(cuts, key=lambda c: c[0], reverse=True):
        text = text[:start] + new + text[end:]
    return text


__all__ = ["edit_tables"]
