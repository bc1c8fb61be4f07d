"""A fresh run of the real agent: reported while it runs, then after a preemption."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from supervisor.journal import read_journal
from tests.support.paths import HELPERS, ROOT
from tests.support.supervise import start_supervise
from tests.support.wait import wait_for

TRAINER = [sys.executable, str(HELPERS / "trainer.py")]


def _report_json(run: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run), "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _published(run: Path) -> list[str]:
    return [e["checkpoint"] for e in read_journal(run).events if e["kind"] == "publish" and not e.get("pointer")]


def test_report_while_running_then_after_preemption(tmp_path: Path) -> None:
    run, local, persist = tmp_path / "run", tmp_path / "local", tmp_path / "persist"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--time-limit", "1h",
                        "--warn-before", "1m", "--gpu-every", "0.2s", "--grace", "5s", "--",
                        *TRAINER, str(local), "--every", "10")
    try:
        wait_for(lambda: len(_published(run)) >= 2, timeout=30, what="two durable checkpoints")
        live = _report_json(run)
        assert live["verdict"]["status"] == "running"
        assert live["attempts"][0]["reason"] is None and live["stops"] == []
        assert live["checkpoints"]["published"] >= 2
        text = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60).stdout
        assert text.startswith("RUNNING") and "only on local disk: unknown until the attempt ends" in text
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    done = _report_json(run)
    assert done["verdict"]["status"] == "stopped" and done["attempts"][0]["reason"] == "preempted"
    stop = done["stops"][0]
    assert stop["reason"] == "preempted" and stop["steps"][0]["step"] == "checkpoint"
    assert stop["steps"][0]["outcome"].startswith("published")
    newest = (persist / "latest").read_text()
    assert done["checkpoints"]["last"]["name"] == newest  # the report's last durable one is on disk, whole
    assert (persist / newest / ".metadata").exists()
    assert done["checkpoints"]["not_durable"] == []
    assert done["host"]["samples"] > 0 and done["gpus"] == []
    assert any("resubmit with the same --run-dir" in n["text"] for n in done["notes"])
