"""Example MCP server: an in-memory notebook (default transport: stdio).

    python -m toolatlas.examples.notes [--transport stdio|sse|http] [--port N]

Notes live only as long as the process; ids are small integers in creation order.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from toolatlas.examples import _serve


def build() -> MCPServer:
    server = MCPServer("notes", instructions="Keep short text notes in memory: add, list, search, read, delete.")
    notes: dict[int, dict[str, Any]] = {}
    ids = itertools.count(1)

    def find(note_id: int) -> dict[str, Any]:
        try:
            return notes[note_id]
        except KeyError:
            raise ToolError(f"no note with id {note_id}; list_notes shows the ids that exist") from None

    @server.tool(description="Create a note with a title, a body and optional tags. Returns the new note with its id.")
    def add_note(
        title: Annotated[str, Field(description="Short title, shown in listings", min_length=1, max_length=200)],
        body: Annotated[str, Field(description="The note's text")],
        tags: Annotated[list[str], Field(description="Labels to filter by later, e.g. ['work', 'todo']")] = [],  # noqa: B006
    ) -> dict[str, Any]:
        note_id = next(ids)
        note = {"id": note_id, "title": title, "body": body, "tags": sorted(set(tags)),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        notes[note_id] = note
        return note

    @server.tool(description="List notes (id, title, tags), newest first; optionally only those carrying a tag.")
    def list_notes(
        tag: Annotated[str | None, Field(description="Only notes with this tag")] = None,
    ) -> list[dict[str, Any]]:
        picked = [n for n in notes.values() if tag is None or tag in n["tags"]]
        return [{"id": n["id"], "title": n["title"], "tags": n["tags"]} for n in reversed(picked)]

    @server.tool(description="Full-text search over note titles and bodies (case-insensitive substring match on every word).")
    def search_notes(
        query: Annotated[str, Field(description="Words that must all appear in the title or body", min_length=1)],
    ) -> list[dict[str, Any]]:
        words = query.lower().split()
        hits = [n for n in notes.values() if all(w in f"{n['title']} {n['body']}".lower() for w in words)]
        return [{"id": n["id"], "title": n["title"], "snippet": n["body"][:120]} for n in hits]

    @server.tool(description="Read one note in full by its id.")
    def get_note(note_id: Annotated[int, Field(description="The id returned by add_note or list_notes")]) -> dict[str, Any]:
        return find(note_id)

    @server.tool(description="Delete a note by its id. Returns the deleted note's title.")
    def delete_note(note_id: Annotated[int, Field(description="The id of the note to delete")]) -> str:
        note = find(note_id)
        del notes[note_id]
        return f"deleted note {note_id} ({note['title']})"

    return server


def main(argv: Sequence[str] | None = None) -> None:
    args = _serve.parser("Example MCP server: in-memory notes.", "stdio").parse_args(argv)
    _serve.run(build(), args)


if __name__ == "__main__":
    main()
