"""Completeness from evidence, end to end through the real `supervise` (issue 12).

The writers here are small stand-ins for edge cases (a save paused longer than `settle`, a
training that dies mid-save, a link out of the pair); tests/frameworks/ proves the same
promises with the real libraries writing the files.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from supervisor.policy import owed
from tests.support.journal import events
from tests.support.supervise import run_supervise, start_supervise
from tests.support.wait import wait_for


def zip_bytes(tag: str, size: int = 20000) -> bytes:
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("data.pkl", (tag * (size // len(tag) + 1))[:size])
    return buf.getvalue()


def script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "train.py"
    path.write_text("import os, sys, time, json, zipfile, io\nfrom pathlib import Path\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_final_checkpoints_are_durable_when_the_training_exits_whatever_settle_says(tmp_path, run_dir):
    """A file rewritten in place every epoch and a marker-less directory written last: once
    the training's tree is gone nothing can change, so the final flush publishes both at once."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    cmd = script(tmp_path, f"""
        local = Path({str(local)!r}); local.mkdir(exist_ok=True)
        for epoch in range(4):
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as z:
                z.writestr("epoch", str(epoch) * 5000)
            (local / "snapshot.pt").write_bytes(buf.getvalue())
            time.sleep(0.2)
        (local / "final").mkdir()
        (local / "final" / "weights.bin").write_bytes(b"w" * 1000)
    """)
    r = run_supervise("--run-dir", str(run_dir), "--checkpoints", str(local), str(persist), "--settle", "60",
                      "--gpu-every", "0", "--", *cmd, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (persist / "snapshot.pt").read_bytes() == (local / "snapshot.pt").read_bytes()
    assert (persist / "final" / "weights.bin").read_bytes() == b"w" * 1000
    end = events(run_dir, "end")[-1]
    assert end["not_durable"] == [], end
    whys = {e["checkpoint"]: e["why"] for e in events(run_dir, "publish")}
    assert whys["final"] == "training exited"


def test_a_file_held_open_is_never_published_and_lands_within_a_second_of_its_close(tmp_path, run_dir):
    """torch.save in place with a pause longer than settle inside the write: quiescence
    would publish half a file; the open descriptor says it is still being written."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    full = zip_bytes("model")
    (tmp_path / "full.bin").write_bytes(full)
    cmd = script(tmp_path, f"""
        local = Path({str(local)!r}); local.mkdir(exist_ok=True)
        data = Path({str(tmp_path / 'full.bin')!r}).read_bytes()
        with open(local / "model_1.pt", "wb") as f:
            f.write(data[: len(data) // 2]); f.flush()
            time.sleep(2.5)  # settle is 1 s
            f.write(data[len(data) // 2 :])
        Path({str(tmp_path / 'closed')!r}).write_text(repr(time.time()))
        time.sleep(4)
    """)
    p = start_supervise("--run-dir", str(run_dir), "--checkpoints", str(local), str(persist), "--settle", "1",
                        "--gpu-every", "0", "--", *cmd)
    try:
        seen_torn = 0
        closed = tmp_path / "closed"
        while not closed.exists() and p.poll() is None:
            target = persist / "model_1.pt"
            if target.exists() and target.read_bytes() != full:
                seen_torn += 1
            time.sleep(0.05)
        landed = wait_for(lambda: (persist / "model_1.pt").exists() and time.time(), timeout=10,
                          what="model_1.pt on persistent storage")
        lag = landed - float(closed.read_text())
        assert seen_torn == 0
        assert (persist / "model_1.pt").read_bytes() == full
        assert lag < 1.0, f"published {lag:.2f} s after its writer closed it"
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.communicate()
    publish = [e for e in events(run_dir, "publish") if e["checkpoint"] == "model_1.pt"]
    assert publish[0]["why"] == "closed by its writer"


def test_a_checkpoint_the_training_died_in_is_journaled_torn_and_never_published(tmp_path, run_dir):
    """HF Trainer's layout: model files first, trainer_state.json last. The training crashes
    between them: checkpoint-20 is torn, whatever settle says; checkpoint-10 is durable."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    cmd = script(tmp_path, f"""
        local = Path({str(local)!r})
        for step in (10, 20):
            d = local / f"checkpoint-{{step}}"; d.mkdir(parents=True)
            (d / "model.safetensors").write_bytes(b"m" * 1000)
            if step == 20:
                time.sleep(1.5)  # longer than settle: quiet, yet not done
                sys.exit(3)
            (d / "trainer_state.json").write_text(json.dumps({{"global_step": step}}))
    """)
    r = run_supervise("--run-dir", str(run_dir), "--checkpoints", str(local), str(persist), "--settle", "0.5",
                      "--gpu-every", "0", "--", *cmd, timeout=60)
    assert r.returncode == 3, r.stderr
    assert (persist / "checkpoint-10" / "trainer_state.json").exists()
    assert not (persist / "checkpoint-20").exists()
    torn = events(run_dir, "torn")
    assert [e["checkpoint"] for e in torn] == ["checkpoint-20"] and "trainer_state.json" in torn[0]["why"]
    assert any("checkpoint-20 (torn" in line for line in events(run_dir, "end")[-1]["not_durable"])
    assert "checkpoint-20 is torn" in r.stderr
    prof = events(run_dir, "sync-profile")[0]
    assert prof["profile"] == "hf-trainer" and prof["writers"] == "visible" and prof["quiescence"] is False


def _hf_checkpoint(root: Path, step: int, *, marker: bool = True) -> None:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"m" * 100)
    if marker:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def _restored_from(tmp_path: Path, run_dir: Path, local: Path, persist: Path) -> tuple[str, object]:
    out = tmp_path / "restored.txt"
    cmd = [sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(os.environ.get('SUPERVISE_RESTORED_FROM', ''))"]
    r = run_supervise("--run-dir", str(run_dir), "--checkpoints", str(local), str(persist), "--restore",
                      "--gpu-every", "0", "--", *cmd, timeout=60)
    # 74 when something stays off persistent storage (a planted pointer this run may not replace)
    assert r.returncode == (74 if owed(events(run_dir, "end")[-1]["not_durable"]) else 0), r.stderr
    return out.read_text(), r


def test_a_pointer_the_training_died_writing_is_torn_and_does_not_fail_the_run(tmp_path, run_dir):
    """DeepSpeed writes ``latest`` with ``open(path, "w")``: truncated first, the name written at
    close. A rank killed between the two (CI: SIGTERM at a preemption, under load) leaves it
    empty. Nothing of it can be made durable: it is torn, like a checkpoint the training died in,
    and the run exits with the training's status, not 74 (before: "latest (pointer to a
    missing checkpoint)", owed)."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    cmd = script(tmp_path, f"""
        local = Path({str(local)!r})
        for step in (10, 20):
            d = local / f"global_step{{step}}"; d.mkdir(parents=True)
            (d / "mp_rank_00_model_states.pt").write_bytes(b"m" * 1000)
            if step == 10:
                (local / "latest").write_text(d.name)
                for _ in range(600):  # until supervise published it (bounded: 60 s)
                    if (Path({str(persist)!r}) / "latest").exists():
                        break
                    time.sleep(0.1)
        open(local / "latest", "w").close()  # the truncate, and no name: the rank died here
    """)
    r = run_supervise("--run-dir", str(run_dir), "--checkpoints", str(local), str(persist), "--settle", "0.5",
                      "--gpu-every", "0", "--", *cmd, timeout=60)
    end = events(run_dir, "end")[-1]
    assert r.returncode == 0, (r.stderr, end)
    assert (persist / "latest").read_text() == "global_step10"
    assert (persist / "global_step10" / "mp_rank_00_model_states.pt").exists()
    assert any(line.endswith(": latest (torn: empty; never published)") for line in end["not_durable"]), end
    assert not owed(end["not_durable"]), end


def test_restore_takes_the_newest_complete_checkpoint_never_a_stray_or_torn_one(tmp_path, run_dir):
    local, persist = tmp_path / "local", tmp_path / "persist"
    _hf_checkpoint(persist, 10)
    _hf_checkpoint(persist, 9)
    _hf_checkpoint(persist, 30, marker=False)  # torn: never restored
    time.sleep(0.01)
    (persist / "training_args.bin").write_bytes(b"args")  # newest name and mtime, not a checkpoint
    got, _ = _restored_from(tmp_path, run_dir, local, persist)
    assert got == str(local / "checkpoint-10")
    assert (local / "checkpoint-10" / "trainer_state.json").exists()
    ev = events(run_dir, "restore")[-1]
    assert ev["checkpoint"] == "checkpoint-10" and ev["step"] == 10 and ev["torn"] == ["checkpoint-30"]


def test_restore_never_overwrites_a_newer_local_checkpoint_and_publishes_it(tmp_path, run_dir):
    """A requeue onto the same node keeps node-local disk: the newer local work wins."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    _hf_checkpoint(persist, 10)
    _hf_checkpoint(local, 40)
    got, r = _restored_from(tmp_path, run_dir, local, persist)
    assert got == str(local / "checkpoint-40")
    assert not (local / "checkpoint-10").exists()
    assert (persist / "checkpoint-40" / "trainer_state.json").exists()
    ev = events(run_dir, "restore")[-1]
    assert ev["checkpoint"] is None and ev["kept"] == "checkpoint-40"
    assert "nothing restored" in r.stderr


def test_lightning_last_ckpt_comes_back_as_the_newest_and_links_out_are_never_followed(tmp_path, run_dir):
    """A stale ``last.ckpt`` file (save_last=True) comes back as a copy of the newest, never a
    link: Lightning's next save_last writes last.ckpt in place, and through a link it would
    overwrite the restored epoch file (issue 29, D4)."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    persist.mkdir()
    for step in (100, 200):
        (persist / f"epoch=0-step={step}.ckpt").write_bytes(zip_bytes(f"s{step}"))
    (persist / "last.ckpt").write_bytes((persist / "epoch=0-step=100.ckpt").read_bytes())  # stale copy
    old = (persist / "epoch=0-step=100.ckpt").stat().st_mtime_ns
    os.utime(persist / "last.ckpt", ns=(old, old))
    (persist / "evil.ckpt").symlink_to("/etc/passwd")
    got, _ = _restored_from(tmp_path, run_dir, local, persist)
    assert got == str(local / "epoch=0-step=200.ckpt")
    assert not (local / "last.ckpt").is_symlink()
    assert (local / "last.ckpt").read_bytes() == (local / "epoch=0-step=200.ckpt").read_bytes()
    with open(local / "last.ckpt", "wb") as f:  # save_last=True, the next epoch
        f.write(b"epoch 1")
    assert (local / "epoch=0-step=200.ckpt").read_bytes() == (persist / "epoch=0-step=200.ckpt").read_bytes()
    assert not (local / "evil.ckpt").exists()
    assert events(run_dir, "restore")[-1]["links_out"] == ["evil.ckpt"]


def test_a_persistent_last_ckpt_link_to_an_older_file_comes_back_as_a_link_to_the_newest(tmp_path, run_dir):
    """save_last="link" (Lightning replaces its link before it writes): the link comes back,
    naming the newest, on a new node too; without it ckpt_path="last" found nothing (D5)."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    persist.mkdir()
    for step in (100, 200):
        (persist / f"epoch=0-step={step}.ckpt").write_bytes(zip_bytes(f"s{step}"))
    (persist / "last.ckpt").symlink_to("epoch=0-step=100.ckpt")
    got, _ = _restored_from(tmp_path, run_dir, local, persist)
    assert got == str(local / "epoch=0-step=200.ckpt")
    assert os.readlink(local / "last.ckpt") == "epoch=0-step=200.ckpt"


def test_a_symlink_to_a_checkpoint_is_published_as_a_link_after_its_target(tmp_path, run_dir):
    local, persist = tmp_path / "local", tmp_path / "persist"
    cmd = script(tmp_path, f"""
        local = Path({str(local)!r}); local.mkdir(exist_ok=True)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("w", "x" * 1000)
        (local / "epoch=0-step=300.ckpt").write_bytes(buf.getvalue())
        os.symlink("epoch=0-step=300.ckpt", local / "last.ckpt")
        os.symlink("/etc/passwd", local / "passwd.ckpt")
    """)
    r = run_supervise("--run-dir", str(run_dir), "--checkpoints", str(local), str(persist),
                      "--gpu-every", "0", "--", *cmd, timeout=60)
    assert r.returncode == 74, r.stderr  # the link out is refused: end.not_durable names it, so not 0
    assert os.readlink(persist / "last.ckpt") == "epoch=0-step=300.ckpt"
    assert (persist / "last.ckpt").read_bytes() == (local / "epoch=0-step=300.ckpt").read_bytes()
    assert not os.path.lexists(persist / "passwd.ckpt")
    assert any("passwd.ckpt (a link out" in line for line in events(run_dir, "end")[-1]["not_durable"])


@pytest.mark.parametrize("backend", ["rsync", "python"])
def test_exclude_reads_as_gitignore_in_both_backends(tmp_path, run_dir, backend):
    """`/*.json` is anchored at the pair's root: it drops top-level JSON only, never the
    marker inside a checkpoint; `optim/` drops a directory at any depth; `*` stops at `/`."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    _hf_checkpoint(local, 5)
    (local / "checkpoint-5" / "optim").mkdir()
    (local / "checkpoint-5" / "optim" / "state.bin").write_bytes(b"o")
    (local / "checkpoint-5" / "rng.pth").write_bytes(b"r")
    (local / "top.json").write_text("{}")
    conf = tmp_path / "job.toml"
    conf.write_text(textwrap.dedent(f"""
        sync_backend = "{backend}"
        [[sync]]
        from = "{local}"
        to = "{persist}"
        exclude = ["/*.json", "optim/", "/checkpoint-*/rng.*"]
    """))
    r = run_supervise("--config", str(conf), "--run-dir", str(run_dir), "--gpu-every", "0", "--", "true", timeout=60)
    assert r.returncode == 0, r.stderr
    assert (persist / "checkpoint-5" / "trainer_state.json").exists()
    assert (persist / "checkpoint-5" / "model.safetensors").exists()
    assert not (persist / "checkpoint-5" / "optim").exists()
    assert not (persist / "checkpoint-5" / "rng.pth").exists()
    assert not (persist / "top.json").exists()


def test_an_exclude_that_hides_a_marker_is_a_usage_error_and_nothing_starts(tmp_path, run_dir):
    conf = tmp_path / "job.toml"
    conf.write_text(f'[[sync]]\nfrom = "{tmp_path / "l"}"\nto = "{tmp_path / "p"}"\nexclude = ["*.json"]\n')
    marker = tmp_path / "started"
    r = run_supervise("--config", str(conf), "--run-dir", str(run_dir), "--", "touch", str(marker), timeout=30)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "trainer_state.json" in r.stderr, r.stderr
    assert not marker.exists()


def test_marker_and_settle_flags_apply_to_checkpoints_pairs(tmp_path, run_dir):
    """--marker: a directory is complete only once the user's marker is there, however quiet."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    cmd = script(tmp_path, f"""
        d = Path({str(local)!r}) / "step_1"; d.mkdir(parents=True)
        (d / "w.bin").write_bytes(b"w")
        time.sleep(1.5)  # settle is 0.3 s
        Path({str(tmp_path / 'looked')!r}).write_text(str(os.path.exists({str(persist / 'step_1')!r})))
        (d / "DONE").write_text("")
        time.sleep(1.5)
    """)
    r = run_supervise("--run-dir", str(run_dir), "--checkpoints", str(local), str(persist), "--marker", "DONE",
                      "--settle", "0.3", "--gpu-every", "0", "--", *cmd, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "looked").read_text() == "False"
    assert (persist / "step_1" / "DONE").exists()
    assert events(run_dir, "publish")[0]["why"] == "marker DONE"


@pytest.mark.parametrize("args, word", [
    (["--restore"], "--restore applies to --checkpoints"),
    (["--checkpoints", "a", "b", "--profile", "keras"], "profile"),
    (["--checkpoints", "a", "b", "--settle", "soon"], "settle"),
])
def test_checkpoint_pair_flags_reject_bad_input(tmp_path, args, word):
    r = run_supervise("--run-dir", str(tmp_path / "run"), *args, "--", "true", timeout=30, cwd=tmp_path)
    assert r.returncode == 2 and word in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_check_names_each_pairs_profile_and_warns_when_it_relies_on_quiescence(tmp_path):
    hf, generic = tmp_path / "hf", tmp_path / "gen"
    _hf_checkpoint(hf, 5)
    (generic / "run_a").mkdir(parents=True)
    r = run_supervise("check", "--run-dir", str(tmp_path / "run"), "--checkpoints", str(hf), str(tmp_path / "p1"),
                      "--checkpoints", str(generic), str(tmp_path / "p2"), timeout=30)
    lines = r.stdout.splitlines()
    hf_line = next(line for line in lines if "hf ->" in line or f"{hf} ->" in line)
    gen_line = next(line for line in lines if f"{generic} ->" in line)
    assert "profile hf-trainer" in hf_line and hf_line.startswith("ok")
    assert "relies on quiescence" in gen_line and gen_line.startswith("warn")


def test_a_file_rewritten_in_place_inside_a_published_checkpoint_is_published_again(tmp_path, run_dir):
    """The directory's own stat does not change when a file inside is rewritten at the same
    size: the watch's events, not the top-level stat, say it must be walked again."""
    local, persist = tmp_path / "local", tmp_path / "persist"
    cmd = script(tmp_path, f"""
        d = Path({str(local)!r}) / "step_1"; d.mkdir(parents=True)
        (d / "w.bin").write_bytes(b"a" * 1000)
        (d / ".metadata").write_text("m")
        time.sleep(1.5)
        with open(d / "w.bin", "r+b") as f:
            f.write(b"b" * 1000)
        Path({str(tmp_path / 'rewritten')!r}).write_text(repr(time.time()))
        time.sleep(3)
    """)
    p = start_supervise("--run-dir", str(run_dir), "--checkpoints", str(local), str(persist), "--sync-every", "1h",
                        "--gpu-every", "0", "--", *cmd)
    try:
        wait_for(lambda: (persist / "step_1" / "w.bin").exists() and
                 (persist / "step_1" / "w.bin").read_bytes() == b"b" * 1000 and p.poll() is None,
                 timeout=20, what="the rewritten version published while the training still runs")
    finally:
        p.wait(timeout=60)
    assert len([e for e in events(run_dir, "publish") if e["checkpoint"] == "step_1"]) == 2
