"""The one redaction source: which config values are secrets, and how they are taken out of
text, nested values, exception messages and formatted log lines (tracebacks included)."""

from __future__ import annotations

import io
import logging

import pytest

from toolatlas.config import parse, secrets
from toolatlas.events import Events
from toolatlas.redact import RedactingFormatter, Redactor

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

CONFIG = """
[[upstream]]
name = "files"
transport = "stdio"
command = "${TOOL_HOME}/bin/files"
args = ["--key=${ARG_SECRET}", "--verbose"]
env = { TOKEN = "${ENV_SECRET}", MODE = "fast" }
[[upstream]]
name = "web"
transport = "http"
url = "https://op:${URL_SECRET}@example.test/mcp?api_key=${QUERY_SECRET}&format=json"
headers = { Authorization = "Bearer ${HEADER_SECRET}" }
"""
ENV = {"TOOL_HOME": "/opt/tools", "ARG_SECRET": "arg-1234", "ENV_SECRET": "env-5678",
       "URL_SECRET": "p%40ss-9012", "QUERY_SECRET": "query-3456789", "HEADER_SECRET": "hdr-secret-7890"}


def test_config_secrets_are_expansions_env_headers_and_url_parts() -> None:
    found = set(secrets(parse(CONFIG, env=ENV)))
    assert {"arg-1234", "env-5678", "fast", "p%40ss-9012", "p@ss-9012", "query-3456789",
            "Bearer hdr-secret-7890", "hdr-secret-7890"} <= found
    assert "/opt/tools" not in found  # a path in `command` is not a secret
    assert "json" not in found  # nor a short query value
    assert parse("", env={}).expanded_secrets == ()


def test_expanded_secrets_cannot_be_set_from_the_file() -> None:
    import pytest

    from toolatlas.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown key 'expanded_secrets'"):
        parse('expanded_secrets = ["x"]\n', env={})


def test_one_alternation_longest_first_and_growing_on_reload() -> None:
    r = Redactor(["abcd", "abcdefgh", ""])
    assert r("x abcdefgh y abcd z") == "x [REDACTED] y [REDACTED] z"
    assert r("nothing here") == "nothing here"
    r.add(["Bearer tok_0123456789"])
    assert r("sent tok_0123456789") == "sent [REDACTED]"
    assert r("abcd") == "[REDACTED]" and len(r) == 4  # the old ones stay
    assert r.tree({"k abcd": ["abcd", 1, None, ("abcdefgh",)]}) == {"k [REDACTED]": ["[REDACTED]", 1, None, ["[REDACTED]"]]}
    exc = r.exception(RuntimeError("failed with abcd"))
    assert str(exc) == "failed with [REDACTED]"


def test_log_lines_and_tracebacks_are_redacted() -> None:
    r = Redactor()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(RedactingFormatter(r, "%(levelname)s %(message)s"))
    log = logging.getLogger("toolatlas.test_redact")
    log.addHandler(handler)
    log.propagate = False
    try:
        r.add(["s3cret-value"])  # added after the handler was made: a reload
        log.warning("upstream x: stderr %s", "TOKEN=s3cret-value")
        try:
            raise ValueError("bad token s3cret-value")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    assert "s3cret-value" not in text
    assert "TOKEN=[REDACTED]" in text and "ValueError: bad token [REDACTED]" in text


def test_events_share_the_redactor() -> None:
    r = Redactor()
    buf = io.StringIO()
    ev = Events(buf, redactor=r)
    r.add(["shared-secret"])
    ev.emit("config_reload_rejected", reason="shared-secret leaked")
    assert "shared-secret" not in buf.getvalue() and "[REDACTED] leaked" in buf.getvalue()
