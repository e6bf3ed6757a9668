"""Templates of what the model reads (toolatlas.guidance): defaults, overrides, placeholders,
the domain list's budget, and the errors that name the file (issue 18 item 1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from toolatlas.errors import ConfigError
from toolatlas.guidance import DEFAULTS_DIR, FILES, Domain, Guidance, TemplateSet, domains_text, render
from toolatlas.meta_tools import META_TOOLS

ALL = ("{domains}", "{servers}", "{environment}", "{tool_count}")


def _render(folder: Path | None, environment: str = "staging") -> tuple[dict[str, dict], str]:
    g = Guidance.load(str(folder) if folder else None, environment)
    values = g.values(servers=["files", "weather"], domains=[Domain("files", tags=("read", "write")), Domain("weather")],
                      tool_count=7)
    return {t["name"]: dict(t) for t in g.meta_tools(values).tools}, g.instructions(values)


def test_defaults_follow_the_two_phase_protocol() -> None:
    tools, instructions = _render(None)
    search = tools["tool_search"]["description"]
    assert search.startswith("REQUIRED FIRST STEP")
    assert "Never guess" in search and "execute_tool" in search and "degraded" in search and "rephrase" in search
    assert "files (read, write); weather" in search and "staging" in search
    assert "exact" in tools["execute_tool"]["description"] and "never guessed" in tools["execute_tool"]["description"]
    assert "empty or degraded" in tools["catalog_status"]["description"]
    assert "files, weather" in instructions and "7 tools" in instructions and "staging" in instructions
    # every parameter of every meta-tool has its text from a template; the structure is the skeleton's
    for skeleton in META_TOOLS:
        schema = tools[skeleton["name"]]["inputSchema"]
        assert set(schema["properties"]) == set(skeleton["inputSchema"]["properties"])
        assert schema.get("required") == skeleton["inputSchema"].get("required")
    assert tools["tool_search"]["inputSchema"]["properties"]["format"]["enum"] == ["json", "compact"]
    assert not any("{" + p + "}" in str(tools) + instructions for p in ("domains", "servers", "environment"))


def test_an_override_replaces_one_text_and_keeps_the_rest(tmp_path: Path) -> None:
    (tmp_path / "tool_search.md").write_text(
        "<!-- operator's note, not shown -->\nSearch the {environment} tools of {servers} ({tool_count}). "
        'Example: {"query": "x"} and a literal {{domains}}.\n\n## parameter: query\nWhat to look for.\n')
    tools, instructions = _render(tmp_path)
    search = tools["tool_search"]
    assert search["description"] == ('Search the staging tools of files, weather (7). Example: {"query": "x"} '
                                      "and a literal {domains}.")
    props = search["inputSchema"]["properties"]
    assert props["query"]["description"] == "What to look for."
    assert props["top_k"]["description"] == "Omit: up to 5 that fit."  # a parameter the file leaves out: the default's
    default_tools, default_instructions = _render(None)
    assert tools["execute_tool"] == default_tools["execute_tool"] and instructions == default_instructions


@pytest.mark.parametrize(("fname", "text", "needle"), [
    ("tool_search.md", "Find tools for {domian}.", "unknown placeholder {domian}"),
    ("instructions.md", "Hello {user}", "unknown placeholder {user}"),
    ("execute_tool.md", "Call it.\n## parameter: nme\nThe name.", "unknown parameter 'nme'"),
    ("catalog_status.md", "Status.\n## parameter: query\nNo.", "unknown parameter 'query'"),
    ("tool_search.md", "<!-- only a comment -->\n", "no description text"),
    ("tool_serch.md", "A typo'd file name.", "unknown template file 'tool_serch.md'"),
])
def test_bad_templates_are_refused_naming_file_and_what(tmp_path: Path, fname: str, text: str, needle: str) -> None:
    (tmp_path / fname).write_text(text)
    with pytest.raises(ConfigError) as err:
        TemplateSet.load(str(tmp_path))
    assert needle in str(err.value) and str(tmp_path / fname) in str(err.value)


def test_check_config_rejects_an_unknown_placeholder(tmp_path: Path) -> None:
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "instructions.md").write_text("Gateway for {team}.")
    cfg = tmp_path / "c.toml"
    cfg.write_text('[daemon]\nmetrics_addr = ""\nenvironment = "dev"\n[surface]\ntemplates = "tpl"\n')
    run = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(cfg)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 78, run
    assert str(tmp_path / "tpl" / "instructions.md") in run.stderr and "{team}" in run.stderr, run.stderr
    (tmp_path / "tpl" / "instructions.md").write_text("Gateway for {servers} in {environment}.")
    run = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(cfg)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run


def test_a_missing_folder_is_refused() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        TemplateSet.load("/nonexistent/templates")


def test_every_shipped_default_uses_only_known_placeholders() -> None:
    assert sorted(p.name for p in DEFAULTS_DIR.glob("*.md")) == sorted(FILES.values())
    TemplateSet.load(None)  # parses every default


def test_values_are_inserted_once_never_expanded_again() -> None:
    assert render("{servers}", {"servers": "{environment}"}) == "{environment}"


def test_domains_name_every_server_first_then_what_cards_say_within_the_budget() -> None:
    many = [Domain(f"server-{i:02d}", tags=("forecast", "alerts", "cities")) for i in range(20)]
    text = domains_text(many)
    assert len(text) <= 250 and all(f"server-{i:02d}" in text for i in range(20))
    assert "server-00 (forecast, alerts, cities)" in text
    huge = [Domain(f"a-very-long-upstream-server-name-{i}") for i in range(40)]
    text = domains_text(huge)
    assert len(text) <= 250 and text.endswith("more") and "a-very-long-upstream-server-name-0" in text
    assert domains_text([Domain("files", summary="files: 12 tools about read, write.")]) == "files (12 tools about read, write)"
    assert domains_text([]) == "no servers yet"


def test_servers_in_the_instructions_are_held_to_a_budget() -> None:
    """{servers} was every name joined: a gateway of 300 upstreams gave every client ~13 KB of
    names in its instructions (and in any template that uses {servers})."""
    g = Guidance.load(None)
    names = [f"team-{i:03d}-internal-service-upstream" for i in range(300)]
    values = g.values(servers=names, domains=[Domain(n) for n in names], tool_count=0)
    text = g.instructions(values)
    assert len(text) < 1200 and "team-000-internal-service-upstream, " in text, len(text)
    assert len(values["servers"]) <= 500 and values["servers"].endswith(f"and {300 - values['servers'].count('team-')} more")
    assert [g.values(servers=s, domains=[], tool_count=0)["servers"] for s in (["files", "web"], [])] == [
        "files, web", "none yet"]
