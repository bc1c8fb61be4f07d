"""The real frameworks into a bucket (issue 45): each library's own training loop
(tests/frameworks/trainers/) under the real ``supervise``, with the persistent side of its
checkpoint pair ``s3://BUCKET/PREFIX`` on the SeaweedFS the store tests run.

A poller (tests/frameworks/poller.py) reads the bucket as a user does, through its manifests:
every version of every checkpoint that appears is downloaded by the objects its manifest names,
each checked against its size and sha256, and loaded with the library's own loader; every
version of a pointer (DeepSpeed's ``latest``, Lightning's ``last.ckpt`` link) must name a
checkpoint whose manifest is already there. A single failure is a torn sighting. The training is
preempted between two saves, requeued onto an empty disk, restores the newest durable version
from the bucket and trains on; its final checkpoint in the bucket holds the same weights as the
same training run once, uninterrupted, without ``supervise`` (the replay).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.frameworks._harness import CASES, Poller, Run
from tests.frameworks.checkers import entries, is_entry
from tests.support.s3 import Bucket, S3Server

PREFIX = "proj/run1/ckpt"
# Every attempt and the replay are configured for the same run of FINAL steps (HF's learning-rate
# schedule is a function of it); the first attempt is preempted at step 17 and stops at its next
# save (the stop's checkpoint), far from FINAL.
FINAL = 40
LONG = pytest.mark.skipif(not os.environ.get("SUPERVISE_LONG"), reason="the long set: SUPERVISE_LONG=1")
# HF with save_total_limit (the Trainer deletes its older checkpoints under supervise's feet);
# Lightning's last.ckpt as a link (a pointer in the bucket) and, in the long set, as a copy;
# DeepSpeed ZeRO 1 (every rank a shard, `latest` before rank 1's) and, long, ZeRO 0.
CASE_IDS = [pytest.param(c, marks=LONG) if c in {"lightning-copy", "deepspeed-zero0"} else c
            for c in ("hf", "lightning-link", "lightning-copy", "deepspeed-zero1", "deepspeed-zero0", "orbax",
                      "accelerate")]
TRAINER_ARGS = {"hf": ("--save-total-limit", "2")}


def _wait(what: str, cond: Callable[[], object], timeout: float = 300.0) -> None:
    # generous: DeepSpeed's start took minutes on a loaded CI machine; the wait ends when ``cond`` holds
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"no {what} in {timeout}s"
        time.sleep(0.05)


def _loaded(run: Run, poller: Poller, bucket: Bucket) -> dict[str, int]:
    """Every checkpoint in the bucket now, once the poller has loaded its current version (its
    manifest's ETag): name -> the step its library's loader found in it."""
    import obstore

    base = f"{PREFIX}/.supervise/manifests/"
    now = {m["path"][len(base):].removesuffix(".json"): m["e_tag"] for batch in obstore.list(bucket.store, prefix=base)
           for m in batch}
    now = {n: v for n, v in now.items() if is_entry(run.case.loader, n)}
    url = bucket.url(PREFIX)

    def got() -> dict[str, dict]:
        return {s["name"]: s for s in poller.sightings() if s["where"] == url and (s["name"], s.get("version")) in now.items()}

    _wait("the poller's load of every version in the bucket", lambda: len(got()) == len(now))
    return {n: s.get("step", s.get("error")) for n, s in got().items()}


@pytest.fixture
def store_run(tmp_path: Path, bucket: Bucket, s3_server: S3Server) -> Iterator[Callable[[str], tuple[Run, Poller]]]:
    """A framework ``Run`` whose persistent side is the bucket, the poller on the bucket and on
    ``replayed`` (where the replay's checkpoints are moved once it has finished)."""
    made: list[tuple[Run, Poller]] = []

    def make(case_id: str) -> tuple[Run, Poller]:
        case = CASES[case_id]
        why = case.missing()
        if why:
            pytest.skip(why)
        run = Run(case, tmp_path / case_id, to=bucket.url(PREFIX), env=dict(s3_server.env))
        (tmp_path / "replayed").mkdir()
        poller = Poller.start(case.loader, bucket.url(PREFIX), tmp_path / "sightings.jsonl",
                              also=(tmp_path / "replayed",), weights=True, env=s3_server.env)
        made.append((run, poller))
        return run, poller

    yield make
    for run, poller in made:
        poller.stop()
        run.close()


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_a_framework_into_a_bucket_is_never_torn_and_resumes_on_an_empty_disk_as_if_never_stopped(
        store_run: Callable[[str], tuple[Run, Poller]], bucket: Bucket, tmp_path: Path, case_id: str) -> None:
    run, poller = store_run(case_id)
    url = bucket.url(PREFIX)
    targs = TRAINER_ARGS.get(case_id, ())
    replay = run.replay(steps=FINAL, save_every=5, trainer_args=targs)
    # Each save of the first attempt stops halfway for 0.6 s (the trainers' --save-pause: HF before
    # trainer_state.json, Lightning halfway through the file, DeepSpeed with a rank late after
    # `latest`, Orbax before its rename, Accelerate inside save_state): long enough for passes to
    # see the half-written checkpoint, which must never get a manifest.
    a1 = run.start(steps=FINAL, save_every=5, step_sleep=0.05, save_pause=0.6, trainer_args=targs)
    run.preempt(a1, at_step=17, timeout=300)  # saves at 5, 10, 15 are done; 20 is not
    saved = a1.saved()
    assert saved[:3] == [5, 10, 15], (saved, run.stderr(a1))
    profiles = run.events(a1, "sync-profile")
    assert profiles and profiles[-1]["profile"] == run.case.profile, profiles
    assert profiles[-1]["writers"] == "visible" and profiles[-1]["quiescence"] is False, profiles
    assert [x for x in run.end(a1)["not_durable"] or [] if "torn" not in x] == [], run.end(a1)
    assert a1.rc == 75, (a1.rc, run.end(a1))  # stopped unfinished, not requeued, nothing owed (not 74)

    # What the bucket holds once the attempt has ended: every manifest names objects all there,
    # of their size and sha256, and every version was loaded by the poller with the library's
    # loader (the step it holds); every save the training finished is among them (the one it was
    # finishing when stopped may be too: at most that one more).
    docs = {n: d for n, d in bucket.manifests(PREFIX).items() if is_entry(run.case.loader, n)}
    assert {n: bucket.whole(d) for n, d in docs.items()} == {n: [] for n in docs}
    steps = _loaded(run, poller, bucket)
    assert steps and all(isinstance(v, int) for v in steps.values()), steps
    newest = max(steps.values())
    kept = saved[-2:] if case_id == "hf" else saved  # save_total_limit=2: older ones may be gone before uploaded
    assert set(kept) <= set(steps.values()) and newest in (saved[-1], saved[-1] + 5), (steps, saved)
    assert newest <= FINAL - 10, f"the first attempt trained to {newest}: nothing left to resume"

    run.wipe_local()  # the requeue lands on another node: nothing on its disk
    a2 = run.run(steps=FINAL, save_every=5, trainer_args=targs, timeout=300)
    assert a2.rc == 0, run.stderr(a2)
    (restore,) = run.events(a2, "restore")
    assert restore["copied"] and restore["source"].startswith(f"{PREFIX}/.supervise/manifests/"), restore
    assert steps[restore["checkpoint"]] == newest, (restore, steps)
    start = a2.start_step()
    assert start is not None and start["step"] == newest, (start, run.stderr(a2))
    assert [x for x in run.end(a2)["not_durable"] or [] if "torn" not in x] == [], run.end(a2)

    # The replay, uninterrupted, ends where the requeued run ends; its checkpoints go where the
    # poller looks only once it has exited (written in place, they were not complete before).
    assert replay.wait(300) == 0, (run.root / "replay.err").read_text()[-3000:]
    for p in entries(run.case.loader, run.replay_local):
        os.rename(p, tmp_path / "replayed" / p.name)

    def final(where: str) -> list[dict]:
        return [s for s in poller.sightings() if s["where"] == where and s["ok"] and s.get("step") == FINAL
                and not s.get("pointer")]

    _wait("the poller's sighting of both final checkpoints", lambda: final(url) and final(str(tmp_path / "replayed")))
    replayed = {s["weights"] for s in final(str(tmp_path / "replayed"))}  # Lightning: step=40.ckpt and last.ckpt
    assert len(replayed) == 1 and {s["weights"] for s in final(url)} == replayed, \
        (final(url), final(str(tmp_path / "replayed")))

    # Every version the bucket ended with was loaded by the poller, its pointers name the final
    # checkpoint, and no sighting was torn.
    steps = _loaded(run, poller, bucket)
    assert all(isinstance(v, int) for v in steps.values()) and max(steps.values()) == FINAL, steps
    pointers = {k.rsplit("/", 1)[1]: json.loads(bucket.get(k) or b"{}")["target"]
                for k in bucket.keys(f"{PREFIX}/.supervise/pointers/")}
    assert {p: steps.get(t) for p, t in pointers.items()} == {p: FINAL for p in pointers}, (pointers, steps)
    torn = [s for s in poller.sightings() if s["where"] == url and not s["ok"]]
    assert torn == [], torn


LATE_RANK = """
import json, os, sys, time
from pathlib import Path
local, run_dir = Path(sys.argv[1]), Path(os.environ["SUPERVISE_RUN_DIR"])
def save(step, ranks):
    d = local / f"global_step{step}"
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"m" * 1000)
    for r in ranks:
        (d / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"o" * 1000)
    (local / "latest").write_text(d.name)  # rank 0 names it at once, whatever the other ranks do
save(10, [0, 1])
for _ in range(600):  # until supervise published `latest` naming it (bounded: 60 s)
    evs = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if x.endswith("}")]
    if any(e.get("pointer") and e.get("target") == "global_step10" for e in evs):
        break
    time.sleep(0.1)
else:
    sys.exit("global_step10 was never published")
save(20, [0])  # rank 1 is late with its shard, and the training ends (preempted) before it comes
"""


@pytest.mark.parametrize("side", ["directory", "bucket"])
def test_a_pointer_naming_a_checkpoint_left_torn_by_a_late_rank_is_torn_too_and_does_not_fail_the_run(
        side: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """DeepSpeed's rank 0 writes ``latest`` before the other ranks' shards. A training stopped
    while rank 1 is late leaves ``global_step20`` torn and ``latest`` naming it: neither can ever
    be made durable, the persistent ``latest`` rightly goes on naming ``global_step10``, and the
    run exits with the training's status, not 74. Seen in the DeepSpeed test above under load
    (``end.not_durable``: "latest (pointer to global_step25)", so exit 74 instead of 75)."""
    from supervisor.policy import owed
    from tests.support.journal import events
    from tests.support.supervise import run_supervise

    local, run_dir = tmp_path / "local", tmp_path / "run"
    (tmp_path / "train.py").write_text(LATE_RANK)
    if side == "bucket":
        bucket: Bucket = request.getfixturevalue("bucket")
        env, to = request.getfixturevalue("s3_server").env, bucket.url(PREFIX)
    else:
        env, to = {}, str(tmp_path / "persistent")
    r = run_supervise("--run-dir", str(run_dir), "--checkpoints", str(local), to, "--gpu-every", "0", "--",
                      sys.executable, str(tmp_path / "train.py"), str(local), env=env, timeout=120)
    (end,) = events(run_dir / "events.jsonl", "end")
    assert [e["checkpoint"] for e in events(run_dir / "events.jsonl", "torn")] == ["global_step20"], r.stderr[-3000:]
    assert any(": latest (torn: " in line for line in end["not_durable"]), (r.returncode, end["not_durable"])
    assert not owed(end["not_durable"]) and r.returncode == 0, (r.returncode, end)
    if side == "bucket":
        assert bucket.get(f"{PREFIX}/latest") == b"global_step10"
        assert sorted(n for n in bucket.manifests(PREFIX) if n.startswith("global_step")) == ["global_step10"]
    else:
        assert (tmp_path / "persistent" / "latest").read_text() == "global_step10"
        assert not (tmp_path / "persistent" / "global_step20").exists()
