"""`[store]`: optional, checked, and its password a secret (config.py)."""

from __future__ import annotations

import pytest

from toolatlas.config import parse, secrets
from toolatlas.errors import ConfigError
from toolatlas.gateway import restart_keys


def test_no_store_by_default() -> None:
    assert parse("").store.url == ""


def test_the_url_expands_from_the_environment_and_its_password_is_a_secret() -> None:
    cfg = parse('[store]\nurl = "postgresql://gw:${PGPASS}@db.internal:5432/toolatlas"\n', env={"PGPASS": "hunter2-pw"})
    assert cfg.store.url == "postgresql://gw:hunter2-pw@db.internal:5432/toolatlas"
    assert "hunter2-pw" in secrets(cfg)


def test_a_url_that_is_not_postgresql_is_refused_without_showing_the_password() -> None:
    with pytest.raises(ConfigError, match=r"\[store\] url must start with postgresql://") as err:
        parse('[store]\nurl = "mysql://u:topsecret-pw@h/db"\n')
    assert "topsecret-pw" not in str(err.value)


def test_unknown_store_keys_are_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'uri' in \[store\]"):
        parse('[store]\nuri = "postgresql://h/db"\n')


def test_moving_the_store_needs_a_restart() -> None:
    old, new = parse(""), parse('[store]\nurl = "postgresql://h/db"\n')
    assert restart_keys(old, new) == ["store.url"]
