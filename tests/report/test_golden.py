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
CASES = ["finished", "attempts", "failed", "torn", "local-only", "from-scratch", "rewritten", "slurm-requeued",
         "five-minutes"]


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
    assert f.verdict.status == "finished" and f.verdict.requeues == 0 and f.verdict.reruns == 2
    assert [a.reason for a in f.attempts] == [e["reason"] for e in ends] == ["deadline", "preempted", "child-exit"]
    assert f.verdict.headline == "FINISHED · rerun 2 times · 3 attempts"  # requeue was off: reruns by hand
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
    assert out.lower().count("no gpu data") == 1, "said once, not per attempt and again in the notes"


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
    assert r.returncode == 2 and "pip install 'supervise-hpc[report]'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_the_agent_does_not_import_the_plotting_library() -> None:
    code = "import sys, supervisor.cli, supervisor.report; print('plotly' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


# ----------------------------------------------------------------------------- issue 16: the report tells the truth

def test_finished_with_the_newest_checkpoint_only_on_local_disk_is_not_finished() -> None:
    """HF-style checkpoints (no marker), the last written just before a clean exit: still settling."""
    f, _ = facts_of(GOLDEN / "local-only")
    end = [e for e in read_journal(GOLDEN / "local-only").events if e["kind"] == "end"][0]
    assert end["reason"] == "child-exit" and end["exit_status"] == 0 and end["not_durable"]
    assert f.verdict.status == "local-only" and f.verdict.local_only is not None
    lines = report("tests/report/golden/local-only").stdout.splitlines()
    assert lines[0].startswith("ONLY ON LOCAL DISK: ckpt: ckpt") and "-60 (incomplete: settling)" in lines[0]
    assert lines[1].startswith("NOT SAFE: the training finished") and "FINISHED" not in "\n".join(lines[:3])
    notes = " ".join(n.text for n in f.notes)
    assert "Left only on local disk" in notes and "completion marker" in notes
    assert "warn-before" not in notes, "no deadline was involved: the final flush was not short of time"
    # The exact steps that would be lost, from the names: the newest durable is -20, the newest local -60.
    assert f.goodput is not None and f.goodput.attempts[0].lost_steps == 40 and f.goodput.attempts[0].lost_steps_exact


def test_control_characters_are_escaped_in_the_text() -> None:
    """The checkpoints of local-only are named with ESC and BEL: shown as \\x1b, never sent."""
    raw = (GOLDEN / "local-only" / "events.jsonl").read_text()
    assert "\\u001b" in raw  # the journal holds them (JSON-escaped)
    out = report("tests/report/golden/local-only", env={"NO_COLOR": ""}).stdout
    assert "\x1b" not in out and "\x07" not in out
    assert "ckpt\\x1b[31m\\x07-60" in out


def test_a_rerun_is_not_a_requeue_and_a_scheduler_requeue_is() -> None:
    rerun, _ = facts_of(GOLDEN / "attempts")
    assert [a.came_by for a in rerun.attempts] == [None, "rerun", "rerun"]
    assert "requeued" not in report("tests/report/golden/attempts").stdout.splitlines()[0]
    slurm, _ = facts_of(GOLDEN / "slurm-requeued")
    assert [a.came_by for a in slurm.attempts] == [None, "requeue", "requeue", "requeue"]
    assert slurm.verdict.headline == "FINISHED · requeued 3 times · 4 attempts"


def test_margins_are_measured_to_the_hard_kill() -> None:
    """After Slurm's TERM (scontrol requeue: KillWait 5 s here) the margin is to KillWait, not the time limit."""
    f, _ = facts_of(GOLDEN / "slurm-requeued")
    stops = {e["attempt"]: e for e in read_journal(GOLDEN / "slurm-requeued").events if e["kind"] == "stop"}
    by_kill_wait = [s for s in f.stops if s.kill_by == "kill-wait"]
    assert len(by_kill_wait) == 2
    for s in by_kill_wait:
        assert stops[s.attempt]["time_left_s"] > 3600, "the time limit was hours away"
        assert s.margin_s is not None and 0 < s.margin_s < 5.0 == stops[s.attempt]["kill_wait_s"]
        assert s.margin_s == pytest.approx(stops[s.attempt]["kill_in_s"] - s.seconds, abs=0.002)
    for s in (s for s in f.stops if s.kill_by == "time-limit"):  # no job-wide TERM: the job's end is the kill
        assert stops[s.attempt]["kill_in_s"] == stops[s.attempt]["time_left_s"]
    assert sorted(s.kill_by or "" for s in f.stops) == ["kill-wait", "kill-wait", "time-limit", "time-limit"]
    local, _ = facts_of(GOLDEN / "local-only")  # no time limit, no scheduler: no hard kill known
    assert [(s.kill_by, s.margin_s) for s in local.stops] == [(None, None)]
    out = report("tests/report/golden/slurm-requeued").stdout
    assert out.count("left before the hard kill (KillWait after the scheduler's TERM)") == 2
    assert "11h59m" not in "".join(line for line in out.splitlines() if "hard kill" in line and "KillWait" in line)


def test_torchrun_exit_status_1_after_a_clean_stop_is_explained() -> None:
    f, _ = facts_of(GOLDEN / "slurm-requeued")
    assert [a.exit_status for a in f.attempts] == [1, 1, 1, 0]
    assert all(a.exit_note and "torchrun exits 1" in a.exit_note for a in f.attempts[:3])
    assert f.attempts[3].exit_note is None


def test_a_restore_counts_as_resumed_only_when_the_next_checkpoint_is_newer() -> None:
    f, _ = facts_of(GOLDEN / "from-scratch")
    restored = [r for r in f.checkpoints.restores if r.checkpoint]
    assert [r.outcome for r in restored] == ["not-resumed"]
    assert f.attempts[1].restore and f.attempts[1].restore.startswith(f"did NOT resume from {restored[0].checkpoint}")
    assert any(n.level == "bad" and "did NOT resume" in n.text for n in f.notes)
    out = report("tests/report/golden/from-scratch").stdout
    assert f"resumed from {restored[0].checkpoint}" not in out
    slurm, _ = facts_of(GOLDEN / "slurm-requeued")
    assert [r.outcome for r in slurm.checkpoints.restores] == ["none", "resumed", "resumed", "resumed"]


def test_every_version_of_a_rewritten_checkpoint_is_counted() -> None:
    f, _ = facts_of(GOLDEN / "rewritten")
    pubs = [e for e in read_journal(GOLDEN / "rewritten").events if e["kind"] == "publish" and not e.get("pointer")]
    assert {e["checkpoint"] for e in pubs} == {"model.pt"}
    assert f.checkpoints.published == 1 and f.checkpoints.versions == len(pubs) >= 15
    assert f"{len(pubs)} versions" in report("tests/report/golden/rewritten").stdout


def test_notes_name_the_cause_their_threshold_measures() -> None:
    """A settled checkpoint's lag is mostly the settle timer, not the copy: the note says so."""
    f, _ = facts_of(GOLDEN / "local-only")
    c = f.checkpoints
    assert c.settled >= 1 and c.copy_p95_s is not None and c.lag_p95_s is not None and c.copy_p95_s < c.lag_p95_s
    assert not any("copying one takes" in n.text for n in f.notes)
    attempts, _ = facts_of(GOLDEN / "attempts")  # a 1 s warning for a 2 s checkpoint: deadline, so --warn-before
    assert any("Raise --warn-before" in n.text for n in attempts.notes)


def test_goodput_in_json_per_attempt_and_for_the_job() -> None:
    js = json.loads(report("tests/report/golden/slurm-requeued", "--json").stdout)
    g = js["goodput"]
    events = read_journal(GOLDEN / "slurm-requeued").events
    starts = {e["attempt"]: e["t"] for e in events if e["kind"] == "start"}
    ends = {e["attempt"]: e["t"] for e in events if e["kind"] == "end"}
    assert g["wall_s"] == pytest.approx(ends[4] - starts[1], abs=0.002)
    assert g["queue_wait_s"] == pytest.approx(sum(starts[a + 1] - ends[a] for a in (1, 2, 3)), abs=0.002)
    assert g["productive_s"] == pytest.approx(sum(a["productive_s"] for a in g["attempts"]), abs=0.005)
    assert g["ettr"] == pytest.approx(g["productive_s"] / g["wall_s"], abs=1e-4)
    for a in g["attempts"]:
        assert a["wall_s"] == pytest.approx(ends[a["attempt"]] - starts[a["attempt"]], abs=0.002)
        assert 0 <= a["productive_s"] <= a["wall_s"] and a["first_step_by"] == "step rate"
        assert set(a) >= {"ettr", "lost_work_s", "lost_gpu_hours", "queue_wait_s"}
    assert g["gpus"] is None and g["lost_gpu_hours"] is None  # no GPU on this cluster: nothing invented
    # With GPUs (the finished golden: four sampled), lost GPU-hours = GPUs × (wall − productive).
    f, _ = facts_of(GOLDEN / "finished")
    assert f.goodput is not None and f.goodput.gpus == 4
    a = f.goodput.attempts[0]
    assert a.lost_gpu_hours == pytest.approx(4 * (a.wall_s - a.productive_s) / 3600, abs=1e-4)


def test_torn_sync_profile_and_refused_restores_are_shown_when_journaled(tmp_path: Path) -> None:
    """Events the checkpoint-completeness work (issue 12) adds: ``torn``, ``sync-profile`` and a
    restore refused (``checkpoint: null`` with a reason). Appended here, in the documented
    shape, to a copy of a real run; the report must show them and must not need them."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(GOLDEN / "from-scratch", run)
    events = read_journal(run).events
    t = events[-1]["t"]
    extra = [
        {"v": 1, "t": t + 1, "attempt": 3, "kind": "start", "host": "vm", "restart_count": 0},
        {"v": 1, "t": t + 1.1, "attempt": 3, "kind": "sync-profile", "pair": "ckpt", "profile": "hf-trainer",
         "evidence": "checkpoint-*/trainer_state.json", "writers": "unseen", "quiescence": True},
        {"v": 1, "t": t + 1.2, "attempt": 3, "kind": "restore", "pair": "ckpt", "checkpoint": None,
         "reason": "a newer local checkpoint: checkpoint-20"},
        {"v": 1, "t": t + 1.3, "attempt": 3, "kind": "spawn", "pid": 1, "argv": ["train"]},
        {"v": 1, "t": t + 3, "attempt": 3, "kind": "torn", "pair": "ckpt", "checkpoint": "checkpoint-30",
         "why": "the training exited while it was being written"},
        {"v": 1, "t": t + 3.1, "attempt": 3, "kind": "child-exit", "pid": 1, "exit_status": 1, "returncode": 1},
        {"v": 1, "t": t + 3.2, "attempt": 3, "kind": "end", "reason": "child-failed", "exit_status": 1,
         "seconds": 2.2, "restarts": 0, "not_durable": []},
    ]
    with open(run / "events.jsonl", "a") as f:
        for e in extra:
            f.write(json.dumps(e) + "\n")
    out = report(str(run))
    assert out.returncode == 0, out.stderr
    assert "restore, attempt 3: restore refused: a newer local checkpoint: checkpoint-20" in out.stdout
    assert "torn (the training died writing it; never published): attempt 3: ckpt: checkpoint-30" in out.stdout
    assert "completeness, attempt 3: ckpt: hf-trainer (checkpoint-*/trainer_state.json); writers unseen; waits for quiescence" \
        in out.stdout
    f, _ = facts_of(run)
    assert [r.outcome for r in f.checkpoints.restores] == ["none", "not-resumed", "refused"]
    # A restored checkpoint that a torn event names was not resumed from, whatever came after.
    with open(run / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"v": 1, "t": t + 4, "attempt": 4, "kind": "restore", "pair": "ckpt",
                             "checkpoint": "checkpoint-30", "seconds": 0.1}) + "\n")
    f, _ = facts_of(run)
    assert f.checkpoints.restores[-1].outcome == "not-resumed"
    assert "checkpoint-30: it is torn" in f.checkpoints.restores[-1].text
    assert any(n.level == "warn" and "restore refused" in n.text for n in f.notes)


def test_queue_wait_uses_the_scheduler_start_time_when_recorded(tmp_path: Path) -> None:
    """With ``SLURM_JOB_START_TIME`` in an attempt's scheduler environment, the queue wait ends
    there (the batch job's start), not at supervise's own start after the prolog."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(GOLDEN / "slurm-requeued", run)
    lines = (run / "events.jsonl").read_text().splitlines()
    events = [json.loads(x) for x in lines]
    end1 = next(e["t"] for e in events if e["kind"] == "end" and e["attempt"] == 1)
    start2 = next(e for e in events if e["kind"] == "start" and e["attempt"] == 2)
    began = int(end1) + 1
    assert end1 < began < start2["t"]
    start2["scheduler_env"]["SLURM_JOB_START_TIME"] = str(began)
    (run / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    f, _ = facts_of(run)
    assert f.goodput is not None
    assert f.goodput.attempts[1].queue_wait_s == pytest.approx(began - end1, abs=0.002)
    whole, _ = facts_of(GOLDEN / "slurm-requeued")
    assert whole.goodput is not None
    assert whole.goodput.attempts[1].queue_wait_s == pytest.approx(start2["t"] - end1, abs=0.002)
