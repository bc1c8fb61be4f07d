"""scripts/demo.sh (without setup): preempted, resumed, finished, and bit-identical to an uninterrupted run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support import journal  # noqa: E402
from tests.support.ddp_example import checkpoint_digest, launch_env, train  # noqa: E402
from tests.support.paths import ROOT  # noqa: E402

pytestmark = pytest.mark.torch

STEPS = 60


def test_demo_preempts_resumes_and_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    # 0.2 s a step (the demo's 0.05 s gives 3 s of training): the demo preempts once 2 checkpoints
    # are durable, and under CI's load the mirror's lag let a 3 s training finish first (stop 28).
    env = launch_env(DEMO_STEPS=str(STEPS), DEMO_CKPT_EVERY="10", DEMO_PREEMPT_AFTER="2", DEMO_VERIFY="0",
                    DEMO_STEP_SLEEP="0.2")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), "--no-setup", str(demo)], env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]

    events = journal.events(demo / "run")
    ends = [e for e in events if e["kind"] == "end"]
    assert [(e["attempt"], e["reason"]) for e in ends] == [(1, "preempted"), (2, "child-exit")], ends
    assert ends[1]["exit_status"] == 0
    # Attempt 1's stop sequence took a checkpoint on request and published it before stopping.
    steps1 = {e["step"]: e for e in events if e["kind"] == "stop-step" and e["attempt"] == 1}
    assert steps1["checkpoint"]["outcome"] == "published", steps1["checkpoint"]
    # Attempt 2 restored the newest persistent checkpoint of attempt 1, and the training said so.
    published1 = [e["checkpoint"] for e in events if e["kind"] == "publish" and e["attempt"] == 1
                  and e.get("checkpoint", "").startswith("step_")]
    newest1 = max(published1, key=lambda n: int(n.split("_")[1]))
    restores = [e for e in events if e["kind"] == "restore" and e["attempt"] == 2]
    assert restores and restores[0]["checkpoint"] == newest1, (restores, published1)
    n = int(newest1.split("_")[1])
    assert 20 <= n < STEPS
    assert re.search(rf"resumed from step {n} \(.*restored by supervise\)", out), out[-4000:]
    assert "ended: preempted" in out and "ended: child-exit (exit status 0)" in out
    # torchrun's traceback for the TERM is one explained line, and nothing else looks like a failure
    assert "Traceback" not in out and "torchrun printed its usual traceback" in out, out[-4000:]

    persistent = demo / "persistent"
    final = persistent / "checkpoints" / f"step_{STEPS}"
    assert (final / ".metadata").is_file()
    assert (persistent / "checkpoints" / "latest").read_text() == f"step_{STEPS}"
    rows = (persistent / "logs" / "scalars.csv").read_text().splitlines()
    assert rows[0] == "step,loss,wall_time" and rows[-1].startswith(f"{STEPS},")

    # The same training, uninterrupted and without supervise: the very same weights.
    ref = tmp_path / "ref"
    ref.mkdir()
    r = train("torchrun", ref, "--steps", str(STEPS), "--ckpt-every", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert checkpoint_digest(final) == checkpoint_digest(ref / "ckpt" / f"step_{STEPS}")


def test_demo_rejects_an_unknown_option(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), "--no-setup", "--bogus", str(tmp_path)],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "unknown option --bogus" in proc.stderr
