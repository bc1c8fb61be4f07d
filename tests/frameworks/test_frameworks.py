"""Every framework's checkpoints through the real ``supervise``: complete, durable, restorable.

Each case is a real library's training loop (tests/frameworks/trainers/) with its default
checkpointing; nothing about it is configured in ``supervise`` beyond ``--checkpoints LOCAL
PERSISTENT`` and ``--restore``. A poller loads every checkpoint that becomes visible on the
persistent side with the library's own loader, every 50 ms: a single failure is a torn
sighting. Issue 12.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.frameworks._harness import CASES, OFFLINE, ROOT, TRAINERS, Run

ALL = sorted(CASES)
# The layouts of libraries not installed are edge cases of the engine's pointer and rename rules:
# the pause test runs them all, the preemption only the pointer-with-a-stray-script one.
PREEMPTED = [c for c in ALL if not c.endswith(("-layout", "-marker"))] + ["deepspeed-layout"]
# Lightning writes a .ckpt the same way whatever save_last says: one of the two is enough here.
# Accelerate writes no marker: its first save of a run is complete once no rank is inside
# save_state (the training's Python stack), later saves once they have the previous one's files.
PAUSED = [c for c in ALL if c != "lightning-copy"]
# The long set (SUPERVISE_LONG=1, by hand; about 9 min more): a second variant of a writer CI
# already runs for the same profile (ZeRO-0 beside ZeRO-1, Lightning's copy beside its link,
# torch.save in place beside replace, a layout beside its real library). They kept .ci/run under
# 30 minutes on two cores (stop 28).
LONG_PREEMPTED = {"deepspeed-zero0", "lightning-copy", "torch-save-inplace", "deepspeed-layout"}
LONG_PAUSED = {"deepspeed-zero0", "deepspeed-layout", "orbax-layout", "torch-save-replace"}
LONG = pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")


def cases(ids: list[str], long: set[str]) -> list:
    return [pytest.param(c, marks=LONG) if c in long else c for c in ids]


def not_durable_of(run: Run, end: dict) -> list[str]:
    """The end event's ``not_durable`` lines (the run has this one pair), but for a checkpoint
    the training was killed in the middle of, which is rightly listed as torn."""
    return [line for line in end.get("not_durable") or [] if "torn" not in line]


def name_of(run: Run, step: int) -> str:
    """The persistent name a case gives to step ``step``'s checkpoint (single-file cases: the file)."""
    return {"hf": f"checkpoint-{step}", "dcp": f"step_{step:05d}", "lightning-copy": f"step={step}.ckpt",
            "lightning-link": f"step={step}.ckpt", "torch-save-inplace": "snapshot.pt",
            "torch-save-replace": "snapshot.pt", "deepspeed-layout": f"global_step{step}",
            "deepspeed-zero0": f"global_step{step}", "deepspeed-zero1": f"global_step{step}", "orbax": str(step),
            "megatron-layout": f"iter_{step:07d}", "orbax-layout": str(step),
            "generic-marker": f"ckpt_{step}"}.get(run.case.id, "")


@pytest.mark.parametrize("case_id", cases(PREEMPTED, LONG_PREEMPTED))
def test_preempted_run_resumes_on_an_empty_disk_at_the_newest_durable_step(open_run, case_id):
    run, poller = open_run(case_id)
    a1 = run.start(steps=400, save_every=5, step_sleep=0.05)
    run.preempt(a1, at_step=17)  # saves at 5, 10, 15 are done; 20 is not
    saved = a1.saved()
    assert saved[:3] == [5, 10, 15], saved
    # Every save the training finished before it was stopped is durable (the tree has exited:
    # nothing can change any more, no settle to wait out).
    # A save the library finished while the trainer was being stopped may lack the trainer's own
    # "saved" line (DeepSpeed under load: global_step25 whole and durable, the line never written):
    # at most that one more, never one fewer.
    durable = run.durable()
    assert durable and durable[-1] in (saved[-1], saved[-1] + 5), \
        (durable, saved, run.loaded(), run.stderr(a1))
    newest = durable[-1]
    assert not_durable_of(run, run.end(a1)) == [], run.end(a1)
    # supervise recognised the framework, and saw the writer
    profiles = run.events(a1, "sync-profile")
    assert profiles, f"no sync-profile event:\n{run.stderr(a1)}"
    assert profiles[-1]["profile"] == run.case.profile, profiles
    assert profiles[-1]["writers"] == "visible" and profiles[-1]["quiescence"] is False, profiles

    run.wipe_local()  # the requeued attempt lands on another node
    a2 = run.run(steps=newest + 10, save_every=5)
    assert a2.rc == 0, run.stderr(a2)
    start = a2.start_step()
    assert start is not None and start["step"] == newest, (start, run.stderr(a2))
    assert start["restored"] and Path(start["restored"]).resolve().is_relative_to(run.local.resolve()), start
    (restore,) = run.events(a2, "restore")
    assert restore["checkpoint"], restore
    # the final checkpoint of the finished run is durable when supervise exits
    assert run.durable()[-1] == newest + 10, (run.loaded(), run.stderr(a2))
    assert not_durable_of(run, run.end(a2)) == [], run.end(a2)
    assert poller.torn() == [], poller.torn()
    assert {s["name"] for s in poller.sightings()} >= {name_of(run, newest)} - {""}


@pytest.mark.parametrize("case_id", cases(PAUSED, LONG_PAUSED))
def test_a_pause_inside_a_save_longer_than_settle_is_never_published_torn(open_run, case_id):
    """The save stops halfway for longer than ``settle`` (a ZeRO/FSDP optimizer gather, a slow
    disk): model files on disk, the framework's last file not yet. Never published like that."""
    run, poller = open_run(case_id)
    a = run.run(steps=10, save_every=5, save_pause=1.2, settle="0.3s")
    assert a.rc == 0, run.stderr(a)
    assert a.saved() == [5, 10]
    assert poller.torn() == [], poller.torn()
    assert run.events(a, "torn") == []
    loaded = run.loaded()
    assert all(isinstance(v, int) for v in loaded.values()), loaded
    assert run.durable()[-1] == 10, loaded
    assert not_durable_of(run, run.end(a)) == [], run.end(a)
    profiles = run.events(a, "sync-profile")  # generic with the user's --marker: not quiescence either
    assert profiles and profiles[-1]["profile"] == run.case.profile, profiles
    assert profiles[-1]["writers"] == "visible" and profiles[-1]["quiescence"] is False, profiles


def test_hf_restore_never_picks_a_stray_file(open_run):
    """``save_model()`` and ``save_state()`` put ``training_args.bin``, ``model.safetensors`` and
    ``trainer_state.json`` beside ``checkpoint-N/``: none of them is a checkpoint."""
    run, poller = open_run("hf")
    a1 = run.run(steps=10, save_every=5, trainer_args=("--save-model-at-end", "1"))
    assert a1.rc == 0, run.stderr(a1)
    assert (run.local / "training_args.bin").exists() and (run.local / "trainer_state.json").exists()
    run.wipe_local()
    a2 = run.run(steps=15, save_every=5)
    assert a2.rc == 0, run.stderr(a2)
    (restore,) = run.events(a2, "restore")
    assert restore["checkpoint"] == "checkpoint-10", restore
    assert a2.start_step()["step"] == 10, a2.start_step()
    assert Path(a2.start_step()["restored"]).name == "checkpoint-10"
    assert poller.torn() == []


def test_hf_training_dead_in_the_middle_of_a_save_is_journaled_torn_and_never_published(open_run):
    """The training dies between the model files and ``trainer_state.json``: once its tree has
    exited nothing can complete that checkpoint, so it is ``torn``, and the requeue resumes
    from the one before it instead of crashing on a checkpoint without its state."""
    run, poller = open_run("hf")
    a1 = run.run(steps=15, save_every=5, save_pause=0.5, trainer_args=("--die-in-save", "10"))
    assert a1.rc not in (0, None), run.stderr(a1)
    assert run.durable() == [5], run.loaded()
    assert not (run.persistent / "checkpoint-10").exists()
    torn = run.events(a1, "torn")
    assert [t["checkpoint"] for t in torn] == ["checkpoint-10"], torn
    run.wipe_local()
    a2 = run.run(steps=15, save_every=5)
    assert a2.rc == 0, run.stderr(a2)
    assert a2.start_step()["step"] == 5
    assert run.durable()[-1] == 15
    assert poller.torn() == []


def _train_outside_supervise(run: Run, steps: int) -> None:
    """Go on training on the node without supervise: a newer checkpoint only on local disk."""
    argv = run.argv(99, steps=steps, save_every=5)
    train = argv[argv.index("--") + 1:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISE_")}
    subprocess.run(train, check=True, env={**env, **OFFLINE}, capture_output=True, timeout=120)


@pytest.mark.parametrize("case_id", cases(["torch-save-inplace", "lightning-copy"], {"lightning-copy"}))
def test_restore_never_overwrites_a_newer_local_checkpoint(open_run, case_id):
    """A Slurm requeue keeps the node and its /tmp: local ``snapshot.pt`` (``last.ckpt``) is at
    step 15, the persistent one at 10. Restore keeps the local one and publishes it."""
    run, poller = open_run(case_id)
    a1 = run.run(steps=10, save_every=5)
    assert a1.rc == 0 and run.durable()[-1] == 10, run.stderr(a1)
    _train_outside_supervise(run, 15)
    a2 = run.run(steps=20, save_every=5)
    assert a2.rc == 0, run.stderr(a2)
    assert a2.start_step()["step"] == 15, (a2.start_step(), run.events(a2, "restore"))
    assert 15 in {s.get("step") for s in poller.sightings()}, "the newer local checkpoint was not published"
    assert run.durable()[-1] == 20
    assert poller.torn() == []


def test_lightning_restore_never_follows_a_link_out_of_the_pair(open_run, tmp_path):
    """A ``last.ckpt`` on the persistent side that points outside it is not restored through:
    the checkpoint it leads to (step 5's, elsewhere) never reaches the node."""
    run, poller = open_run("lightning-link")
    a1 = run.run(steps=10, save_every=5)
    assert a1.rc == 0, run.stderr(a1)
    assert os.readlink(run.persistent / "last.ckpt") == "step=10.ckpt"  # relative, as Lightning made it
    poller.stop()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(run.persistent / "step=5.ckpt", elsewhere / "secret.ckpt")
    os.remove(run.persistent / "last.ckpt")
    os.symlink(os.path.relpath(elsewhere / "secret.ckpt", run.persistent), run.persistent / "last.ckpt")
    run.wipe_local()
    a2 = run.run(steps=15, save_every=5)
    assert a2.rc == 0, run.stderr(a2)
    (restore,) = run.events(a2, "restore")
    assert restore["checkpoint"] == "step=10.ckpt", restore  # the newest inside the pair
    assert a2.start_step()["step"] != 5, "resumed from the checkpoint outside the pair"
    for dirpath, dirs, files in os.walk(run.local):
        for n in dirs + files:
            p = Path(dirpath) / n
            assert p.resolve().is_relative_to(run.local.resolve()), f"{p} leads out of the pair: {os.readlink(p)}"


def test_exclude_that_hides_the_profile_marker_is_a_usage_error(tmp_path):
    """gitignore-style ``exclude``: ``trainer_state.json`` (any depth) would hide HF's marker."""
    cfg = tmp_path / "job.toml"
    cfg.write_text(f"""
[[sync]]
kind = "checkpoint"
from = "{tmp_path / 'local'}"
to = "{tmp_path / 'persistent'}"
profile = "hf-trainer"
exclude = ["trainer_state.json"]
""")
    p = subprocess.run([sys.executable, "-m", "supervisor", "--config", str(cfg), "--run-dir", str(tmp_path / "run"),
                        "--gpu-every", "0", "--", "true"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "trainer_state.json" in p.stderr, p.stderr


def test_hf_exclude_anchored_at_the_root_keeps_the_marker(open_run, tmp_path):
    """``/*.json`` is the top level only: HF's ``trainer_state.json`` inside ``checkpoint-N/`` stays."""
    run, poller = open_run("hf")
    cfg = tmp_path / "job.toml"
    cfg.write_text(f"""
[[sync]]
kind = "checkpoint"
from = "{run.local}"
to = "{run.persistent}"
exclude = ["/*.json"]
""")
    argv = run.argv(1, steps=10, save_every=5, restore=False, trainer_args=("--save-model-at-end", "1"))
    i = argv.index("--checkpoints")
    argv[i:i + 3] = ["--config", str(cfg)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **OFFLINE}, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert run.durable() == [5, 10], run.loaded()
    assert not (run.persistent / "trainer_state.json").exists()
    assert poller.torn() == []


assert TRAINERS.is_dir()
