"""Close-match suggestions for an unknown tool name, without comparing it to every name.

`NameIndex` is built once per server catalog (a few hundred ms for 20,000 names; the gateway
builds it and looks names up in a worker thread): trigram -> the names holding it. A lookup counts shared trigrams over the
posting lists of the query's rarest trigrams, each list read to at most `POSTING_CAP`
entries, and ranks only the best `POOL` candidates with difflib, as the old scan over every
name did (that scan cost about a second of event-loop time per unknown name at 20,000 tools).
The work per lookup is bounded by PROBE x POSTING_CAP, whatever the catalog size.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import anyio

from toolatlas.names import SEP, split

PROBE = 12  # rarest query trigrams whose posting lists are read
POSTING_CAP = 2048  # entries read per posting list
POOL = 64  # candidates ranked by difflib
TOOL_CUTOFF = 0.6  # how alike a suggested tool's own name must be to the one asked for


def _grams(word: str) -> set[str]:
    padded = f"\0{word.lower()}\0"
    return {padded[i:i + 3] for i in range(len(padded) - 2)}


class NameIndex:
    """Trigram postings over a fixed list of names."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(names)
        postings: dict[str, list[int]] = {}
        for i, name in enumerate(self.names):
            for gram in _grams(name):
                postings.setdefault(gram, []).append(i)
        self._postings = postings

    def __len__(self) -> int:
        return len(self.names)

    def candidates(self, word: str) -> list[str]:
        """Up to POOL names sharing the most of `word`'s rarest trigrams."""
        lists = sorted((p for g in _grams(word) if (p := self._postings.get(g))), key=len)[:PROBE]
        counts: Counter[int] = Counter()
        for posting in lists:
            counts.update(posting[:POSTING_CAP])
        return [self.names[i] for i, _ in counts.most_common(POOL)]


def _asked_tool(name: str) -> str:
    """The tool part of a name as a caller wrote it: after `__`, else after its last `.`, `/`
    or `:` (`files.read`), else the whole name."""
    parsed = split(name)
    return parsed[1] if parsed else re.split(r"[./:]", name)[-1]


def _alike(a: str, b: str) -> bool:
    return difflib.SequenceMatcher(None, a, b).ratio() >= TOOL_CUTOFF


def suggest(name: str, indexes: Mapping[str, NameIndex], tool_of: Callable[[str], str], n: int = 3) -> list[str]:
    """Up to `n` names like the unknown `name`, from each server's index: close whole names
    whose tool part is close to `name`'s too (the server prefix alone makes every tool of a
    server look alike: `beta__nope` is not `beta__pid`); failing those, tools whose own name is
    close to `name`'s tool part on any server (a right tool under a wrong server).
    `tool_of(name)` is a name's upstream tool name."""
    # Compared without case: `GitHub__create_issue` means `github__create_issue`.
    pool = {c.lower(): c for index in indexes.values() for c in index.candidates(name)}
    asked = _asked_tool(name).lower()
    close = [pool[c] for c in difflib.get_close_matches(name.lower(), list(pool), n=4 * n, cutoff=0.5)
             if _alike(asked, tool_of(pool[c]).lower())][:n]
    parsed = split(name)
    if close or not parsed:
        return close
    found = [c for server, index in indexes.items() for c in index.candidates(f"{server}{SEP}{parsed[1]}")]
    tools = set(difflib.get_close_matches(asked, [tool_of(c).lower() for c in found], n=n, cutoff=TOOL_CUTOFF))
    return [c for c in dict.fromkeys(found) if tool_of(c).lower() in tools][:n]


class NameIndexes:
    """Each server's `NameIndex`, built in a worker thread when first asked for and rebuilt
    when the server's records are another mapping (relisted)."""

    def __init__(self) -> None:
        self._built: dict[str, tuple[Mapping[str, object], NameIndex]] = {}

    def __len__(self) -> int:
        return len(self._built)

    async def of(self, servers: Mapping[str, Mapping[str, object]]) -> dict[str, NameIndex]:
        """The index of each server in `servers` (server -> its records by namespaced name)."""
        out = {}
        for server, records in servers.items():
            built = self._built.get(server)
            if built is None or built[0] is not records:
                built = records, await anyio.to_thread.run_sync(NameIndex, list(records))
                self._built[server] = built
            out[server] = built[1]
        return out

    def keep(self, records: Callable[[str], Mapping[str, object]]) -> None:
        """Drop the indexes not built from `records(server)`: servers a reload removed (and the
        names they hold), or relisted ones (rebuilt when next asked for)."""
        self._built = {s: b for s, b in self._built.items() if records(s) is b[0]}


__all__ = ["NameIndex", "NameIndexes", "suggest"]
