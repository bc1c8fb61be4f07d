"""Pointers and links this run published are its own whatever they turn into; pointers it never
published (another run's ``latest``) are refused like checkpoints. (Issue 22, items 2 and 9.)"""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

from tests.support.journal import events
from tests.support.supervise import killed_on_exit, run_supervise, start_supervise
from tests.support.wait import wait_for


def test_another_runs_pointer_is_never_replaced(tmp_path: Path) -> None:
    persistent, local, run = tmp_path / "persistent", tmp_path / "local", tmp_path / "run"
    persistent.mkdir()
    (persistent / "latest").write_text("step_000007")  # another run's, sharing the directory
    (local / "step_000001").mkdir(parents=True)
    (local / "step_000001" / "model.bin").write_bytes(b"ours")
    (local / "step_000001" / ".metadata").write_text("ours")
    (local / "latest").write_text("step_000001")
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persistent), "--gpu-every", "0",
                      "--", sys.executable, "-c", "pass")
    assert r.returncode == 74, r.stderr  # our pointer is not durable (end.not_durable): not 0
    assert (persistent / "step_000001" / ".metadata").read_text() == "ours", "our checkpoint is published"
    assert (persistent / "latest").read_text() == "step_000007", "another run's pointer was replaced"
    refused = events(run, "sync-refused")
    assert [(e["checkpoint"], e["what"]) for e in refused] == [("latest", "pointer")]
    assert any(line.startswith("local: latest (refused") for line in events(run, "end")[0]["not_durable"])


# Lightning's ModelCheckpoint(save_last="link") keeps last.ckpt a link to the newest
# epoch=…-step=….ckpt; a callback answering supervise's request with
# trainer.save_checkpoint(dir / "last.ckpt") turns it into a regular checkpoint file.
LIGHTNING_LIKE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from supervisor import training
    training.install_stop_handler()
    d = Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True)
    step = 0
    while not training.stop_requested():
        time.sleep(0.05)
        step += 1
        if step == 20 or step % 2000 == 0:  # an epoch is long: the request is answered by last.ckpt alone
            name = f"epoch=0-step={step}.ckpt"
            (d / name).write_bytes(step.to_bytes(8, "little") * 512)
            tmp = d / ".last.tmp"
            os.symlink(name, tmp)
            os.replace(tmp, d / "last.ckpt")
        if training.checkpoint_requested():
            if (d / "last.ckpt").is_symlink():
                os.unlink(d / "last.ckpt")
            (d / "last.ckpt").write_bytes(b"requested" + step.to_bytes(8, "little") * 512)
            print("requested", step, flush=True)
            training.acknowledge()
""")


def test_a_link_this_run_published_may_become_a_checkpoint(tmp_path: Path) -> None:
    persistent, local, run = tmp_path / "persistent", tmp_path / "local", tmp_path / "run"
    script = tmp_path / "lightning_like.py"
    script.write_text(LIGHTNING_LIKE)
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persistent), "--gpu-every", "0",
                        "--checkpoint-timeout", "8s", "--grace", "5s", "--", sys.executable, str(script), str(local))
    with killed_on_exit(p):
        wait_for(lambda: (persistent / "last.ckpt").is_symlink(), timeout=60, what="the last.ckpt link published")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert "requested" in out, (out, err)
    ck = next(e for e in events(run, "stop-step") if e["step"] == "checkpoint")
    assert ck["outcome"] == "published" and ck["answer"] == "last.ckpt", ck
    assert not events(run, "sync-refused")
    # Published as the checkpoint it became (the training may link it again afterwards).
    assert [e for e in events(run, "publish") if e["checkpoint"] == "last.ckpt" and not e.get("pointer")]
    assert events(run, "end")[0]["not_durable"] == []
