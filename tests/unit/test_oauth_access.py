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


TWO = parse(
    '[daemon]\naccess_default = "deny"\n[http]\nlisten = "127.0.0.1:0"\n'
    '[http.oauth]\nissuers = [{issuer = "https://corp.example", jwks_url = "https://corp.example/jwks"},'
    ' {issuer = "https://partner.example", jwks_url = "https://partner.example/jwks"}]\n'
    + "".join(f'[[upstream]]\nname = "{n}"\ntransport = "stdio"\ncommand = "x"\n' for n in ("a", "b"))
    + '[[access]]\noauth_issuers = ["https://corp.example"]\noauth_groups = ["platform-ops"]\nservers = ["*"]\n'
    '[[access]]\noauth_issuers = ["https://partner.example"]\nservers = ["b"]\n'
)


def test_oauth_issuers_bind_a_rule_to_the_issuers_it_trusts() -> None:
    """With two issuers, a group (or sub, or scope) name means what each issuer says it
    means: a partner who names its own group "platform-ops" must not get the corporate
    rule's upstreams. `oauth_issuers` binds a rule to its issuers; one with no other
    oauth_* key matches every token of them."""
    def who(issuer: str, groups: set[str] = set()) -> frozenset[str]:
        return allowed_servers(TWO, None, None, None, ("someone", frozenset(groups), frozenset()), issuer=issuer)

    assert who("https://corp.example", {"platform-ops"}) == {"a", "b"}
    assert who("https://partner.example", {"platform-ops"}) == {"b"}  # its own rule only
    assert who("https://corp.example") == frozenset()
    assert who("https://partner.example") == {"b"}
