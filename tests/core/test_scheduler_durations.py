"""Durations in the scheduler's own forms (issue 42): what ``#SBATCH --time`` and ``#PBS -l
walltime`` say, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``, is read by every
duration flag, ``SUPERVISE_*`` variable and config key, through the real ``supervise``; a bare
number stays seconds (Slurm's bare number is minutes: docs/slurm.md says which)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.supervise import run_supervise


def _config(run: Path) -> dict:
    start = json.loads((run / "events.jsonl").read_text().splitlines()[0])
    assert start["kind"] == "start", start
    return start["config"]


def test_time_limit_and_grace_take_the_schedulers_forms_as_flags(tmp_path: Path) -> None:
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--gpu-every", "0", "--time-limit", "12:00:00",
                      "--grace", "1-00:00:00", "--warn-before", "05:00", "--checkpoint-timeout", "0-01",
                      "--sync-every", "1-00:30", "--", "true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cfg = _config(tmp_path / "run")
    assert (cfg["time_limit"], cfg["grace"], cfg["warn_before"]) == (43200.0, 86400.0, 300.0), cfg
    assert (cfg["checkpoint_timeout"], cfg["sync_every"]) == (3600.0, 86400.0 + 1800.0), cfg


def test_a_bare_number_stays_seconds_and_mm_ss_is_slurms(tmp_path: Path) -> None:
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--gpu-every", "0", "--time-limit", "90",
                      "--grace", "01:30", "--", "true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cfg = _config(tmp_path / "run")
    assert cfg["time_limit"] == 90.0 and cfg["grace"] == 90.0, cfg


def test_environment_and_config_file_take_them_too(tmp_path: Path) -> None:
    toml = tmp_path / "supervise.toml"
    toml.write_text('time_limit = "2-00:00:00"\nwarn_before = "0:10:00"\n'
                    '[[sync]]\nfrom = "local"\nto = "persistent"\nevery = "00:05:00"\nsettle = "00:07"\n')
    r = run_supervise("--config", str(toml), "--run-dir", str(tmp_path / "run"), "--gpu-every", "0", "--", "true",
                      env={"SUPERVISE_GRACE": "1:00:00", "SUPERVISE_HANG_FLOOR": "0-12"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cfg = _config(tmp_path / "run")
    assert (cfg["time_limit"], cfg["warn_before"], cfg["grace"], cfg["hang_floor"]) == (172800.0, 600.0, 3600.0, 43200.0), cfg
    assert (cfg["sync"][0]["every"], cfg["sync"][0]["settle"]) == (300.0, 7.0), cfg["sync"]


@pytest.mark.parametrize("bad", ["12:00:xx", "1:2:3:4", "1-", "-1:00", "1-2-3", "10:60", "1:61:00", "1:00:00s", ":30",
                                 "1-25:00:00x"])
def test_garbage_in_a_schedulers_form_is_one_line_and_exit_2(tmp_path: Path, bad: str) -> None:
    r = run_supervise("--run-dir", str(tmp_path / "run"), f"--time-limit={bad}", "--", "touch", str(tmp_path / "started"),
                      cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "time_limit" in lines[0] and "HH:MM:SS" in lines[0], r.stderr
    assert not (tmp_path / "started").exists() and not (tmp_path / "run").exists()


def test_help_names_the_forms_and_says_a_bare_number_is_seconds() -> None:
    out = run_supervise("--help", timeout=30).stdout
    assert "HH:MM:SS" in out and "D-HH:MM:SS" in out and "a bare number is seconds" in out, out
