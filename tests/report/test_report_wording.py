"""What ``supervise report`` says about restores and checkpoint completeness, on run directories
the real supervise made (issue 22, item 8; the scancel label: tests/slurm/test_issue22_slurm.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import HELPERS, ROOT
from tests.support.supervise import run_supervise, supervise_argv

TRAINER = [sys.executable, str(HELPERS / "trainer.py")]
HF_LIKE = [sys.executable, str(ROOT / "tests" / "report" / "hf_like.py")]


def _report(run: Path) -> str:
    keep = {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}  # a worktree's checkout, not the installed one
    r = subprocess.run(supervise_argv("report", str(run)), capture_output=True, text=True, timeout=60,
                       env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin", **keep})
    assert r.returncode == 0, r.stderr
    return r.stdout


def _two_attempts(tmp_path: Path, train: list[str], settle: str = "0.3s") -> Path:
    local, persist, run = tmp_path / "local", tmp_path / "persist", tmp_path / "run"
    cfg = tmp_path / "sync.toml"
    cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{local}"\nto = "{persist}"\nrestore = true\nsettle = "{settle}"\n')
    for attempt in (1, 2):
        r = run_supervise("--config", str(cfg), "--run-dir", str(run), "--gpu-every", "0", "--", *train, str(local),
                          *(["--rewrite", "--steps", "6", "--every", "1", "--step-time", "0.6", "--linger", "1.5"]
                            if train == HF_LIKE else ["--steps", str(20 + 20 * attempt), "--every", "10"]), timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        shutil.rmtree(local)  # a new node: the restore brings the checkpoint back
    return run


def test_a_file_rewritten_in_place_counts_its_newer_versions(tmp_path: Path) -> None:
    text = _report(_two_attempts(tmp_path, HF_LIKE))
    restore = [line for line in text.splitlines() if "restore, attempt 2" in line]
    assert restore and "restored model.pt" in restore[0], text
    assert "no newer checkpoint" not in restore[0] and "newer version" in restore[0], restore[0]
    # The completeness line says which attempts it is about, once.
    completeness = [line for line in text.splitlines() if "completeness" in line]
    assert completeness == [c for c in completeness if "attempts 1–2:" in c] and len(completeness) == 1, completeness


def test_a_verified_resume_says_it_is_verified_and_how(tmp_path: Path) -> None:
    text = _report(_two_attempts(tmp_path, TRAINER))
    restore = next(line for line in text.splitlines() if "restore, attempt 2" in line)
    assert "resumed from step_000040" in restore and "verified" in restore, restore
    assert "is newer)" not in restore, restore


HF_WITH_FILES_BESIDE = """
import json, os, sys, time
out = sys.argv[1]
for step in (10, 20):
    d = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(d)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(b"w" * 4096)
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step}, f)
    time.sleep(0.5)
# Trainer.save_model at the end: the model's files and the run's arguments beside the checkpoints
for name in ("training_args.bin", "config.json", "README.md"):
    with open(os.path.join(out, name), "w") as f:
        f.write(name)
time.sleep(0.5)
"""


def test_files_beside_the_checkpoints_are_never_called_checkpoints(tmp_path: Path) -> None:
    """Issue 30, 2 and 6: an HF run's report said "last durable: training_args.bin", and counted
    the files Trainer writes beside its checkpoints (training_args.bin, config.json, a README)
    as checkpoints. They are mirrored as plain files; the report names checkpoint-20."""
    local, persist, run = tmp_path / "local", tmp_path / "persist", tmp_path / "run"
    local.mkdir()
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persist), "--gpu-every", "0",
                      "--", sys.executable, "-c", HF_WITH_FILES_BESIDE, str(local), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (persist / "training_args.bin").read_text() == "training_args.bin"
    text = _report(run)
    last = [line for line in text.splitlines() if "last durable:" in line]
    assert last and "checkpoint-20" in last[0], text
    assert not any(name in text for name in ("training_args.bin", "config.json", "README.md")), text
    assert "checkpoints: 2 durable, last checkpoint-20" in text, text


def _planted(run: Path, not_durable: list[str], steps: dict[str, str]) -> Path:
    """A one-attempt journal whose end left ``not_durable``, its stop steps' outcomes as given."""
    import json

    t0 = 1_800_000_000.0
    evs = [{"kind": "start", "host": "vm", "scheduler": "local", "nodes": ["vm"]},
           {"kind": "sync-start", "backend": "rsync", "pairs": [{"name": "ckpt", "kind": "checkpoint"}]},
           {"kind": "spawn", "pid": 10, "argv": ["python", "train.py"]},
           {"kind": "publish", "pair": "ckpt", "checkpoint": "model.pt", "files": 1, "bytes": 10, "why": "closed by its writer",
            "lag_s": 0.2},
           {"kind": "child-exit", "pid": 10, "exit_status": 0, "returncode": 0},
           {"kind": "stop", "reason": "child-exit", "detail": "exit status 0", "signal": None}]
    evs += [{"kind": "stop-step", "step": step, "outcome": outcome, "seconds": 1.0} for step, outcome in steps.items()]
    evs.append({"kind": "end", "reason": "child-exit", "exit_status": 0, "launcher_status": 0, "seconds": 60.0,
                "not_durable": not_durable})
    run.mkdir()
    (run / "events.jsonl").write_text("".join(json.dumps({"v": 1, "t": t0 + i, "attempt": 1, **e}) + "\n"
                                              for i, e in enumerate(evs)))
    return run


def test_the_advice_for_what_was_left_on_local_disk_matches_its_cause(tmp_path: Path) -> None:
    """Issue 30, 6: a complete file whose newest version was simply not copied again before the
    end (the flush ran out of time) got "write a completion marker last": its cause is time.
    The marker advice is for what was not complete; a failed copy and another run's name
    get their own."""
    cases = {
        "complete": (["ckpt: model.pt (complete, not yet on persistent storage)"], {"flush": "timeout"},
                     "not yet copied", "marker"),
        "incomplete": (["ckpt: step_9 (incomplete: settling)"], {"flush": "done"}, "marker", None),
        "failed": (["ckpt: model.pt (complete, not yet on persistent storage)", "ckpt: last sync failed (rsync exit 11)"],
                   {"flush": "done"}, "copy failed", "marker"),
    }
    for name, (lines, steps, said, unsaid) in cases.items():
        text = _report(_planted(tmp_path / name, lines, steps))
        notes = " ".join(text.split("\nNotes", 1)[1].split())  # the notes unwrapped, one after another
        assert "Left only on local disk" in notes, (name, text)
        advice = re.split(r" [✗!·] ", notes.split("Left only on local disk", 1)[1])[0].lower()
        assert said in advice, (name, text)
        assert unsaid is None or unsaid not in advice, (name, advice)
