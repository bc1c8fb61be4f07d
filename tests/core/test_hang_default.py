"""Issue 22, item 5: hang detection is on by default. The learned bound (5x the longest gap
between progress marks, at least ``hang_floor``) starts only once progress marks were seen,
so a run that logs rarely or checkpoints hourly is never called hung."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

from supervisor import config, policy
from tests.support.journal import events
from tests.support.supervise import run_supervise

# Logs a line every 0.2 s for a while (the marks the bound learns from), then goes quiet:
# for good (a hang) or for a long evaluation, after which it exits 0.
QUIET_AFTER_LOGGING = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    log = Path(sys.argv[1]); log.mkdir(parents=True, exist_ok=True)
    with open(log / "train.log", "a") as f:
        for i in range(int(sys.argv[2])):
            f.write(f"step {i}\\n"); f.flush(); time.sleep(0.2)
    time.sleep(float(sys.argv[3]))
""")


def test_the_default_bound_is_learned_with_a_floor_and_no_upper_bound() -> None:
    floor = config.DEFAULT["hang_floor"]
    assert config.DEFAULT["hang_after"] is None and floor == 600.0
    assert policy.hang_bound(None, [1.0] * 3, [], floor) == (math.inf, None), "no hang before marks were seen"
    assert policy.hang_bound(None, [1.0] * 6, [], floor) == (floor, 5.0)
    assert policy.hang_bound(None, [3600.0] * 6, [], floor) == (18000.0, 18000.0), "an hourly checkpoint: 5 h"
    assert policy.hang_bound(300.0, [1.0] * 6, [], 10.0) == (10.0, 5.0)


def _run(tmp_path: Path, lines: int, quiet: float, *args: str) -> tuple[Path, object]:
    run, log, persist = tmp_path / "run", tmp_path / "log", tmp_path / "persist"
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "quiet.py"
    script.write_text(QUIET_AFTER_LOGGING)
    r = run_supervise("--run-dir", str(run), "--logs", str(log), str(persist), "--gpu-every", "0", "--grace", "5s",
                      *args, "--", sys.executable, str(script), str(log), str(lines), str(quiet), timeout=120)
    return run, r


def test_a_hang_is_caught_with_the_default_config(tmp_path: Path) -> None:
    # Only the floor is lowered (10 min by default) to keep the test short; hang_after is unset.
    run, r = _run(tmp_path, 40, 3600, "--hang-floor", "4s", "--hang-action", "stop")
    hang = events(run, "hang")
    assert len(hang) == 1, r.stderr[-3000:]  # type: ignore[attr-defined]
    assert 4.0 <= hang[0]["bound_s"] < 100 and hang[0]["longest_gap_s"] is not None, hang[0]  # learned, floored
    assert events(run, "end")[0]["reason"] == "hang"


def test_no_hang_is_reported_for_a_run_that_logs_rarely(tmp_path: Path) -> None:
    # Default config: a long quiet spell after brisk logging stays under the 10 min floor,
    # and a run with too few marks to learn from is never judged.
    run, r = _run(tmp_path, 40, 12, "--hang-action", "stop")
    assert r.returncode == 0 and not events(run, "hang"), r.stderr[-3000:]  # type: ignore[attr-defined]
    run2, r2 = _run(tmp_path / "rare", 3, 12, "--hang-floor", "1s", "--hang-action", "stop")
    assert r2.returncode == 0 and not events(run2, "hang"), r2.stderr[-3000:]  # type: ignore[attr-defined]
    assert events(run2, "end")[0]["reason"] == "child-exit"
