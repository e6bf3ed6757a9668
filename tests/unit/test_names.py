from __future__ import annotations

from toolatlas.names import VALID_RE, namespaced, split


def test_plain_names_are_prefixed() -> None:
    assert namespaced("files", "read_file") == "files__read_file"
    assert split("files__read_file") == ("files", "read_file")
    assert split("nounderscore") is None


def test_invalid_characters_and_long_names_are_shortened_deterministically() -> None:
    odd = namespaced("web", "fetch.url/v2")
    assert VALID_RE.match(odd)
    assert odd.startswith("web__fetch_url_v2_")
    long = namespaced("a-very-long-server-name", "x" * 100)
    assert VALID_RE.match(long) and len(long) == 64
    # Stable across calls (and so across restarts): depends only on (server, tool).
    assert namespaced("a-very-long-server-name", "x" * 100) == long


def test_names_that_sanitise_alike_do_not_collide() -> None:
    a, b = namespaced("s", "get.item"), namespaced("s", "get/item")
    assert a != b and VALID_RE.match(a) and VALID_RE.match(b)
    assert namespaced("s", "get_item") not in (a, b)
