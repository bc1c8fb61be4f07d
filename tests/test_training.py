"""supervisor.training in real child processes, with real signals and a real request file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.wait import wait_for


PY = sys.executable


def child(code: str, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    """Run ``code`` in a fresh interpreter; it talks back through files in tmp_path."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISE_")}
    full.update(env)
    return subprocess.Popen([PY, "-c", textwrap.dedent(code), str(tmp_path)], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(p: subprocess.Popen[str], timeout: float = 20) -> tuple[int, str]:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        raise AssertionError(f"child did not finish: {out}") from None
    return p.returncode, out


PREAMBLE = """
import os, sys, time
from pathlib import Path
d = Path(sys.argv[1])
def mark(name, text=''):
    (d / (name + '.tmp')).write_text(text); os.replace(d / (name + '.tmp'), d / name)
def until(name, timeout=20):
    end = time.monotonic() + timeout
    while not (d / name).exists():
        assert time.monotonic() < end, 'parent never wrote ' + name
        time.sleep(0.01)
"""


def test_signal_before_the_loop_is_not_fatal(tmp_path: Path) -> None:
    p = child(PREAMBLE + """
from supervisor import training
mark('ready')
until('sent')
time.sleep(0.2)                       # the loop has not started yet
print('requested', training.checkpoint_requested())
training.acknowledge()
print('after ack', training.checkpoint_requested())
""", tmp_path)
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    os.kill(p.pid, signal.SIGUSR1)
    (tmp_path / "sent").touch()
    rc, out = finish(p)
    assert rc == 0, out
    assert "requested True" in out and "after ack False" in out


def test_without_the_helper_the_same_signal_kills(tmp_path: Path) -> None:
    """The control for the test above: USR1's default action is to die."""
    p = child(PREAMBLE + "mark('ready'); until('sent'); time.sleep(2)", tmp_path)
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    os.kill(p.pid, signal.SIGUSR1)
    (tmp_path / "sent").touch()
    rc, _ = finish(p)
    assert rc == -signal.SIGUSR1


def test_signal_name_comes_from_the_environment(tmp_path: Path) -> None:
    p = child(PREAMBLE + """
import signal
from supervisor import training
print('usr1 default', signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL)
mark('ready'); until('sent'); time.sleep(0.2)
print('requested', training.checkpoint_requested())
""", tmp_path, SUPERVISE_CHECKPOINT_SIGNAL="USR2")
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    os.kill(p.pid, signal.SIGUSR2)
    (tmp_path / "sent").touch()
    rc, out = finish(p)
    assert rc == 0, out
    assert "usr1 default True" in out and "requested True" in out


def test_an_existing_handler_is_left_alone(tmp_path: Path) -> None:
    p = child(PREAMBLE + """
import signal
seen = []
signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
from supervisor import training
mark('ready'); until('sent'); time.sleep(0.2)
print('theirs', seen, 'ours', training.checkpoint_requested())
""", tmp_path)
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    os.kill(p.pid, signal.SIGUSR1)
    (tmp_path / "sent").touch()
    rc, out = finish(p)
    assert rc == 0, out
    assert "theirs [10] ours False" in out


def test_request_file_is_seen_acknowledged_and_seen_again(tmp_path: Path) -> None:
    req = tmp_path / "checkpoint-request"
    p = child(PREAMBLE + """
from supervisor import training
mark('ready')
for n in (1, 2):
    end = time.monotonic() + 20
    while not training.checkpoint_requested():
        assert time.monotonic() < end, 'request %d never seen' % n
        time.sleep(0.01)
    training.acknowledge()
    # the same file must not count twice
    end = time.monotonic() + 3 * training.STAT_INTERVAL
    while time.monotonic() < end:
        assert not training.checkpoint_requested(), 'acknowledged request seen again'
        time.sleep(0.01)
    mark('seen%d' % n)
""", tmp_path, SUPERVISE_CHECKPOINT_REQUEST=str(req))
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    time.sleep(0.3)
    assert p.poll() is None
    req.write_text("1")
    wait_for(lambda: (tmp_path / "seen1").exists() or p.poll() is not None, 20, "first request seen")
    assert p.poll() is None, finish(p)[1]
    req.unlink()
    req.write_text("2")  # a new file: a new request
    rc, out = finish(p)
    assert rc == 0, out
    assert (tmp_path / "seen2").exists()


def test_stop_handler_sets_a_flag_and_chains(tmp_path: Path) -> None:
    p = child(PREAMBLE + """
import signal
theirs = []
signal.signal(signal.SIGTERM, lambda s, f: theirs.append(s))
from supervisor import training
print('before', training.stop_requested())
training.install_stop_handler()
training.install_stop_handler()   # twice: still one flag, their handler once
mark('ready')
end = time.monotonic() + 20
while not training.stop_requested():
    assert time.monotonic() < end
    time.sleep(0.01)
print('stopped', training.stop_requested(), 'theirs', theirs)
""", tmp_path)
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    os.kill(p.pid, signal.SIGTERM)
    rc, out = finish(p)
    assert rc == 0, out
    assert "before False" in out and "stopped True theirs [15]" in out


def test_sigint_becomes_a_flag_not_keyboardinterrupt(tmp_path: Path) -> None:
    p = child(PREAMBLE + """
from supervisor import training
training.install_stop_handler()
mark('ready')
end = time.monotonic() + 20
while not training.stop_requested():
    assert time.monotonic() < end
    time.sleep(0.01)
print('stopped')
""", tmp_path)
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    os.kill(p.pid, signal.SIGINT)
    rc, out = finish(p)
    assert rc == 0 and "stopped" in out, out


def test_cheap_enough_for_every_step(tmp_path: Path) -> None:
    """100k calls: a training step is milliseconds, so 10 µs a call is a negligible
    0.1-1 % even for a fast step; we allow that on a shared 2-core machine, and check
    that the request file is looked at no more often than every STAT_INTERVAL."""
    p = child("""
import time
from supervisor import training
t0 = time.perf_counter()
for _ in range(100_000):
    training.checkpoint_requested()
dt = time.perf_counter() - t0
print(dt, training._stat_count)
""", tmp_path, SUPERVISE_CHECKPOINT_REQUEST=str(tmp_path / "never"))
    rc, out = finish(p, 60)
    assert rc == 0, out
    dt, stats = out.split()
    assert float(dt) < 1.0, f"100k calls took {dt}s"
    assert 1 <= int(stats) <= float(dt) / 0.5 + 2, stats


def test_importable_with_the_standard_library_only(tmp_path: Path) -> None:
    """Imported in every rank: nothing but the standard library may come in with it."""
    p = child("""
import sys
before = set(sys.modules)
import supervisor.training
new = {m.split('.')[0] for m in set(sys.modules) - before}
stdlib = set(sys.stdlib_module_names)
print(sorted(m for m in new if m not in stdlib and m != 'supervisor'))
""", tmp_path)
    rc, out = finish(p)
    assert rc == 0 and out.strip() == "[]", out


def one_request_child(tmp_path: Path, req: Path, before_seen: str, after_seen: str) -> subprocess.Popen[str]:
    """A rank that waits for a checkpoint request (running ``before_seen`` first and
    ``after_seen`` once it sees it: the save), acknowledges it, then watches three stat
    intervals and prints whether a request is still pending."""
    return child(PREAMBLE + f"""
from supervisor import training
mark('ready'); {before_seen}
end = time.monotonic() + 20
while not training.checkpoint_requested():
    assert time.monotonic() < end, 'request never seen'
    time.sleep(0.01)
{after_seen}
training.acknowledge()
end = time.monotonic() + 3 * training.STAT_INTERVAL
again = False
while time.monotonic() < end:
    again = again or training.checkpoint_requested()
    time.sleep(0.01)
print('requested again', again)
""", tmp_path, SUPERVISE_CHECKPOINT_REQUEST=str(req))


def test_a_request_seen_by_its_file_whose_signal_comes_during_the_save_is_one_checkpoint(tmp_path: Path) -> None:
    """The other order (CI, stop 28: two checkpoints for one ``scancel --signal=USR1``): the rank's
    stat sees the request file first, saves, and the same request's signal lands during the save.
    The file on disk is still the one just answered, so the signal is its doorbell, not a new request."""
    req = tmp_path / "checkpoint-request"
    p = one_request_child(tmp_path, req, "", "mark('saving'); until('signalled'); time.sleep(0.2)")
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    req.write_text("1")
    wait_for(lambda: (tmp_path / "saving").exists(), 20, "the file seen")
    os.kill(p.pid, signal.SIGUSR1)
    (tmp_path / "signalled").touch()
    rc, out = finish(p)
    assert rc == 0, out
    assert "requested again False" in out, out


def test_a_new_request_during_a_save_is_still_seen(tmp_path: Path) -> None:
    """What the rule above must not swallow: a new request (a new file, then its signal) that
    comes while the previous one is being saved is answered after it."""
    req = tmp_path / "checkpoint-request"
    p = one_request_child(tmp_path, req, "", "mark('saving'); until('second')")
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    req.write_text("1")
    wait_for(lambda: (tmp_path / "saving").exists(), 20, "the file seen")
    tmp = tmp_path / "checkpoint-request.new"
    tmp.write_text("2")
    os.replace(tmp, req)  # as supervise writes it: a new file
    os.kill(p.pid, signal.SIGUSR1)
    (tmp_path / "second").touch()
    rc, out = finish(p)
    assert rc == 0, out
    assert "requested again True" in out, out


def test_one_request_by_file_and_signal_is_one_checkpoint(tmp_path: Path) -> None:
    """supervise writes the request file, then signals: one request, so one acknowledge clears
    both (two checkpoints came from one request when only the signal was cleared)."""
    req = tmp_path / "checkpoint-request"
    p = one_request_child(tmp_path, req, "until('sent')", "")
    wait_for(lambda: (tmp_path / "ready").exists(), 20, "child ready")
    req.write_text("1")
    os.kill(p.pid, signal.SIGUSR1)
    (tmp_path / "sent").touch()
    rc, out = finish(p)
    assert rc == 0, out
    assert "requested again False" in out, out
