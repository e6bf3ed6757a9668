"""[[access]] rules for OAuth principals: sub, groups/roles and scope claims, and nothing else."""

from __future__ import annotations

from toolatlas.access import allowed_servers
from toolatlas.config import parse

CFG = parse(
    '[daemon]\naccess_default = "deny"\n'
    + "".join(f'[[upstream]]\nname = "{n}"\ntransport = "stdio"\ncommand = "x"\n' for n in ("a", "b", "c"))
    + '[[access]]\noauth_subjects = ["svc-ci"]\nservers = ["a"]\n'
    '[[access]]\noauth_groups = ["ops"]\nservers = ["*"]\n'
    '[[access]]\noauth_scopes = ["tools:b"]\nservers = ["b"]\n'
    '[[access]]\ntokens = ["svc-ci"]\nusers = ["svc-ci"]\nservers = ["c"]\n'
)


def oauth(sub: str, groups: set[str] = set(), scopes: set[str] = set()) -> frozenset[str]:
    return allowed_servers(CFG, None, None, None, (sub, frozenset(groups), frozenset(scopes)))


def test_each_claim_kind_matches_its_rules_only() -> None:
    assert oauth("svc-ci") == {"a"}  # not the token or user rule of the same name
    assert oauth("someone", groups={"ops"}) == {"a", "b", "c"}
    assert oauth("someone", scopes={"tools:b", "other"}) == {"b"}
    assert oauth("svc-ci", scopes={"tools:b"}) == {"a", "b"}
    assert oauth("nobody-known") == frozenset()  # access_default = "deny"
    assert allowed_servers(CFG, None, None, "svc-ci") == {"c"}  # a static token never matches oauth_* rules
