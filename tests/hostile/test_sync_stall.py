"""Issue 42, 15: a persistent side that stops moving is journaled and notified while it hangs.

A hung persistent directory (or store) left no trace until its copier was killed or its
requests timed out (120 s each): a 20 s outage showed only as a 20 s ``lag_s`` afterwards.
Here a copy that hangs 16 s (a stand-in rsync that sleeps before it copies: a stuck NFS
server, as seen from supervise) is journaled ``sync-stalled`` about 10 s after the copier
started and ``sync-resumed`` when it moves again, each also a webhook notification. The
object store's case, with the real SeaweedFS stopped, is tests/store/test_store_stall.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.hostile._util import env_with, fake_tool, finish, kinds, trainer
from tests.support.supervise import start_supervise
from tests.support.webhook import Server

HANG_S = 16
# The first copy of a checkpoint hangs HANG_S seconds before it starts (it does no I/O meanwhile).
HANGING_RSYNC = f"""case "$*" in *--version*) exec {shutil.which("rsync") or "/usr/bin/rsync"} --version;; esac
if [ ! -e "$STALL_MARK" ]; then date +%s.%N > "$STALL_MARK"; sleep {HANG_S}; fi
exec {shutil.which("rsync") or "/usr/bin/rsync"} "$@"
"""


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not on PATH")
def test_a_hung_persistent_directory_is_journaled_and_notified_while_it_hangs(tmp_path: Path, tag: str,
                                                                               server: Server) -> None:
    run, local, persistent, mark = tmp_path / "run", tmp_path / "local", tmp_path / "persistent", tmp_path / "hung-at"
    fake_tool(tmp_path / "bin", "rsync", HANGING_RSYNC)
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persistent), "--sync-backend", "rsync",
                        "--notify", server.url("ok"),
                        "--", *trainer(local, "--every", "5", "--steps", "250", "--step-time", "0.1"),
                        env=env_with(tag, tmp_path / "bin", STALL_MARK=str(mark)))
    rc, _out, err = finish(p, 90)
    assert rc == 0, err
    stalled, resumed = kinds(run, "sync-stalled"), kinds(run, "sync-resumed")
    assert len(stalled) == 1 and len(resumed) == 1, (stalled, resumed)
    hung_at = float(mark.read_text())
    delay = stalled[0]["t"] - hung_at
    print(f"sync-stalled {delay:.1f} s after the copy hung; resumed after {resumed[0]['stalled_s']} s")
    assert 10 <= delay < 14, delay  # STALL_AFTER_S, and the watch looks once a second (more under load)
    assert stalled[0]["pair"] == resumed[0]["pair"] == local.name
    assert any(w.startswith("rsync to ") and str(persistent) in w for w in stalled[0]["in_flight"]), stalled[0]
    assert stalled[0]["stalled_s"] >= 10 and stalled[0]["after_s"] == 10
    assert HANG_S - 1 <= resumed[0]["stalled_s"] <= HANG_S + 3, resumed[0]
    assert resumed[0]["t"] > stalled[0]["t"]
    assert (persistent / "step_000005" / ".metadata").exists()  # and it landed, once moving again
    notified = [json.loads(r["body"]) for r in server.hits("ok")]
    by_event = {n["event"]: n for n in notified}
    assert {"sync-stalled", "sync-resumed"} <= set(by_event), [n["event"] for n in notified]
    assert by_event["sync-stalled"]["facts"]["pair"] == local.name
    assert by_event["sync-stalled"]["facts"]["in_flight"] == stalled[0]["in_flight"]


def test_a_pair_with_nothing_in_flight_is_never_stalled(tmp_path: Path, tag: str) -> None:
    """Idle is no stall: 15 s of a training that saves nothing, and every pass quick."""
    run, local = tmp_path / "run", tmp_path / "local"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(tmp_path / "persistent"),
                        "--sync-every", "1s", "--", sys.executable, "-c", "import time; time.sleep(15)",
                        env=env_with(tag))
    rc, _out, err = finish(p, 60)
    assert rc == 0, err
    assert not kinds(run, "sync-stalled")
