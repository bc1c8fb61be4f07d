"""The long set, run by hand (issue 15's bar): the seed's Ibex script rewritten for supervise
(`#SBATCH --time=2 --signal=B:USR1@60 --requeue`, configs/slurm.toml, torchrun, the real
examples/ddp_train.py on 2 gloo ranks), run to completion twice on the test cluster: once with
a training that saves only periodically and dies on SIGTERM (like pytorch/examples), once with
one that answers checkpoint requests. Each time: every attempt stopped at the time limit
trained at least 60 % of its allocation, the final weights equal an uninterrupted run's, and no
cleanly stopped attempt is FAILED in sacct. The figures are printed (-s) for docs/slurm.md.

    SUPERVISE_LONG=1 flock /tmp/slurm-tests.lock .venv/bin/python -m pytest -s -m slow tests/slurm/test_seed_long.py

The queue wait between attempts (BeginTime, 120 s) is skipped with StartTime=now
(Slurm.release), as docs/slurm.md says; it is not part of any attempt's allocation.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from tests.support.ddp_example import TRAIN, digest_of, train
from tests.support.slurm import ACTIVE, Slurm

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.torch,
              pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")]
REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
STEPS, EVERY, SLEEP = 900, 50, "0.2"
MIN_SHARE = 0.6


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted run's final weights (pacing and checkpoints do not change them)."""
    proc = train("torchrun", tmp_path_factory.mktemp("reference"), "--steps", str(STEPS), "--ckpt-every", "0",
                 timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return digest_of(proc.stdout)


def seed_script(d: Path, *extra: str) -> str:
    return f"""#!/bin/bash
#SBATCH --job-name=seed
#SBATCH --time=2
#SBATCH --signal=B:USR1@60
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={d}/out.txt
for v in ${{!SUPERVISE_@}}; do unset "$v"; done
export LOCAL_DIR={d}/local-${{SLURM_RESTART_COUNT:-0}} PERSISTENT_DIR={d}/persist PYTHONPATH={REPO}
echo "job-script attempt=${{SLURM_RESTART_COUNT:-0}} t=$(date +%s.%N)"
cd {d}
exec {sys.executable} -m supervisor --config {REPO}/configs/slurm.toml --run-dir {d}/run -- \\
    {TORCHRUN} --standalone --nproc-per-node 2 {TRAIN} --steps {STEPS} --ckpt-every {EVERY} --step-sleep {SLEEP} \\
    --ckpt-dir $LOCAL_DIR/checkpoints --log-dir $LOCAL_DIR/logs {' '.join(extra)}
"""


def run_to_completion(slurm: Slurm, d: Path, *extra: str) -> tuple[str, list[dict]]:
    d.mkdir(parents=True)
    jobid = slurm.submit(seed_script(d, *extra))
    released = 0
    deadline = time.monotonic() + 1500
    while True:
        view = slurm.show(jobid)
        state, restarts = view.get("JobState"), int(view.get("Restarts") or 0)
        if state and state not in ACTIVE:
            break
        if state == "PENDING" and restarts > released:
            slurm.release(jobid)
            released = restarts
        assert time.monotonic() < deadline, f"job {jobid} still {state} after 25 min"
        time.sleep(1)
    rows = slurm.run("sacct", "-c", "-j", jobid, "--parsable2", "--noheader", "-o", "JobID,State,ExitCode,Start,End").stdout
    return state, [dict(zip(("job", "state", "exit", "start", "end"), r.split("|"))) for r in rows.splitlines() if r]


def figures(run: Path) -> list[dict]:
    events = read_journal(run).events
    out = []
    for a in sorted({e["attempt"] for e in events}):
        ev = [e for e in events if e["attempt"] == a]
        first = lambda kind: next((e for e in ev if e["kind"] == kind), {})  # noqa: E731
        start, dl, stop, end = first("start"), first("deadline"), first("stop"), first("end")
        cp = next((e for e in ev if e["kind"] == "stop-step" and e["step"] == "checkpoint"), {})
        alloc = dl.get("allocation_s")
        trained = (stop["t"] - start["t"]) if stop and start else None
        out.append({"attempt": a, "reason": end.get("reason"), "allocation_s": alloc, "lead_s": dl.get("lead_s"),
                    "bound": dl.get("bound"), "learned": dl.get("learned"),
                    "trained_s": None if trained is None else round(trained, 1),
                    "share": None if not (alloc and trained) else round(trained / alloc, 3),
                    "checkpoint": cp.get("outcome") or cp.get("skipped"), "answered": cp.get("answered"),
                    "checkpoint_s": cp.get("seconds"), "exit_status": end.get("exit_status"),
                    "launcher_status": end.get("launcher_status"), "stopped_cleanly": end.get("stopped_cleanly"),
                    "signals": [f"{s['signal']}:{s['action']}" for s in ev if s["kind"] == "signal"]})
    return out


@pytest.mark.parametrize("kind", ["periodic", "answers"])
def test_the_rewritten_seed_script_runs_to_completion(slurm: Slurm, tmp_path: Path, reference: str, kind: str) -> None:
    d = tmp_path / kind
    state, rows = run_to_completion(slurm, d, *(["--ignore-requests"] if kind == "periodic" else []))
    out = (d / "out.txt").read_text()
    rows_shown = "\n".join(str(r) for r in rows)
    figs = figures(d / "run")
    print(f"\n{kind}: final state {state}; sacct:\n{rows_shown}")
    for f in figs:
        print(f"  {f}")
    assert state == "COMPLETED", out[-3000:]
    assert digest_of(out) == reference, "the final weights differ from the uninterrupted run's"
    stopped = [f for f in figs if f["reason"] == "deadline"]
    assert stopped, figs
    for f in stopped:
        assert f["share"] is not None and f["share"] >= MIN_SHARE, f
        assert f["stopped_cleanly"] is True and f["exit_status"] == 0, f
    assert not [r for r in rows if r["state"].startswith("FAILED")], rows_shown
    if kind == "periodic":
        assert all(f["answered"] is False for f in stopped if f["checkpoint"] == "published"), figs
        report = __import__("subprocess").run([sys.executable, "-m", "supervisor", "report", str(d / "run")],
                                              capture_output=True, text=True, cwd=REPO, timeout=60).stdout
        assert "does not answer checkpoint requests" in report, report
