"""``to = "s3://…"`` as the config reads it (no server needed): what is accepted, what is a
one-line error, and where the secret key goes (never a repr, a command line or the journal)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.config import agent_view, build_config, from_leader, store_keys_path
from supervisor.errors import ConfigError

SECRET = "s3cr3t-never-printed"


def _cfg(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{tmp_path / "local"}"\n{table}')
    return path


def test_an_s3_pair_keeps_its_url_and_its_own_keys_and_never_shows_the_secret(tmp_path: Path) -> None:
    path = _cfg(tmp_path, 'to = "s3://my-bucket/proj/run1/"\nendpoint = "http://s3.local:9000"\nregion = "eu-1"\n'
                          f'access_key_id = "AKID"\nsecret_access_key = "{SECRET}"\nnodes = 2\n')
    cfg = build_config(flags={"run_dir": str(tmp_path / "run")}, command=("true",), config_file=path, env={})
    (p,) = cfg.sync
    assert p.store is not None and p.where == "s3://my-bucket/proj/run1" and p.store.prefix == "proj/run1"
    assert (p.store.endpoint, p.store.region, p.store.access_key_id, p.store.secret_access_key) == \
        ("http://s3.local:9000", "eu-1", "AKID", SECRET)
    assert SECRET not in repr(cfg)
    view = json.dumps(agent_view(cfg))  # the agents' command line
    assert SECRET not in view and '"to": "s3://my-bucket/proj/run1"' in view and '"endpoint": "http://s3.local:9000"' in view
    # the leader keeps the secret for its agents in a file only it reads
    from supervisor.sync._store import share_access

    share_access(tmp_path / "run", cfg.sync)
    keys = store_keys_path(tmp_path / "run")
    assert keys.stat().st_mode & 0o777 == 0o600
    assert SECRET in keys.read_text()
    agent = from_leader(view, tmp_path / "run")
    assert agent.sync[0].store == p.store


@pytest.mark.parametrize("table, says", [
    ('to = "s3://B/x"\n', "bucket name"),
    ('to = "s3://ok-bucket/a//b"\n', "empty, . or .. path segments"),
    ('to = "/persist/ckpt"\nendpoint = "http://x"\n', "only for an object-store pair"),
    ('to = "s3://ok-bucket/p"\nsecret_access_key = ""\n', "a non-empty string"),
])
def test_a_bad_store_setting_is_one_line(tmp_path: Path, table: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config(flags={"run_dir": str(tmp_path / "run")}, command=("true",), config_file=_cfg(tmp_path, table), env={})
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_two_pairs_in_one_prefix_are_refused(tmp_path: Path) -> None:
    from supervisor.sync._checks import check_pairs

    path = tmp_path / "job.toml"
    path.write_text(f'[[sync]]\nfrom = "{tmp_path / "a"}"\nto = "s3://bkt/run"\n\n'
                    f'[[sync]]\nfrom = "{tmp_path / "b"}"\nto = "s3://bkt/run/logs"\nkind = "log"\n')
    cfg = build_config(flags={"run_dir": str(tmp_path / "run")}, command=("true",), config_file=path, env={})
    with pytest.raises(ConfigError, match="overlaps"):
        check_pairs(cfg.sync)


def test_the_checkpoints_flag_takes_an_s3_url(tmp_path: Path) -> None:
    cfg = build_config(flags={"run_dir": str(tmp_path / "run")}, command=("true",), env={},
                       flag_pairs=[("checkpoint", str(tmp_path / "l"), "s3://bkt/p")], cwd=tmp_path)
    assert cfg.sync[0].store is not None and cfg.sync[0].where == "s3://bkt/p"
    with pytest.raises(ConfigError, match="--checkpoints"):
        build_config(flags={"run_dir": str(tmp_path / "run")}, command=("true",), env={},
                     flag_pairs=[("checkpoint", str(tmp_path / "l"), "s3://x/p")], cwd=tmp_path)
