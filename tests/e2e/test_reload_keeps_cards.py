"""A SIGHUP reload keeps card state: unchanged upstreams stay attested and keep being
re-checked (a card tampered after the reload is refused), catalog_status agrees with itself,
and new sessions get instructions naming the reloaded upstreams."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.support.daemon import Daemon, stdio_testserver

from toolatlas.catalog.cards import card_path
from toolatlas.catalog.cards_cli import keygen_main, main as cards_main


def _consistent(st: dict) -> bool:  # type: ignore[type-arg]
    per_server = sum(len(s.get("quarantined", {})) for s in st["servers"])
    return bool(st["cards"]["quarantined_tools"] == per_server)


def _carded(tmp_path: Path, recheck_interval: float) -> Daemon:
    """A daemon (not started) serving upstream one, whose card is signed by the trusted key."""
    key = tmp_path / "op.key"
    assert keygen_main(["--out", str(key)]) == 0
    cards = f'\n[cards]\npublic_key = "{key}.pub"\nrecheck_interval = {recheck_interval}\n'
    d = Daemon(tmp_path, stdio_testserver("one"), daemon_extra=cards)
    assert cards_main(["generate", "--config", str(d.config), "--key", str(key), "--quiet"]) == 0
    return d


def _tamper(tmp_path: Path, server: str) -> None:
    """Change one character of `server`'s card summary (its signature no longer matches)."""
    path = card_path(tmp_path / "state", server)
    data = bytearray(path.read_bytes())
    i = data.index(b'"summary"') + 12
    data[i] = ord("Z") if data[i] != ord("Z") else ord("Y")
    path.write_bytes(bytes(data))


def test_reload_keeps_card_state_and_rechecks(tmp_path: Path) -> None:
    d = _carded(tmp_path, 0.5)
    with d:
        d.wait_for(lambda: d.status()["cards"]["servers"].get("one", {}).get("card") == "verified", what="one attested")
        d.config.write_text(d.config.read_text() + "\n" + stdio_testserver("two"))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        st = d.wait_for(lambda: (s := d.status()) and {x["name"] for x in s["servers"] if x["searchable"]} == {"one", "two"} and s,
                        60, "two serving after the reload")
        # one is unchanged: its verdict survives the reload; two has no card
        assert st["cards"]["servers"]["one"]["card"] == "verified", st["cards"]
        d.wait_for(lambda: d.status()["cards"]["servers"].get("two", {}).get("card") == "missing", 30, "two attested")
        assert _consistent(d.status())
        with d.client() as c:
            instructions = c.initialize_result["instructions"]
        assert "one" in instructions and "two" in instructions, instructions

        # the card of the unchanged upstream is tampered after the reload: re-checks refuse it
        _tamper(tmp_path, "one")
        st = d.wait_for(lambda: (s := d.status()) and s["cards"]["servers"]["one"]["card"].startswith("refused") and s,
                        30, "tampered card refused after the reload")
        assert st["cards"]["refused_cards"] == ["one"] and _consistent(st)


def test_a_reload_that_changes_the_card_settings_reattests_every_upstream(tmp_path: Path) -> None:
    """A reload changing [cards] (the trusted key rotated, required turned on, the key
    removed) re-attests every upstream at once, with re-checks off and no card file changed:
    a card signed by a key no longer trusted is refused, a card-less upstream's tools leave
    search when cards become required, and with no key nothing is reported as verified."""
    key, other = tmp_path / "op.key", tmp_path / "other.key"
    assert keygen_main(["--out", str(key)]) == 0 and keygen_main(["--out", str(other)]) == 0
    cards = f'\n[cards]\npublic_key = "{key}.pub"\nrecheck_interval = 0\n'
    d = Daemon(tmp_path, stdio_testserver("one") + "\n" + stdio_testserver("two"), daemon_extra=cards)
    assert cards_main(["generate", "--config", str(d.config), "--key", str(key), "--quiet", "--server", "one"]) == 0
    base = d.config.read_text()
    with d:
        d.wait_for(lambda: {n: v["card"] for n, v in d.status()["cards"]["servers"].items()}
                   == {"one": "verified", "two": "missing"}, 30, "one verified, two without a card")

        rotated = f'\n[cards]\npublic_key = "{other}.pub"\nrecheck_interval = 0\nrequired = true\n'
        d.config.write_text(base.replace(cards, rotated))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        st = d.wait_for(lambda: (s := d.status()) and s["cards"]["servers"]["one"]["card"].startswith("refused")
                        and s["cards"]["servers"]["two"]["served"] == 0 and s, 30, "both re-attested under the new key")
        assert st["cards"]["servers"]["one"]["served"] == 0 and _consistent(st), st["cards"]
        assert st["cards"]["refused_cards"] == ["one"], st["cards"]
        assert d.search("echo a message back") == []

        d.config.write_text(base.replace(cards, "\n"))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        st = d.wait_for(lambda: (s := d.status()) and {n: v["card"] for n, v in s["cards"]["servers"].items()}
                        == {"one": "unattested", "two": "unattested"} and s, 30, "no key: both unattested")
        assert st["cards"]["quarantined_tools"] == 0 and _consistent(st), st["cards"]
        match = d.meta("tool_search", {"query": "echo a message back", "top_k": 1})["matches"][0]
        assert match["name"].endswith("__echo") and not match.get("attested"), match


def test_a_recheck_interval_lowered_by_a_reload_applies_at_once(tmp_path: Path) -> None:
    """recheck_interval 3600 at the start, 0.5 after a reload: a card tampered then is refused
    within the new interval, not once the hour the old value started has run out."""
    d = _carded(tmp_path, 3600)
    with d:
        d.wait_for(lambda: d.status()["cards"]["servers"].get("one", {}).get("card") == "verified", what="one attested")
        d.config.write_text(d.config.read_text().replace("recheck_interval = 3600", "recheck_interval = 0.5"))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: "reload: +[] -[] ~[]" in d.log.read_text(), 30, "the reload applied")
        _tamper(tmp_path, "one")
        d.wait_for(lambda: d.status()["cards"]["servers"]["one"]["card"].startswith("refused"), 30,
                   "the tampered card refused at the reloaded interval")
