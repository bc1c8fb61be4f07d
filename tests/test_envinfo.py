"""supervise env: recorded Slurm and PBS environments → what it reports and suggests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.envinfo import gather, render_text
from supervisor.sched._pbs_output import parse_qstat_f

FIXTURES = Path(__file__).parent / "fixtures"
CASES = sorted((FIXTURES / "env").glob("*.json"))


def _load(path: Path, tmp_path: Path) -> tuple[dict, dict, dict | None]:
    case = json.loads(path.read_text())
    nodefile = tmp_path / "nodefile"
    if "nodefile" in case:
        nodefile.write_text("\n".join(case["nodefile"]) + "\n")
    sub = lambda v: str(nodefile) if v == "@NODEFILE@" else v  # noqa: E731
    env = {k: sub(v) for k, v in case["env"].items()}
    expect = {k: ([sub(x) for x in v] if isinstance(v, list) else v) for k, v in case["expect"].items()}
    qstat = None
    if case.get("qstat"):
        qstat = next(iter(parse_qstat_f((FIXTURES / "pbs" / case["qstat"]).read_text()).values()))
    return env, expect, qstat


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_recorded_environments(path: Path, tmp_path: Path) -> None:
    env, expect, qstat = _load(path, tmp_path)
    info = gather(env, qstat=qstat)
    for key, value in expect.items():
        assert info[key] == value, key
    json.dumps(info)  # `supervise env --json` must be able to print it
    text = render_text(info)
    assert info["job_id"] in text and str(info["world_size"]) in text


def test_there_are_slurm_and_pbs_cases() -> None:
    names = {p.stem.split("_")[0] for p in CASES}
    assert {"slurm", "pbs"} <= names


def test_end_time_is_taken_when_given(tmp_path: Path) -> None:
    env, _, _ = _load(FIXTURES / "env" / "slurm_ibex_4gpu.json", tmp_path)
    info = gather(env, end_time=10_000.0, now=2_800.0)
    assert info["end_time"] == 10_000.0 and info["seconds_left"] == 7200.0
    assert "2h00m left" in render_text(info)
    assert gather(env)["end_time"] is None
    assert gather({**env, "SLURM_JOB_END_TIME": "20000"}, now=0.0)["end_time"] == 20000.0


def test_launcher_is_reported_or_unknown() -> None:
    info = gather({}, ["torchrun", "--nproc-per-node", "2", "train.py"])
    assert info["launcher"] in ("torchrun", "unknown")  # unknown only while launchers.py is absent
    assert info["command"] == ["torchrun", "--nproc-per-node", "2", "train.py"]
    assert gather({}, [])["launcher"] is None


def test_local_without_gpus_suggests_nothing() -> None:
    info = gather({"PWD": "/w"})
    assert info["scheduler"] == "local" and info["launch_command"] is None and info["requeue_id"] is None
    assert "launch with:   -" in render_text(info)
