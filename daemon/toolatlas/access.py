"""Who may use which upstreams: [[access]] rules matched against kernel-reported peer
credentials (SO_PEERCRED, SO_PEERGROUPS), never against anything the client says."""

from __future__ import annotations

import grp
import logging
import os
import pwd
from functools import lru_cache

from toolatlas.config import Config

log = logging.getLogger(__name__)


@lru_cache(maxsize=1024)
def _identity(uid: int, gid: int, peer_groups: tuple[int, ...] | None = None) -> tuple[frozenset[str], frozenset[str]]:
    """({user name, "uid"}, {group names and gids}) for a peer; supplementary groups included:
    `peer_groups`, those the kernel reports the peer process has (SO_PEERGROUPS), else, when
    it cannot say, those /etc/group gives the user."""
    users = {str(uid)}
    groups = {str(gid)}
    gids = {gid, *(peer_groups or ())}
    try:
        pw = pwd.getpwuid(uid)
        users.add(pw.pw_name)
        if peer_groups is None:
            gids = set(os.getgrouplist(pw.pw_name, gid))
    except KeyError:
        pass
    for g in gids:
        groups.add(str(g))
        try:
            groups.add(grp.getgrgid(g).gr_name)
        except KeyError:
            pass
    return frozenset(users), frozenset(groups)


def allowed_servers(cfg: Config, uid: int | None, gid: int | None, token: str | None = None,
                    oauth: tuple[str, frozenset[str], frozenset[str]] | None = None,
                    groups: tuple[int, ...] | None = None, *, issuer: str | None = None) -> frozenset[str]:
    """The upstreams a principal may use: the union over matching rules, else the default.

    A principal is a socket peer (uid, gid and supplementary `groups` from the kernel; None:
    the user's groups in /etc/group), an HTTP bearer token (its
    configured name) or a validated OAuth token (`oauth`: its sub, groups/roles, scopes;
    `issuer`: its `iss`, which a rule's `oauth_issuers` must name when it has any); a
    token principal matches only `tokens` rules, an OAuth one only `oauth_*` rules. A socket
    connection without credentials (in-process use) is treated like the daemon's own user.
    """
    every = frozenset(u.name for u in cfg.upstream)
    matched = False
    servers: set[str] = set()
    if oauth is not None:
        subject, claim_groups, scopes = oauth
        for rule in cfg.access:
            if rule.oauth_issuers and issuer not in rule.oauth_issuers:
                continue
            claims = rule.oauth_subjects or rule.oauth_groups or rule.oauth_scopes
            if (subject in rule.oauth_subjects or claim_groups & set(rule.oauth_groups)
                    or scopes & set(rule.oauth_scopes) or (rule.oauth_issuers and not claims)):
                matched = True
                servers |= every if "*" in rule.servers else set(rule.servers)
    elif token is not None:
        for rule in cfg.access:
            if token in rule.tokens:
                matched = True
                servers |= every if "*" in rule.servers else set(rule.servers)
    else:
        if uid is None or gid is None:
            uid, gid, groups = os.getuid(), os.getgid(), None
        users, names = _identity(uid, gid, groups)
        for rule in cfg.access:
            if users & {str(u) for u in rule.users} or names & {str(g) for g in rule.groups}:
                matched = True
                servers |= every if "*" in rule.servers else set(rule.servers)
    if not matched:
        return every if cfg.daemon.access_default == "allow" else frozenset()
    return frozenset(servers) & every


@lru_cache(maxsize=1024)
def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def user_name(uid: int | None) -> str | None:
    """The user name of `uid` (None: no such user, or no uid). `uid=None` is this process's
    user, as `allowed_servers` treats an in-process connection."""
    return _user_name(os.getuid() if uid is None else uid)


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def admin_refusal(uid: int | None, daemon_uid: int | None = None) -> str | None:
    """Why a socket peer may not use the operator commands (`toolatlas upstream ...`,
    `toolatlas reload`), or None when it may: only the user the daemon runs as
    (`daemon_uid`, default this process's) and root. `uid` is the kernel's (SO_PEERCRED)."""
    owner = os.getuid() if daemon_uid is None else daemon_uid
    if uid is None:
        return ("operator commands need a peer whose uid the kernel reports (SO_PEERCRED); "
                "this connection has none")
    if uid in (owner, 0):
        return None
    return (f"operator commands are for the daemon's owner only: this connection's peer is {_user(uid)}, "
            f"the daemon runs as {_user(owner)}; run the command as that user or as root")


def rule_warnings(cfg: Config) -> list[str]:
    """A sentence per name an [[access]] rule gives that matches no one: a token no request
    can carry while the HTTP endpoint is on (neither a [[http.tokens]] name nor [http]
    anonymous: a typo, or a token removed and left in the rule), and a user or group name
    this host does not know (numeric ids are taken as they are). The principal meant then
    gets `access_default`. Warnings, not errors: a reload that removes a token and leaves
    its name in a rule must still revoke the token, and an account may be made later."""
    out = []
    tokens = {t.name for t in cfg.http.tokens} | ({cfg.http.anonymous} if cfg.http.anonymous else set())
    known = ", ".join(sorted(tokens)) or "none"
    default = f"access_default ({cfg.daemon.access_default!r})"
    for i, rule in enumerate(cfg.access, 1):
        for name in dict.fromkeys(rule.tokens) if cfg.http.listen else ():
            if name not in tokens:
                out.append(f"[[access]] rule {i} names token {name!r}, which is no [[http.tokens]] name (those are: "
                           f"{known}) nor [http] anonymous: the rule matches no request by it, and a token no rule "
                           f"names gets {default}")
        issuers = [i.issuer for i in cfg.http.oauth.issuers]
        if len(issuers) > 1 and not rule.oauth_issuers and (rule.oauth_subjects or rule.oauth_groups or rule.oauth_scopes):
            out.append(f"[[access]] rule {i} matches the oauth_* claims of every issuer ({', '.join(issuers)}): a "
                       "token of any of them with that sub, group or scope gets its upstreams; name the issuer "
                       "whose claims it means in oauth_issuers")
        for kind, names, lookup in (("user", rule.users, pwd.getpwnam), ("group", rule.groups, grp.getgrnam)):
            for name in dict.fromkeys(n for n in names if isinstance(n, str) and not n.isdigit()):
                try:
                    lookup(name)
                except KeyError:
                    out.append(f"[[access]] rule {i} names {kind} {name!r}, which this host does not know: the rule "
                               f"matches no socket client by it, and one no rule matches gets {default}")
    return out


def clear_cache() -> None:
    """Forget resolved identities (after a reload: users and groups may have changed)."""
    _identity.cache_clear()
    _user_name.cache_clear()
