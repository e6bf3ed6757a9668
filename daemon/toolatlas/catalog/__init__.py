"""Tool records, content hashes, the live catalog, and (later) capability cards."""
