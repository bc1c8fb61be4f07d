"""Attacks of a hostile world (issue 14): other users (a real unprivileged user where we are
root), planted links, foreign checkpoints, secrets and escape sequences. The promise in
each: nothing is written through a link we did not make, no content leaves through a link,
modes are never widened, nothing another run published is replaced, no secret is journaled,
no control character reaches a terminal."""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hostile._util import TRACEBACK, env_with, finish, kinds
from tests.support.supervise import run_supervise, start_supervise, supervise_argv
from tests.support.wait import wait_for


OTHER = "sv14hostile"
BACKENDS = ["rsync", "python"]


@pytest.fixture(scope="session")
def other_user():
    """A real unprivileged user (uid, gid); removed after the session."""
    if os.geteuid() != 0:
        pytest.skip("creating another user needs root")
    try:
        pwd.getpwnam(OTHER)
        made = False
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER], check=True)
        made = True
    pw = pwd.getpwnam(OTHER)
    yield pw.pw_uid, pw.pw_gid
    if made:
        subprocess.run(["userdel", OTHER], check=False)


def _victim(tmp_path: Path, text: str = "victim's own line\n") -> Path:
    v = tmp_path / "victim" / ".bashrc"
    v.parent.mkdir(exist_ok=True)
    v.write_text(text)
    return v


def _gated_training(local: Path, go: Path, name: str = "step_000001", *, mode: int | None = None,
                    pointer_mode: int | None = None, extra: str = "") -> list[str]:
    """Waits for ``go`` (so a link can be planted while supervise runs), then writes one dcp
    checkpoint and a ``latest`` pointer, and sleeps a little for the mirror to publish."""
    code = f"""
import os, time
from pathlib import Path
local, go = Path({str(local)!r}), Path({str(go)!r})
while not go.exists():
    time.sleep(0.02)
d = local / {name!r}
d.mkdir(parents=True)
(d / "shard_0.bin").write_bytes(b"s" * 4096)
{extra}
(d / ".metadata").write_text("1")
{f"os.chmod(d, {mode})" if mode is not None else ""}
p = local / "latest"
p.write_text({name!r})
{f"os.chmod(p, {pointer_mode})" if pointer_mode is not None else ""}
time.sleep(3)
"""
    return [sys.executable, "-c", code]


def _run_gated(tmp_path: Path, tag: str, backend: str, plant, **training) -> tuple[Path, Path]:
    run, local, persistent = tmp_path / "run", tmp_path / "local", tmp_path / "persistent"
    local.mkdir()
    persistent.mkdir()
    go = tmp_path / "go"
    p = start_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persistent),
                        "--sync-backend", backend, "--", *_gated_training(local, go, **training), env=env_with(tag))
    wait_for(lambda: kinds(run, "spawn"), 20, what="the training")
    time.sleep(0.5)  # past the mirror's start-up clean-up of stale staging names
    plant(persistent, p.pid)
    go.touch()
    rc, _out, err = finish(p, 40)
    assert rc == 0 and TRACEBACK not in err, err
    return run, persistent


# ---------------------------------------------------------------- links inside checkpoints

def test_a_marker_linked_to_a_secret_is_not_copied_as_its_content(tmp_path: Path, tag: str) -> None:
    """`.metadata -> /etc/shadow` was copied as the target's content, mode 777."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret-hash\n")
    secret.chmod(0o600)
    local = tmp_path / "local" / "step_000001"
    local.mkdir(parents=True)
    (local / "shard_0.bin").write_bytes(b"x" * 100)
    (local / ".metadata").symlink_to(secret)
    persistent = tmp_path / "persistent"
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--checkpoints", str(tmp_path / "local"), str(persistent),
                      "--", sys.executable, "-c", "pass", env=env_with(tag))
    assert r.returncode == 74 and TRACEBACK not in r.stderr  # the checkpoint is refused: end.not_durable names it
    for f in persistent.rglob("*"):
        if f.is_file() and not f.is_symlink():
            assert b"secret-hash" not in f.read_bytes(), f


def test_a_completion_marker_linked_to_a_huge_file_is_not_copied(tmp_path: Path, tag: str) -> None:
    """`commit_success.txt -> a 256 MB file` (orbax) was copied as 256 MB."""
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(256 << 20)
    step = tmp_path / "local" / "100"
    step.mkdir(parents=True)
    (step / "array.bin").write_bytes(b"a" * 100)
    (step / "commit_success.txt").symlink_to(big)
    persistent = tmp_path / "persistent"
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--checkpoints", str(tmp_path / "local"), str(persistent),
                      "--", sys.executable, "-c", "pass", env=env_with(tag))
    assert r.returncode == 74 and TRACEBACK not in r.stderr  # the checkpoint is refused: end.not_durable names it
    assert all(f.is_symlink() or f.stat().st_size < (1 << 20) for f in persistent.rglob("*") if not f.is_dir())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_link_inside_a_checkpoint_is_copied_as_a_link(tmp_path: Path, tag: str, backend: str) -> None:
    """Symlinks are copied as symlinks: a shard pointing at /etc/passwd-like data carries no bytes of it."""
    secret = tmp_path / "passwd"
    secret.write_text("secret-account:x:0:0\n")
    run, persistent = _run_gated(tmp_path, tag, backend, lambda dst, pid: None,
                                 extra=f"os.symlink({str(secret)!r}, d / 'shard_1.bin')")
    shard = persistent / "step_000001" / "shard_1.bin"
    assert shard.is_symlink() and os.readlink(shard) == str(secret)


def test_restore_never_follows_a_persistent_link_out_of_the_pair(tmp_path: Path, tag: str) -> None:
    """Restore followed a persistent `step_000009 -> /etc`."""
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "shadow").write_text("secret-hash\n")
    (outside / ".metadata").write_text("9")
    persistent, local = tmp_path / "persistent", tmp_path / "local"
    persistent.mkdir()
    (persistent / "step_000009").symlink_to(outside)
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--checkpoints", str(local), str(persistent), "--restore",
                      "--", sys.executable, "-c", "import os; print(os.environ.get('SUPERVISE_RESTORED_FROM', ''))",
                      env=env_with(tag))
    assert r.returncode == 0 and TRACEBACK not in r.stderr
    assert r.stdout.strip() == ""
    assert not any("secret-hash" in f.read_text(errors="replace") for f in local.rglob("*") if f.is_file())


def test_a_log_linked_to_a_secret_is_mirrored_as_a_link(tmp_path: Path, tag: str) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:secret-hash\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.log").symlink_to(secret)
    plogs = tmp_path / "plogs"
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--logs", str(logs), str(plogs),
                      "--", sys.executable, "-c", "pass", env=env_with(tag))
    assert r.returncode == 0 and TRACEBACK not in r.stderr
    mirrored = plogs / "train.log"
    assert not mirrored.exists() or mirrored.is_symlink()


# ---------------------------------------------------------------- planted links at our names

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_planted_staging_link_is_never_written_through(tmp_path: Path, tag: str, backend: str) -> None:
    """`.supervise-staging-*` on the persistent side followed a planted link into another's directory."""
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()

    def plant(dst: Path, pid: int) -> None:
        (dst / ".supervise-staging-step_000001").symlink_to(victim_dir)

    run, persistent = _run_gated(tmp_path, tag, backend, plant)
    assert os.listdir(victim_dir) == []
    assert (persistent / "step_000001" / ".metadata").read_text() == "1"
    assert not (persistent / "step_000001").is_symlink()


def test_a_planted_pointer_temp_link_is_never_written_through(tmp_path: Path, tag: str) -> None:
    victim = _victim(tmp_path)

    def plant(dst: Path, pid: int) -> None:
        (dst / ".supervise-staging-latest").symlink_to(victim)

    run, persistent = _run_gated(tmp_path, tag, "python", plant)
    assert victim.read_text() == "victim's own line\n"
    assert (persistent / "latest").read_text() == "step_000001" and not (persistent / "latest").is_symlink()


def test_a_planted_checkpoint_request_link_is_never_written_through(tmp_path: Path, tag: str) -> None:
    """The checkpoint request file's temp name (`.checkpoint.request.<pid>.<n>`) followed a planted link."""
    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o1777)  # sticky and ours: allowed, and others may create names in it
    p = start_supervise("--run-dir", str(run), "--", sys.executable, "-c", "import time; time.sleep(30)",
                        env=env_with(tag))
    try:
        wait_for(lambda: kinds(run, "spawn"), 20, what="the training")
        for n in range(4):
            os.symlink(victim, run / f".checkpoint.request.{p.pid}.{n}")
        os.kill(p.pid, signal.SIGUSR1)  # the default checkpoint signal: write a request
        wait_for(lambda: kinds(run, "checkpoint-request"), 10, what="a request")
    finally:
        p.send_signal(signal.SIGINT)
        finish(p, 30)
    assert victim.read_text() == "victim's own line\n"
    assert (run / "checkpoint.request").is_file() and not (run / "checkpoint.request").is_symlink()


@pytest.mark.parametrize("name", ["events.jsonl", "supervise.log"])
def test_a_run_directory_file_planted_as_a_link_is_refused(tmp_path: Path, tag: str, name: str) -> None:
    """`events.jsonl`/`supervise.log` followed planted links: the victim's .bashrc got our lines."""
    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o1777)
    (run / name).symlink_to(victim)
    marker = tmp_path / "started"
    r = run_supervise("--run-dir", str(run), "--", "touch", str(marker), env=env_with(tag))
    assert r.returncode == 2 and TRACEBACK not in r.stderr, r.stderr
    assert name in r.stderr and "link" in r.stderr
    assert victim.read_text() == "victim's own line\n"
    assert not marker.exists()


def test_a_run_directory_of_another_user_is_refused(tmp_path: Path, tag: str, other_user) -> None:
    """A world-writable sticky directory owned by someone else: they can plant anything there."""
    uid, gid = other_user
    victim = _victim(tmp_path)
    os.chown(victim, uid, gid)
    run = tmp_path / "theirs"
    run.mkdir()
    run.chmod(0o1777)
    os.chown(run, uid, gid)
    (run / "events.jsonl").symlink_to(victim)  # planted by them (made here: they cannot reach tmp_path)
    os.lchown(run / "events.jsonl", uid, gid)
    marker = tmp_path / "started"
    r = run_supervise("--run-dir", str(run), "--", "touch", str(marker), env=env_with(tag))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "writable by every user" in r.stderr
    assert victim.read_text() == "victim's own line\n" and not marker.exists()


def test_an_events_file_created_by_another_user_is_refused(tmp_path: Path, tag: str, other_user) -> None:
    """In our own sticky directory another user created events.jsonl first: never appended to."""
    uid, gid = other_user
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o1777)
    theirs = run / "events.jsonl"
    theirs.write_text("")
    os.chown(theirs, uid, gid)
    r = run_supervise("--run-dir", str(run), "--", "true", env=env_with(tag))
    assert r.returncode == 2 and TRACEBACK not in r.stderr, r.stderr
    assert theirs.read_text() == ""


def test_a_persistent_side_writable_by_all_is_refused(tmp_path: Path, tag: str) -> None:
    persistent = tmp_path / "persistent"
    persistent.mkdir()
    persistent.chmod(0o777)
    marker = tmp_path / "started"
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--checkpoints", str(tmp_path / "local"), str(persistent),
                      "--", "touch", str(marker), env=env_with(tag))
    assert r.returncode == 2 and TRACEBACK not in r.stderr, r.stderr
    assert "writable by every user" in r.stderr
    assert not marker.exists() and os.listdir(persistent) == []


# ---------------------------------------------------------------- modes, foreign checkpoints

@pytest.mark.parametrize("backend", BACKENDS)
def test_modes_are_copied_never_widened(tmp_path: Path, tag: str, backend: str) -> None:
    """A 600 pointer became 644 and a 700 checkpoint directory 755 (Python backend)."""
    run, persistent = _run_gated(tmp_path, tag, backend, lambda dst, pid: None, mode=0o700, pointer_mode=0o600)
    assert stat.S_IMODE(os.stat(persistent / "step_000001").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(persistent / "latest").st_mode) == 0o600


def test_a_checkpoint_this_run_never_published_is_never_replaced(tmp_path: Path, tag: str) -> None:
    """Another run's `step_000001` of the same name was silently replaced, its optim.bin deleted."""
    persistent = tmp_path / "persistent"
    theirs = persistent / "step_000001"
    theirs.mkdir(parents=True)
    (theirs / "optim.bin").write_bytes(b"their optimizer state")
    (theirs / ".metadata").write_text("theirs")
    local = tmp_path / "local" / "step_000001"
    local.mkdir(parents=True)
    (local / "model.bin").write_bytes(b"ours")
    (local / ".metadata").write_text("ours")
    run = tmp_path / "run"
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(tmp_path / "local"), str(persistent),
                      "--", sys.executable, "-c", "pass", env=env_with(tag))
    assert r.returncode == 74 and TRACEBACK not in r.stderr  # ours refused, so not durable: not 0
    assert (theirs / "optim.bin").read_bytes() == b"their optimizer state"
    assert (theirs / ".metadata").read_text() == "theirs"
    assert [e["checkpoint"] for e in kinds(run, "sync-refused")] == ["step_000001"]
    assert any("step_000001" in line and "refused" in line for line in kinds(run, "end")[0]["not_durable"])
    report = subprocess.run(supervise_argv("report", str(run)), capture_output=True, text=True, timeout=60)
    assert report.returncode == 0 and "step_000001" in report.stdout


def test_a_checkpoint_this_run_published_in_an_earlier_attempt_is_updated(tmp_path: Path, tag: str) -> None:
    """The other side of the rule: our own `snapshot` rewritten every epoch replaces the older copy."""
    persistent, local, run = tmp_path / "persistent", tmp_path / "local", tmp_path / "run"
    for epoch in (1, 2):
        code = (f"from pathlib import Path; d = Path({str(local)!r}) / 'snapshot'; d.mkdir(parents=True, exist_ok=True)\n"
                f"(d / 'model.bin').write_text('epoch {epoch}' * {epoch}); (d / '.metadata').write_text('{epoch}')")
        r = run_supervise("--run-dir", str(run), "--checkpoints", str(local), str(persistent),
                          "--", sys.executable, "-c", code, env=env_with(tag))
        assert r.returncode == 0, r.stderr
    assert (persistent / "snapshot" / "model.bin").read_text() == "epoch 2" * 2
    assert not kinds(run, "sync-refused")


# ---------------------------------------------------------------- secrets, terminals

def test_the_notify_token_never_reaches_the_journal_or_the_log(tmp_path: Path, tag: str) -> None:
    """The webhook token passed with `--notify URL` was written into the `start` event's argv."""
    run = tmp_path / "run"
    url = "http://127.0.0.1:9/hooks/T0KEN-s3cr3t-value"
    r = run_supervise("--run-dir", str(run), "--notify", url, "--", sys.executable, "-c", "pass",
                      env=env_with(tag, SUPERVISE_NOTIFY_TIMEOUT="1s"))
    assert r.returncode == 0, r.stderr
    for name in ("events.jsonl", "supervise.log"):
        assert "T0KEN-s3cr3t-value" not in (run / name).read_text(), name
    assert "T0KEN-s3cr3t-value" not in r.stderr
    assert "<redacted>" in kinds(run, "start")[0]["argv"]


def test_escape_sequences_in_a_checkpoint_name_never_reach_the_terminal(tmp_path: Path, tag: str) -> None:
    """A checkpoint named with terminal escapes reached the terminal through `supervise report`."""
    evil = "step_000001\x1b]0;pwned\x07\x1b[2J"
    local = tmp_path / "local" / evil
    local.mkdir(parents=True)
    (local / "model.bin").write_bytes(b"m")
    (local / ".metadata").write_text("1")
    run = tmp_path / "run"
    r = run_supervise("--run-dir", str(run), "--checkpoints", str(tmp_path / "local"), str(tmp_path / "persistent"),
                      "--", sys.executable, "-c", "pass", env=env_with(tag))
    assert r.returncode == 0, r.stderr
    assert [e["checkpoint"] for e in kinds(run, "publish")] == [evil]
    for args in ((), ("--json",)):
        rep = subprocess.run(supervise_argv("report", str(run), *args), capture_output=True, timeout=60)
        assert rep.returncode == 0
        assert b"\x1b" not in rep.stdout and b"\x07" not in rep.stdout
        assert b"step_000001" in rep.stdout
    assert "\x1b" not in r.stderr


@pytest.mark.parametrize("line", [
    '{"v":1,"t":1e308,"attempt":1,"kind":"publish","pair":"c","checkpoint":"s1"}',
    '{"v":1,"t":1700000000,"attempt":1,"kind":"end","reason":{"a":1},"exit_status":"zero","not_durable":5}',
    '{"v":1,"t":"soon","attempt":"one","kind":"publish","checkpoint":7,"pair":[1]}',
])
def test_report_on_hostile_events_is_never_a_traceback(tmp_path: Path, line: str) -> None:
    """`supervise report` crashed with a traceback on events with wrong types and on t = 1e308."""
    run = tmp_path / "run"
    run.mkdir()
    good = '{"v":1,"t":1700000000,"attempt":1,"kind":"start","host":"h","argv":[],"command":["x"]}\n'
    (run / "events.jsonl").write_text(good + line + "\n")
    for args in ((), ("--json",)):
        rep = subprocess.run(supervise_argv("report", str(run), *args), capture_output=True, text=True, timeout=60)
        assert TRACEBACK not in rep.stderr, rep.stderr
        assert rep.returncode in (0, 2) and len(rep.stderr.strip().splitlines()) <= 1


def test_a_planted_sample_file_link_is_never_written_through(tmp_path: Path, tag: str) -> None:
    """host.csv in a sticky run directory of ours, planted as a link to an empty file (an
    empty authorized_keys) before the run: the sampler's appends never reach it (opened
    O_NOFOLLOW, ours only)."""
    victim = _victim(tmp_path, "")
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o1777)
    (run / "host.csv").symlink_to(victim)
    r = run_supervise("--run-dir", str(run), "--gpu-every", "0.2s", "--", sys.executable, "-c",
                      "import time; time.sleep(1.5)", env=env_with(tag))
    assert r.returncode == 0 and TRACEBACK not in r.stderr, r.stderr
    assert victim.read_text() == ""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_planted_persistent_log_link_is_never_written_through(tmp_path: Path, tag: str, backend: str) -> None:
    """In a sticky persistent log directory of ours, another user plants `train.log -> an
    empty file` before our first copy: the log lands as our own file, the victim stays empty."""
    victim = _victim(tmp_path, "")
    logs, plogs = tmp_path / "logs", tmp_path / "plogs"
    logs.mkdir()
    plogs.mkdir()
    plogs.chmod(0o1777)
    (logs / "train.log").write_text("step 1 loss 0.5\n" * 100)
    (plogs / "train.log").symlink_to(victim)
    r = run_supervise("--run-dir", str(tmp_path / "run"), "--logs", str(logs), str(plogs), "--sync-backend", backend,
                      "--", sys.executable, "-c", "pass", env=env_with(tag))
    assert r.returncode == 0 and TRACEBACK not in r.stderr, r.stderr
    assert victim.read_text() == ""
    assert not (plogs / "train.log").is_symlink() and (plogs / "train.log").read_text() == "step 1 loss 0.5\n" * 100
