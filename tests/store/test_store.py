"""An object store as the persistent side (issue 34), with a real S3 server (SeaweedFS) and the
real ``supervise``: checkpoints land whole (every object, then the manifest), come back on an
empty disk, are never overwritten by a second run, logs keep every attempt, bad settings exit
2 before anything starts, and a server that dies mid-upload or hangs neither tears a checkpoint
nor holds up a stop past its budget. docs/sync.md, "Object stores"."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.journal import events
from tests.support.s3 import Bucket, S3Server
from tests.support.supervise import killed_on_exit, run_supervise, start_supervise
from tests.support.wait import wait_for

TRAINER = Path(__file__).parents[1] / "helpers" / "trainer.py"
PY = sys.executable


def _train(local: Path, *args: str) -> list[str]:
    return ["--", PY, str(TRAINER), str(local), *args]


def _of(run: Path, kind: str, attempt: int | None = None) -> list[dict]:
    return [e for e in events(run / "events.jsonl") if e.get("kind") == kind and (attempt is None or e["attempt"] == attempt)]


def test_checkpoints_land_whole_in_the_bucket_and_come_back_on_an_empty_disk(bucket: Bucket, s3_server: S3Server,
                                                                            tmp_path: Path) -> None:
    local, run, prefix = tmp_path / "local", tmp_path / "run", "proj/run1/ckpt"
    seen: dict[str, float] = {}
    wrong: list[str] = []
    stop = threading.Event()

    def reader() -> None:  # a reader of the bucket while the training saves: never a torn checkpoint
        while not stop.is_set():
            for name, doc in bucket.manifests(prefix).items():
                if seen.get(name) != doc["published_at"]:
                    seen[name] = doc["published_at"]
                    wrong.extend(f"{name}: {w}" for w in bucket.whole(doc))
            time.sleep(0.05)

    t = threading.Thread(target=reader)
    t.start()
    try:
        # 9 MiB shards: past the 8 MiB part size, so each goes up as a concurrent multipart upload
        r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), bucket.url(prefix), "--restore",
                          *_train(local, "--steps", "40", "--every", "10", "--files", "2", "--size", str(9 << 20)),
                          env=s3_server.env, timeout=180)
    finally:
        stop.set()
        t.join()
    assert r.returncode == 0, r.stderr[-3000:]
    names = [f"step_{n:06d}" for n in (10, 20, 30, 40)]
    docs = bucket.manifests(prefix)
    assert sorted(docs) == names, sorted(docs)
    for name in names:
        assert bucket.whole(docs[name]) == [], name
        assert sorted(docs[name]["files"]) == [".metadata", "shard_0.bin", "shard_1.bin"]
        parts = docs[name]["files"]["shard_0.bin"]["parts"]  # 9 MiB: two parts, each an object by its content
        assert [p["size"] for p in parts] == [8 << 20, 1 << 20], parts
        assert all(p["key"] == f"{prefix}/.supervise/objects/{p['key'].split('/')[-2]}/{p['sha256']}" for p in parts)
    assert wrong == [] and seen, (wrong, seen)  # (an older one may land after the last look: newest first)
    published = [e["checkpoint"] for e in _of(run, "publish", 1) if not e.get("pointer")]
    assert sorted(published) == names, published  # each once (the newest first when several wait)
    assert json.loads(bucket.get(f"{prefix}/.supervise/pointers/latest.json") or b"{}")["target"] == "step_000040"
    assert bucket.get(f"{prefix}/latest") == b"step_000040"
    assert _of(run, "end", 1)[0]["not_durable"] == []
    assert s3_server.secret not in (run / "events.jsonl").read_text() + r.stderr

    # a requeue onto a node with an empty disk: the newest checkpoint comes back, verified
    for p in sorted(local.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() else p.rmdir()
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), bucket.url(prefix), "--restore",
                      *_train(local, "--steps", "50", "--every", "10", "--files", "2", "--size", str(9 << 20)),
                      env=s3_server.env, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed 40" in r.stdout, r.stdout
    restore = _of(run, "restore", 2)[0]
    assert restore["checkpoint"] == "step_000040" and restore["copied"] and restore["files"] == 3, restore
    assert restore["bytes"] == docs["step_000040"]["bytes"] and restore["pointers"] == ["latest"], restore
    assert "step_000050" in bucket.manifests(prefix) and bucket.get(f"{prefix}/latest") == b"step_000050"


def test_a_checkpoint_whose_objects_no_longer_match_its_manifest_is_skipped_on_restore(
        bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    import obstore

    local, run, prefix = tmp_path / "local", tmp_path / "run", "skip/ckpt"
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), bucket.url(prefix),
                      *_train(local, "--steps", "20", "--every", "10"), env=s3_server.env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    newest = bucket.manifest(prefix, "step_000020")
    assert newest is not None and bucket.store is not None
    obstore.put(bucket.store, newest["files"]["shard_1.bin"]["key"], b"not what the manifest says")  # by hand, elsewhere
    shutil.rmtree(local)
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), bucket.url(prefix), "--restore",
                      *_train(local, "--steps", "30", "--every", "10"), env=s3_server.env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resumed 10" in r.stdout, r.stdout
    restore = _of(run, "restore", 2)[0]
    assert restore["checkpoint"] == "step_000010" and restore["torn"] == ["step_000020"], restore
    assert not list(local.glob(".supervise-staging-*"))


@pytest.mark.parametrize("fault", ["wrong secret", "unreachable endpoint", "missing bucket", "malformed endpoint",
                                   "no credentials"])
@pytest.mark.parametrize("sub", ["run", "check"])
def test_a_store_that_cannot_be_used_exits_2_in_one_line_before_anything_starts(
        fault: str, sub: str, bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    env = dict(s3_server.env)
    url = bucket.url("p")
    if fault == "wrong secret":
        env["AWS_SECRET_ACCESS_KEY"] = "not-" + s3_server.secret
    elif fault == "unreachable endpoint":
        env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"  # discard: nothing listens
    elif fault == "malformed endpoint":
        env["AWS_ENDPOINT_URL"] = "127.0.0.1:9000"  # no scheme: obstore's signer panicked on it
    elif fault == "no credentials":
        # none anywhere it looks: not in the pair, the variables (empty counts as unset) or the AWS files
        env.update(AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="", AWS_SESSION_TOKEN="", AWS_PROFILE="",
                   HOME=str(tmp_path / "home"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "home" / "creds"),
                   AWS_CONFIG_FILE=str(tmp_path / "home" / "config"))
    else:
        url = "s3://no-such-bucket-here/p"
    marker = tmp_path / "started"
    t0 = time.monotonic()
    r = run_supervise(*([sub] if sub == "check" else []), "--run-dir", str(tmp_path / "run"),
                      "--checkpoints", str(tmp_path / "local"), url, "--",
                      PY, "-c", f"open({str(marker)!r}, 'w')", env=env, timeout=60)
    took = time.monotonic() - t0
    lines = [line for line in (r.stderr + r.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if url in line]
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(errors) == 1, lines
    if sub == "run":
        assert len(lines) == 1, lines  # one line, nothing else
    want = {"wrong secret": "access denied", "unreachable endpoint": "cannot reach the endpoint",
            "missing bucket": "bucket does not exist", "malformed endpoint": "is not an http(s)://HOST[:PORT] URL",
            "no credentials": "no credentials found"}[fault]
    assert want in errors[0], errors
    if fault == "no credentials":  # and where it looked, so the user knows where to put them
        for where in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", str(tmp_path / "home" / "creds"), "[default]"):
            assert where in errors[0], errors
        assert "access denied" not in errors[0], errors
    for secret in filter(None, (s3_server.secret, env["AWS_SECRET_ACCESS_KEY"])):
        assert secret not in r.stderr + r.stdout
    assert not marker.exists()  # nothing started
    assert not [e for e in events(tmp_path / "run" / "events.jsonl") if e.get("kind") == "spawn"]
    assert took < 30, took


def test_a_second_run_on_the_same_prefix_is_refused_never_overwrites(bucket: Bucket, s3_server: S3Server,
                                                                     tmp_path: Path) -> None:
    prefix = "shared/ckpt"
    a, b = tmp_path / "a", tmp_path / "b"
    r = run_supervise("--run-dir", str(a / "run"), "--checkpoints", str(a / "local"), bucket.url(prefix),
                      *_train(a / "local", "--steps", "10", "--every", "10"), env=s3_server.env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    first, pointer = bucket.manifest(prefix, "step_000010"), bucket.get(f"{prefix}/.supervise/pointers/latest.json")
    assert first is not None and pointer is not None
    claim = bucket.get(f"{prefix}/.supervise/claims/step_000010")  # docs/sync.md's layout: the name's owner
    assert claim is not None and json.loads(claim)["owner"] == str(a / "run"), claim
    # another run directory, other bytes under the same names: refused, journaled, never written over
    r = run_supervise("--run-dir", str(b / "run"), "--checkpoints", str(b / "local"), bucket.url(prefix),
                      *_train(b / "local", "--steps", "10", "--every", "10", "--size", "8192"), env=s3_server.env,
                      timeout=60)
    assert r.returncode == 74, r.stderr[-2000:]  # its checkpoint refused, not durable: not 0
    refused = {(e["checkpoint"], e["what"]) for e in _of(b / "run", "sync-refused")}
    assert refused == {("step_000010", "checkpoint")}, refused  # its `latest` names it: never published either
    assert bucket.manifest(prefix, "step_000010") == first
    assert bucket.get(f"{prefix}/.supervise/pointers/latest.json") == pointer
    assert bucket.whole(first) == []
    end = _of(b / "run", "end")[0]
    assert any("step_000010 (refused" in line for line in end["not_durable"]), end
    # the first run itself, requeued, moves its own manifest on (If-Match): a new version of its own
    r = run_supervise("--run-dir", str(a / "run"), "--checkpoints", str(a / "local"), bucket.url(prefix),
                      *_train(a / "local", "--steps", "20", "--every", "10"), env=s3_server.env, timeout=60)
    assert r.returncode == 0 and not _of(a / "run", "sync-refused"), r.stderr[-2000:]


def test_a_name_another_run_claimed_is_never_uploaded_over(bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    """Two runs starting the same name at once: whichever claims it first (If-None-Match) owns its
    keys; the other never writes an object there, even before any manifest exists."""
    prefix = "race/ckpt"
    claim = f"{prefix}/.supervise/claims/step_000010"
    import obstore

    assert bucket.store is not None
    obstore.put(bucket.store, claim, b'{"owner": "/another/run"}', mode="create")
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--checkpoints", str(tmp_path / "local"), bucket.url(prefix),
                      *_train(tmp_path / "local", "--steps", "20", "--every", "10"), env=s3_server.env, timeout=60)
    # this run's step_000010 never reached the bucket: the end says so, with not_durable_status (74)
    assert r.returncode == 74, r.stderr[-2000:]
    end = _of(tmp_path / "run", "end")[-1]
    assert [x for x in end["not_durable"] if "step_000010" in x and "refused" in x], end
    refused = [e["checkpoint"] for e in _of(tmp_path / "run", "sync-refused")]
    assert refused == ["step_000010"], refused
    assert not [k for k in bucket.keys(prefix) if k.startswith(f"{prefix}/step_000010")]
    assert sorted(bucket.manifests(prefix)) == ["step_000020"]
    assert bucket.get(claim) == b'{"owner": "/another/run"}'


def test_logs_go_up_as_they_grow_and_every_attempts_log_is_kept(bucket: Bucket, s3_server: S3Server,
                                                               tmp_path: Path) -> None:
    logs, run, prefix = tmp_path / "logs", tmp_path / "run", "run1/logs"
    writer = ("import sys, time, pathlib\n"
              "p = pathlib.Path(sys.argv[1]); p.mkdir(exist_ok=True)\n"
              "with open(p / 'train.log', 'w') as f:\n"
              "    for i in range(20):\n"
              "        f.write(f'{sys.argv[2]} line {i}\\n'); f.flush(); time.sleep(0.05)\n")
    for attempt in ("first", "second"):
        r = run_supervise("--run-dir", str(run), "--logs", str(logs), bucket.url(prefix), "--", PY, "-c", writer,
                          str(logs), attempt, env=s3_server.env, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
    now = bucket.log(f"{prefix}/train.log")
    kept = bucket.log(f"{prefix}/train.log.attempt-1")
    assert now == (logs / "train.log").read_bytes() and now.startswith(b"second line 0") and now.count(b"\n") == 20
    assert kept.startswith(b"first line 0") and kept.count(b"\n") == 20, kept[:200]
    restarted = _of(run, "log-restarted", 2)
    assert [(e["file"], e["kept_as"]) for e in restarted] == [("train.log", "train.log.attempt-1")], restarted


def test_a_server_killed_mid_upload_then_restarted_tears_nothing(s3_own: S3Server, tmp_path: Path) -> None:
    bucket = s3_own.make_bucket("crash")
    local, run, prefix = tmp_path / "local", tmp_path / "run", "ckpt"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), bucket.url(prefix), "--restore",
                        *_train(local, "--every", "20", "--step-time", "0.1", "--files", "2", "--size", str(12 << 20)),
                        env=s3_own.env)
    with killed_on_exit(p):
        wait_for(lambda: _of(run, "publish"), 60, "the first publish")
        wait_for(lambda: (local / "step_000040" / ".metadata").exists(), 60, "step 40 saved")
        s3_own.kill()  # in the middle of step 40's upload (2 × 12 MiB, multipart), or just before it
        wait_for(lambda: _of(run, "sync-failed"), 60, "a failed pass, journaled")
        s3_own.again()
        wait_for(lambda: _of(run, "sync-recovered"), 120, "a pass after the restart")
        p.send_signal(signal.SIGTERM)  # a clean stop: its last checkpoint and every earlier one land
        out, err = p.communicate(timeout=240)
    failed = _of(run, "sync-failed")
    assert failed and all(e["errno"] in ("ECONNREFUSED", "S3") for e in failed), failed
    docs = bucket.manifests(prefix)
    saved = sorted(d.name for d in local.glob("step_*") if (d / ".metadata").exists())
    assert sorted(docs) == saved and "step_000040" in saved, (sorted(docs), saved)
    assert all(bucket.whole(doc) == [] for doc in docs.values())
    assert _of(run, "end")[0]["not_durable"] == [], _of(run, "end")


def test_a_hung_endpoint_never_holds_the_stop_past_its_budget(s3_own: S3Server, tmp_path: Path) -> None:
    bucket = s3_own.make_bucket("hung")
    local, run, prefix = tmp_path / "local", tmp_path / "run", "ckpt"
    p = start_supervise("--run-dir", str(run), "--grace", "5s", "--checkpoints", str(local), bucket.url(prefix),
                        *_train(local, "--every", "10", "--step-time", "0.05"), env=s3_own.env)
    pid = int((s3_own.root / "weed.pid").read_text())
    with killed_on_exit(p):
        wait_for(lambda: _of(run, "publish"), 60, "the first publish")
        os.kill(pid, signal.SIGSTOP)  # the endpoint hangs: connections open, nothing answers
        try:
            # a newer checkpoint: its pass is now stuck on the hung endpoint, holding the pair
            wait_for(lambda: len(list(local.glob("step_*/.metadata"))) >= 3, 60, "two more checkpoints saved")
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=120)
            took = time.monotonic() - t0
        finally:
            os.kill(pid, signal.SIGCONT)
    end = _of(run, "end")[0]
    assert took < 60, took
    # what never landed is named, from the local side as it was, not what the last finished pass left
    assert any("(complete, not yet on persistent storage)" in line for line in end["not_durable"]), end
    published = {e["checkpoint"] for e in _of(run, "publish") if not e.get("pointer")}
    saved = {d.name for d in local.glob("step_*") if (d / ".metadata").exists()}
    owed = {line.split(": ")[1].split(" ")[0] for line in end["not_durable"] if "not yet on persistent" in line}
    assert saved - published <= owed, (saved - published, end["not_durable"])


def test_supervise_check_names_the_store_and_never_its_secret(bucket: Bucket, s3_server: S3Server, tmp_path: Path) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text(f'[[sync]]\nname = "ckpt"\nfrom = "{tmp_path / "local"}"\nto = "{bucket.url("x")}"\n'
                   f'endpoint = "{s3_server.env["AWS_ENDPOINT_URL"]}"\naccess_key_id = "{s3_server.env["AWS_ACCESS_KEY_ID"]}"\n'
                   f'secret_access_key = "{s3_server.secret}"\nrestore = true\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    r = subprocess.run([PY, "-m", "supervisor", "check", "--config", str(cfg), "--run-dir", str(tmp_path / "run"),
                        "--", "true"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert bucket.url("x") in r.stdout + r.stderr and s3_server.secret not in r.stdout + r.stderr
