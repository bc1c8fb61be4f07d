"""The report on golden run directories made by the real agent (tests/report/make_golden.py).

The text and JSON are compared whole with what make_golden.py recorded (re-record with
``make_golden.py --expected`` after an intended change, and read the diff); the facts are
also checked against the raw files, read here the simple way, so a wrong aggregate cannot
hide behind a re-recorded expectation.
"""

from __future__ import annotations

import csv
import json
import math
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from supervisor.report import facts_of

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = ["finished", "attempts", "failed", "torn"]


def report(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "supervisor", "report", *args], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", CASES)
def test_text_and_json_are_as_recorded(case: str) -> None:
    text = report(f"tests/report/golden/{case}")
    assert text.returncode == 0, text.stderr
    assert text.stdout == (GOLDEN / case / "expected.txt").read_text()
    js = report(f"tests/report/golden/{case}", "--json")
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout) == json.loads((GOLDEN / case / "expected.json").read_text())


def _gpu_rows(case: str) -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = {}
    with open(GOLDEN / case / "gpu.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["time"] != "time":
                rows.setdefault(r["uuid"], []).append(r)
    return rows


@pytest.mark.parametrize("case", ["finished", "attempts"])
def test_gpu_facts_match_the_csv(case: str) -> None:
    f, _ = facts_of(GOLDEN / case)
    rows = _gpu_rows(case)
    assert [g.uuids for g in f.gpus] == [[u] for u in sorted(rows)]  # the same devices in every attempt
    for g in f.gpus:
        mine = rows[g.uuids[0]]
        util = sorted(float(r["util_gpu_pct"]) for r in mine)
        assert g.samples == len(mine)
        assert g.util_mean_pct == pytest.approx(sum(util) / len(util), abs=0.05)
        assert g.util_p95_pct == pytest.approx(util[math.ceil(0.95 * len(util)) - 1], abs=0.5)
        assert g.mem_peak_mib == max(float(r["mem_used_mib"]) for r in mine)
        assert g.mem_peak_pct == pytest.approx(100 * g.mem_peak_mib / float(mine[0]["mem_total_mib"]), abs=0.06)
        # Energy restarts from 0 with each attempt's sampler: the report adds up each attempt's last value.
        per_attempt, last = 0.0, None
        for r in mine:
            e = float(r["energy_j"])
            if last is not None and e < last:
                per_attempt += last
            last = e
        assert g.energy_kwh == pytest.approx((per_attempt + last) / 3.6e6, abs=1e-4)
    by_index = {g.index: g for g in f.gpus}
    assert set(by_index[1].throttled_s) == {"sw_power_cap"} and by_index[1].throttled_s["sw_power_cap"] > 0
    assert by_index[2].util_mean_pct == 0.0


def test_attempts_each_with_its_reason_and_stop() -> None:
    f, _ = facts_of(GOLDEN / "attempts")
    ends = [e for e in read_journal(GOLDEN / "attempts").events if e["kind"] == "end"]
    assert f.verdict.status == "finished" and f.verdict.requeues == 2
    assert [a.reason for a in f.attempts] == [e["reason"] for e in ends] == ["deadline", "preempted", "child-exit"]
    assert f.verdict.headline.startswith("FINISHED") and "requeued 2 times" in f.verdict.headline
    assert [s.reason for s in f.stops] == ["deadline", "preempted", "child-exit"]
    first = f.stops[0]
    assert [s.step for s in first.steps] == ["checkpoint", "flush", "stop-child", "final-flush", "requeue"]
    assert first.steps[0].outcome in ("timeout", "no-time")  # a 1 s warning for a 2 s checkpoint
    assert first.margin_s is not None and first.margin_s < 0.5
    assert f.stops[1].steps[0].outcome == "published"
    texts = " ".join(n.text for n in f.notes)
    assert "Raise --warn-before to" in texts
    assert "XID 79" in texts and "--exclude=" in texts
    assert [g.xids for g in f.gpus] == [[], [79], [], []]


def test_checkpoint_durability_from_the_journal() -> None:
    f, _ = facts_of(GOLDEN / "attempts")
    events = read_journal(GOLDEN / "attempts").events
    pubs = [e for e in events if e["kind"] == "publish" and not e.get("pointer")]
    assert f.checkpoints.published == len({e["checkpoint"] for e in pubs})
    assert f.checkpoints.last is not None and f.checkpoints.last.name == pubs[-1]["checkpoint"]
    assert f.checkpoints.last.attempt == 3
    assert f.checkpoints.not_durable == []
    lags = sorted(e["lag_s"] for e in {e["checkpoint"]: e for e in reversed(pubs)}.values())
    assert f.checkpoints.lag_p95_s == lags[math.ceil(0.95 * len(lags)) - 1]


def test_finished_run_notes_name_the_fix() -> None:
    f, _ = facts_of(GOLDEN / "finished")
    assert f.verdict.status == "finished" and f.verdict.headline == "FINISHED"
    by_level = {n.level: [] for n in f.notes}
    for n in f.notes:
        by_level[n.level].append(n.text)
    assert any("GPU 2 did almost no work" in t and "--gpus=3" in t for t in by_level["bad"])
    assert any("GPU 3 was idle most of the time" in t and "num_workers" in t for t in by_level["warn"])
    assert any("GPU memory peaked at 39 %" in t for t in by_level["info"])
    assert not any("warn-before" in n.text for n in f.notes), "a finished run has no stop at the time limit"


def test_no_gpu_data_and_a_failed_training() -> None:
    f, _ = facts_of(GOLDEN / "failed")
    assert f.verdict.status == "failed" and f.attempts[0].exit_status == 3
    assert f.gpus == [] and f.gpu_none and "NVML" in f.gpu_none[0]
    out = report("tests/report/golden/failed").stdout
    assert out.splitlines()[0] == "FAILED: child-failed, exit status 3 · 1 attempt"
    assert "no GPU data" in out


def test_torn_last_line_is_reported_not_fatal() -> None:
    torn = read_journal(GOLDEN / "torn")
    assert torn.torn_last_line is not None and '"kind":"end"' in torn.torn_last_line
    f, _ = facts_of(GOLDEN / "torn")
    whole, _ = facts_of(GOLDEN / "finished")
    assert f.journal["torn_last_line"] is True and f.verdict.status == "killed"
    assert f.attempts[0].reason is None
    assert f.checkpoints.last == whole.checkpoints.last  # everything before the tear is still there
    assert any("torn" in n.text for n in f.notes)


def test_colour_only_on_a_terminal() -> None:
    piped = report("tests/report/golden/finished", env={"NO_COLOR": ""})
    assert "\033[" not in piped.stdout
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm"
    p = subprocess.Popen([sys.executable, "-m", "supervisor", "report", "tests/report/golden/finished"], cwd=ROOT,
                         env=env, stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=30)
    os.close(leader)
    assert p.returncode == 0
    assert b"\033[32;1mFINISHED" in out


def test_unusable_run_dirs_exit_2_with_one_line(tmp_path: Path) -> None:
    for target in (tmp_path / "missing", tmp_path):
        r = report(str(target))
        assert r.returncode == 2 and r.stdout == ""
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("supervise report: ")


def test_html_without_the_plotting_library_fails_with_one_line(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['plotly'] = None; from pathlib import Path; from supervisor import report; "
            f"sys.exit(report.main(Path('tests/report/golden/finished'), as_json=False, html=Path({str(tmp_path / 'r.html')!r})))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "pip install 'supervise[report]'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_the_agent_does_not_import_the_plotting_library() -> None:
    code = "import sys, supervisor.cli, supervisor.report; print('plotly' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr
