"""`toolatlas keygen` and `toolatlas cards generate|verify|show`, offline and against a live
stdio test server."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.support.configs import write_carded_testserver_config
from toolatlas.catalog import signing
from toolatlas.catalog.cards import card_path, read_card
from toolatlas.catalog.cards_cli import keygen_main, main


def write_catalog(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"server": "Weather API", "name": "forecast", "description": "Daily forecast.", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}},
    {"server": "Weather API", "name": "current", "description": "Current conditions.", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"server": "notes", "name": "add_note", "description": "Add a note.", "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}},
]


@pytest.mark.parametrize("given", ["", "keys/"])
def test_keygen_out_that_names_no_file_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], given: str) -> None:
    """--out "" was a ValueError traceback; --out keys/ wrote the private key to the file `keys`."""
    monkeypatch.chdir(tmp_path)
    assert keygen_main(["--out", given]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"toolatlas: --out {given!r}: name the private key file to create, not a folder (e.g. --out ~/operator.key)"]
    assert list(tmp_path.iterdir()) == []


def test_keygen_prints_public_key_and_refuses_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "op.key"
    assert keygen_main(["--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("ed25519:")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert signing.public_key_text(signing.load_private_key(out)) == printed
    assert keygen_main(["--out", str(out)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err


def test_generate_verify_show_from_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "op.key"
    assert keygen_main(["--out", str(key)]) == 0
    cat = write_catalog(tmp_path / "catalog.jsonl", ROWS)
    state = tmp_path / "state"
    assert main(["generate", "--catalog", str(cat), "--key", str(key), "--state-dir", str(state)]) == 0
    assert "wrote" in capsys.readouterr().out
    card = read_card(card_path(state, "Weather API"))
    assert [t.tool for t in card.tools] == ["forecast", "current"]

    pub = str(key) + ".pub"
    assert main(["verify", "--state-dir", str(state), "--public-key", pub, "--catalog", str(cat)]) == 0
    out = capsys.readouterr().out
    assert "ok   Weather API: 2 tools, bootstrap" in out and "ok   notes" in out

    # the catalog changes a tool definition: verify fails and names it
    rows = [dict(r) for r in ROWS]
    rows[1]["description"] = "Current conditions and alerts."
    cat2 = write_catalog(tmp_path / "catalog2.jsonl", rows)
    assert main(["verify", "--state-dir", str(state), "--public-key", pub, "--catalog", str(cat2)]) == 1
    assert "FAIL Weather API: tool 'current' changed since the card was signed" in capsys.readouterr().out

    # one changed byte in one card file: verify fails naming that file, the other card is ok
    path = card_path(state, "notes")
    data = bytearray(path.read_bytes())
    data[data.index(b"Add a note")] = ord("a")
    path.write_bytes(bytes(data))
    assert main(["verify", "--state-dir", str(state), "--public-key", pub, "--offline"]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {path.name}: signature does not match" in out and "ok   Weather API" in out

    assert main(["show", "Weather API", "--state-dir", str(state)]) == 0
    shown = capsys.readouterr().out
    assert "Forecast. Daily forecast. Inputs: city; days." in shown
    assert main(["show", "Weather API", "--state-dir", str(state), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["server"]["name"] == "Weather API"


def test_publisher_cards_marked_unattested(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "op.key"
    keygen_main(["--out", str(key)])
    cat = write_catalog(tmp_path / "c.jsonl", ROWS)
    state = tmp_path / "s"
    assert main(["generate", "--catalog", str(cat), "--key", str(key), "--state-dir", str(state), "--generator", "publisher", "--server", "notes"]) == 0
    assert "unattested" in capsys.readouterr().out
    card = read_card(card_path(state, "notes"))
    assert card.provenance.attested is False and card.tools[0].summary == "Add a note."


@pytest.mark.slow
def test_generate_and_verify_against_live_stdio_upstream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "op.key"
    keygen_main(["--out", str(key)])
    capsys.readouterr()
    cfg = write_carded_testserver_config(tmp_path)
    assert main(["generate", "--config", str(cfg)]) == 0
    card = read_card(card_path(tmp_path / "state", "test"))
    names = {t.tool for t in card.tools}
    assert {"echo", "gen_000", "gen_002"} <= names
    assert card.server.transport == "stdio" and "testserver.py" in card.server.endpoint
    assert main(["verify", "--config", str(cfg)]) == 0
    assert "ok   test:" in capsys.readouterr().out
    # an upstream that cannot be listed is "could not check" (3, as the module says), not "failed" (1)
    (tmp_path / "start-delay").write_text("30")  # the server now starts slower than the timeout
    assert main(["verify", "--config", str(cfg), "--timeout", "0.3"]) == 3
    assert "test: cannot list tools to check schema hashes" in capsys.readouterr().out
    (tmp_path / "start-delay").unlink()

    # the upstream now offers more tools than the card covers: verify names the new ones
    cfg.write_text(cfg.read_text().replace('"--tools", "3"', '"--tools", "4"'))
    assert main(["verify", "--config", str(cfg)]) == 1
    out = capsys.readouterr().out
    assert "card signed for stdio" in out and "tool 'gen_003' is offered but not in the card" in out


def test_export_replaces_descriptions_with_card_text(tmp_path: Path) -> None:
    cat = write_catalog(tmp_path / "c.jsonl", ROWS)
    out = tmp_path / "cards.jsonl"
    assert main(["export", "--catalog", str(cat), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["server"], r["name"]) for r in rows] == [(r["server"], r["name"]) for r in ROWS]
    assert rows[0]["description"] == "Forecast. Daily forecast. Inputs: city; days."
    assert rows[0]["input_schema"] == ROWS[0]["input_schema"]
    assert main(["export", "--catalog", str(cat), "--out", str(out), "--generator", "publisher"]) == 0
    assert [json.loads(line)["description"] for line in out.read_text().splitlines()] == [r["description"] for r in ROWS]


@pytest.mark.hostile
def test_card_file_never_carries_an_expanded_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `${VAR}` in an upstream's args is a secret: the card's endpoint (its command line)
    shows it redacted, and the card still verifies against the config."""
    secret = "arg-secret-3f9a1c77"
    monkeypatch.setenv("CARD_ARG_SECRET", secret)
    keygen_main(["--out", str(tmp_path / "op.key")])
    cfg = write_carded_testserver_config(tmp_path)
    cfg.write_text(cfg.read_text().replace('"--tools", "3"', '"--tools", "3", "--name", "${CARD_ARG_SECRET}"'))
    assert main(["generate", "--config", str(cfg)]) == 0
    text = card_path(tmp_path / "state", "test").read_text()
    assert secret not in text and "--name [REDACTED]" in text
    assert main(["verify", "--config", str(cfg)]) == 0
    out = capsys.readouterr()
    assert "ok   test:" in out.out and secret not in out.out + out.err


@pytest.mark.parametrize("seconds", ["nan", "inf", "0", "-1"])
def test_listing_timeout_must_be_finite_and_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str], seconds: str) -> None:
    """--timeout inf waited forever on an upstream that never answers, nan failed with
    anyio's 'deadline must not be NaN', 0 and -1 'did not answer within -1 s': each is a usage
    error (exit 2) naming the option, for cards generate, cards verify and rift alike."""
    from toolatlas.rift.cli import main as rift_main

    cfg = write_carded_testserver_config(tmp_path)
    for run in (lambda: main(["generate", "--config", str(cfg), "--timeout", seconds]),
                lambda: main(["verify", "--config", str(cfg), "--timeout", seconds]),
                lambda: rift_main(["--config", str(cfg), "--timeout", seconds])):
        with pytest.raises(SystemExit) as exc:
            run()
        assert exc.value.code == 2
        assert f"--timeout: must be a finite number of seconds > 0, got {seconds!r}" in capsys.readouterr().err
    assert not (tmp_path / "state" / "cards").exists()


def test_generate_for_a_disabled_upstream_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cards generate --config C --server off` for an upstream with enabled = false wrote
    nothing and exited 0 without a word; so did a config whose upstreams are all disabled."""
    cfg = write_carded_testserver_config(tmp_path)
    assert keygen_main(["--out", str(tmp_path / "op.key")]) == 0
    cfg.write_text(cfg.read_text() + "enabled = false\n")
    capsys.readouterr()
    assert main(["generate", "--config", str(cfg), "--server", "test"]) == 2
    assert f"upstream 'test' is disabled (enabled = false) in {cfg}; no card written" in capsys.readouterr().err
    assert main(["generate", "--config", str(cfg)]) == 2
    assert f"no enabled upstream in {cfg}; no card written" in capsys.readouterr().err


def test_verify_prints_one_escaped_line_per_card(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A catalog's server names are anyone's text (and a FAIL line can quote an upstream's
    error): verify printed them raw, so an escape sequence reached the operator's terminal.
    Each report line is now one line with such characters escaped."""
    key = tmp_path / "op.key"
    assert keygen_main(["--out", str(key)]) == 0
    rows = [{"server": "ev\x1b[2Kil", "name": "a", "description": "A."},
            {"server": "x", "name": "b\nok   bank: 3 tools", "description": "B."}]
    cat = write_catalog(tmp_path / "c.jsonl", rows)
    state = tmp_path / "state"
    assert main(["generate", "--catalog", str(cat), "--key", str(key), "--state-dir", str(state), "-q"]) == 0
    rows[1]["name"] = "b\nok   bank: 3 tools\x1b[1A"  # not in the card: verify fails naming it
    capsys.readouterr()
    assert main(["verify", "--state-dir", str(state), "--public-key", f"{key}.pub", "--catalog", str(write_catalog(cat, rows))]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "ev\\x1b[2Kil" in out
    assert [line[:5] for line in out.splitlines()] == ["ok   ", "FAIL "], out


def test_show_json_escapes_what_is_not_ascii(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cards show --json` printed a card's text raw: a right-to-left override (U+202E) or an
    invisible tag character in a publisher description acted on the operator's terminal. The
    JSON is the same value, written in ASCII."""
    key = tmp_path / "op.key"
    assert keygen_main(["--out", str(key)]) == 0
    text = "Read a file.\u202e gnirts esrever"
    cat = write_catalog(tmp_path / "c.jsonl", [{"server": "files", "name": "read", "description": text}])
    state = tmp_path / "state"
    assert main(["generate", "--catalog", str(cat), "--key", str(key), "--state-dir", str(state),
                 "--generator", "publisher", "-q"]) == 0
    capsys.readouterr()
    assert main(["show", "files", "--state-dir", str(state), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.isascii() and "\\u202e" in out
    assert json.loads(out)["tools"][0]["summary"].startswith("Read a file.")


def test_export_whose_generator_fails_exits_3_like_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The module's exit codes: 3 when a generator failed. `cards generate` kept to it; export
    exited 2 (a usage error) for an llm endpoint that refuses connections."""
    from tests.support.ports import free_port

    cfg = tmp_path / "t.toml"
    cfg.write_text(f'[daemon]\nmetrics_addr = ""\n[cards.llm]\nurl = "http://127.0.0.1:{free_port()}/v1"\nmodel = "m"\n'
                   "timeout = 2\nmax_retries = 0\n")
    cat = write_catalog(tmp_path / "c.jsonl", ROWS)
    out = tmp_path / "out.jsonl"
    assert main(["export", "--catalog", str(cat), "--generator", "llm", "--config", str(cfg), "--out", str(out)]) == 3
    assert "llm generator failed" in capsys.readouterr().err and not out.exists()
