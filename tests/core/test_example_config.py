"""configs/*.toml are valid, and example.toml documents every key the config accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor.config import KEYS, SCALAR_KEYS, SYNC_KEYS, build_config, load_toml

ROOT = Path(__file__).resolve().parents[2]


def test_example_documents_every_key() -> None:
    text = (ROOT / "configs" / "example.toml").read_text()
    for key in SCALAR_KEYS:
        assert re.search(rf"^#? ?{key} = ", text, re.M), f"configs/example.toml does not document {key}"
    for key in SYNC_KEYS:
        assert re.search(rf"^# {key} = ", text, re.M), f"configs/example.toml does not document sync.{key}"


def test_example_values_are_the_registrys_defaults() -> None:
    """configs/example.toml says "every key, with its default": each value written there,
    read as supervise reads it, is the default of the one registry of keys (config.KEYS)."""
    data = load_toml(ROOT / "configs" / "example.toml")
    written = {k: v for k, v in data.items() if k != "sync"}
    assert written, "example.toml sets no key"
    for key in KEYS:
        if key.name in written:
            assert key.convert(written[key.name]) == key.default, f"example.toml: {key.name}"


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the presets' [[sync]] paths read the two directories the job scripts export
    monkeypatch.setenv("LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("PERSISTENT_DIR", str(tmp_path / "persistent"))
    cfg = build_config(flags={"run_dir": str(tmp_path / "run")}, command=("true",), config_file=path, env={})
    assert cfg.run_dir == tmp_path / "run"
    for pair in cfg.sync:
        assert pair.src.is_relative_to(tmp_path / "local") and pair.dst.is_relative_to(tmp_path / "persistent"), pair
