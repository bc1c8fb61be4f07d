"""What counts as a complete checkpoint: the rules of docs/sync.md, on real directories."""

from __future__ import annotations

import os
import time
from pathlib import Path

from supervisor.sync._complete import Context, classify, natural_key, newest_complete
from supervisor.sync._writers import open_for_write
from tests.support.checkpoints import write_checkpoint


def judge(root: Path, **kw):
    kw.setdefault("settle", 5.0)
    return classify(root, now=time.time(), **kw)


def test_natural_order_puts_step_10_after_step_9():
    assert sorted(["step_10", "step_9", "step_100"], key=natural_key) == ["step_9", "step_10", "step_100"]


def test_dcp_metadata_marks_complete_and_lands_last(tmp_path):
    write_checkpoint(tmp_path, "step_001", style="dcp", size=10)
    (tmp_path / "step_002").mkdir()
    (tmp_path / "step_002" / "shard_0.bin").write_bytes(b"half")
    got = judge(tmp_path)
    assert got.entries["step_001"].complete and got.entries["step_001"].markers == (".metadata",)
    # a sibling showed a marker: a quiet directory without one is not complete, however old
    assert not got.entries["step_002"].complete
    assert got.entries["step_002"].why == "waiting for marker"


def test_orbax_commit_file_and_renamed_directory(tmp_path):
    (tmp_path / "100").mkdir()
    (tmp_path / "100" / "commit_success.txt").write_text("ok")
    (tmp_path / "200.orbax-checkpoint-tmp-17").mkdir()
    (tmp_path / "200.orbax-checkpoint-tmp-17" / "_CHECKPOINT_METADATA").write_text("{}")
    (tmp_path / "300").mkdir()
    (tmp_path / "300" / "_CHECKPOINT_METADATA").write_text("{}")
    got = judge(tmp_path)
    assert got.entries["100"].complete
    assert "200.orbax-checkpoint-tmp-17" not in got.entries  # work in progress is never a checkpoint
    assert got.entries["300"].complete and "Orbax" in got.entries["300"].why


def test_deepspeed_latest_governs_its_series(tmp_path):
    for k in (1, 2, 3):
        write_checkpoint(tmp_path, f"global_step{k}", style="quiet", size=10)
    (tmp_path / "latest").write_text("global_step2\n")
    got = judge(tmp_path, settle=0.0)
    assert got.entries["global_step1"].complete  # older than the pointer
    assert got.entries["global_step2"].complete and got.entries["global_step2"].why == "pointer latest"
    assert not got.entries["global_step3"].complete  # newer: being written
    assert got.pointers["latest"].target == "global_step2"
    assert "latest" not in got.entries
    assert newest_complete(got).name == "global_step2"


def test_megatron_tracker_names_iter_dir(tmp_path):
    write_checkpoint(tmp_path, "iter_0000100", style="quiet", size=10)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("100")
    got = judge(tmp_path)
    assert got.pointers["latest_checkpointed_iteration.txt"].target == "iter_0000100"
    assert got.entries["iter_0000100"].complete


def test_user_marker_glob(tmp_path):
    write_checkpoint(tmp_path, "step_001", style="user", size=10)
    write_checkpoint(tmp_path, "step_002", style="quiet", size=10)
    got = judge(tmp_path, markers=(".complete",), settle=0.0)
    assert got.entries["step_001"].complete
    assert not got.entries["step_002"].complete  # markers configured: quiescence never applies


def test_quiescence_without_any_marker(tmp_path):
    write_checkpoint(tmp_path, "step_001", style="quiet", size=10)
    fresh = judge(tmp_path, settle=60.0)
    assert not fresh.entries["step_001"].complete and fresh.entries["step_001"].ready_at is not None
    later = classify(tmp_path, settle=60.0, now=time.time() + 61)
    assert later.entries["step_001"].complete and later.entries["step_001"].why == "settled"


def test_single_file_closed_by_its_writer_is_complete_at_once_and_open_one_is_not(tmp_path):
    """Evidence, not clocks: the kernel says who holds a file open for writing."""
    (tmp_path / "model_1.pt").write_bytes(b"w" * 100)
    with open(tmp_path / "model_2.pt", "wb") as f:  # being written in place, by this process
        f.write(b"w" * 100)
        f.flush()
        writing = open_for_write({os.getpid()}, os.path.realpath(tmp_path))
        got = judge(tmp_path, settle=60.0, ctx=Context(writing=writing))
    assert got.entries["model_1.pt"].complete and got.entries["model_1.pt"].why == "closed by its writer"
    assert not got.entries["model_2.pt"].complete and "open by pid" in got.entries["model_2.pt"].why
    assert got.entries["model_2.pt"].ready_at is not None  # looked at again soon: a close is not a file event


def test_single_file_renamed_into_place_is_complete_when_the_writer_is_unseen(tmp_path):
    """No writer to ask (another node's file): a name whose inode changed was renamed into
    place; a name seen for the first time waits for quiescence."""
    (tmp_path / "model_1.pt").write_bytes(b"old")
    first = judge(tmp_path, settle=60.0)
    assert not first.entries["model_1.pt"].complete and first.entries["model_1.pt"].why == "settling"
    (tmp_path / "model_1.pt.tmp").write_bytes(b"w" * 100)
    os.replace(tmp_path / "model_1.pt.tmp", tmp_path / "model_1.pt")  # same clock tick is fine
    inodes = {n: sig[0] for n, sig in first.sigs.items()}
    got = judge(tmp_path, settle=60.0, ctx=Context(inodes=inodes))
    assert got.entries["model_1.pt"].complete and got.entries["model_1.pt"].why == "renamed into place"


def test_zip_cut_short_is_torn_and_never_complete(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "whole.pt", "w") as z:
        z.writestr("data.pkl", b"x" * 5000)
    data = (tmp_path / "whole.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    got = judge(tmp_path, ctx=Context(writing={}))
    assert got.entries["whole.pt"].complete
    assert not got.entries["cut.pt"].complete and got.entries["cut.pt"].torn


def test_after_the_training_exited_nothing_waits_and_a_dir_without_its_marker_is_torn(tmp_path):
    for n in (10, 20):
        d = tmp_path / f"checkpoint-{n}"
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"m")
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text("{}")
    (tmp_path / "training_args.bin").write_bytes(b"args")
    running = judge(tmp_path, settle=60.0, ctx=Context(writing={}))
    assert running.profile.name == "hf-trainer"
    assert running.entries["checkpoint-10"].complete
    assert running.entries["checkpoint-20"].why == "waiting for marker" and not running.entries["checkpoint-20"].torn
    done = judge(tmp_path, settle=60.0, ctx=Context(exited=True))
    assert done.entries["checkpoint-20"].torn and not done.entries["checkpoint-20"].complete
    assert done.entries["training_args.bin"].complete and not done.entries["training_args.bin"].restorable
    assert newest_complete(done).name == "checkpoint-10"  # never the stray file, never the torn one

def test_hidden_and_excluded_names_are_not_checkpoints(tmp_path):
    write_checkpoint(tmp_path, "step_001", style="dcp", size=10)
    (tmp_path / ".supervise-staging-step_002").mkdir()
    (tmp_path / "notes.lock").write_text("x")
    (tmp_path / "scratch").mkdir()
    got = judge(tmp_path, exclude=("scratch",))
    assert set(got.entries) == {"step_001"}


def test_reuse_skips_walking_an_unchanged_checkpoint_but_not_a_changed_one(tmp_path):
    write_checkpoint(tmp_path, "step_001", style="dcp", size=10)
    write_checkpoint(tmp_path, "step_002", style="dcp", size=10)
    first = judge(tmp_path)
    fake = first.entries["step_001"].snap.__class__({"made-up": (1, 1)}, 0, 1)
    reuse = {n: (first.sigs[n], fake) for n in ("step_001", "step_002")}
    time.sleep(0.02)
    (tmp_path / "step_002" / "extra.bin").write_bytes(b"new")  # touches step_002's directory
    again = judge(tmp_path, reuse=reuse)
    assert again.entries["step_001"].snap is fake  # unchanged top-level stat: not walked
    assert "extra.bin" in again.entries["step_002"].snap.files


def test_an_accelerate_save_cut_after_its_marker_is_torn_once_the_training_exited(tmp_path):
    """Accelerate's ``save_state`` writes ``random_states_<rank>.pkl`` (the marker), then one
    ``custom_checkpoint_<i>.pkl`` per registered object. A save killed between the two has its
    marker and lacks what the save before it had: once the training has exited nothing will
    write it, so it is torn, never complete (CI published such a ``checkpoint_4`` and the next
    attempt's ``load_state`` failed: "Found checkpoints: 0, Registered objects: 1")."""
    for n, files in ((3, ("model.safetensors", "optimizer.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl")),
                     (4, ("model.safetensors", "optimizer.bin", "random_states_0.pkl"))):
        d = tmp_path / f"checkpoint_{n}"
        d.mkdir()
        for f in files:
            (d / f).write_bytes(b"x")
    running = judge(tmp_path, ctx=Context(writing={}))
    assert running.profile.name == "accelerate"
    assert running.entries["checkpoint_3"].complete
    assert not running.entries["checkpoint_4"].complete and not running.entries["checkpoint_4"].torn
    assert "custom_checkpoint_" in running.entries["checkpoint_4"].why
    done = judge(tmp_path, ctx=Context(exited=True))
    assert done.entries["checkpoint_3"].complete
    assert done.entries["checkpoint_4"].torn and not done.entries["checkpoint_4"].complete, done.entries["checkpoint_4"]
    assert newest_complete(done).name == "checkpoint_3"
