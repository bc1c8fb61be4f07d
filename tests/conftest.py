"""Shared helpers: run the real `supervise` as a subprocess and poll for conditions."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "tests" / "helpers"
RECORDER = HELPERS / "recorder.py"


def _polls(cond: Callable[[], object], timeout: float, what: str | Callable[[], str], error: type[Exception]):
    """Check ``cond`` once per step; the generator returns its first truthy value, and raises
    ``error`` naming ``what`` once ``timeout`` seconds have passed. Its callers sleep between."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g}s waiting for {what() if callable(what) else what}")
        yield


def wait_for(cond: Callable[[], object], timeout: float = 20.0, what: str | Callable[[], str] = "condition", *,
             interval: float = 0.02, error: type[Exception] = AssertionError) -> object:
    """Poll ``cond`` until it returns something truthy, and return that; after ``timeout`` seconds
    raise ``error`` naming ``what`` (a callable is asked then, to say what was seen). The one
    polling helper of the tests: a test waits for a condition, never for a guessed time."""
    steps = _polls(cond, timeout, what, error)
    try:
        while True:
            next(steps)
            time.sleep(interval)
    except StopIteration as done:
        return done.value


async def wait_for_async(cond: Callable[[], object], timeout: float = 20.0, what: str | Callable[[], str] = "condition",
                         *, interval: float = 0.02) -> object:
    """``wait_for`` inside an event loop: the same bound and message, sleeping with anyio."""
    import anyio

    steps = _polls(cond, timeout, what, AssertionError)
    try:
        while True:
            next(steps)
            await anyio.sleep(interval)
    except StopIteration as done:
        return done.value


def supervise_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor", *args]


def start_supervise(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, **kw) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))}
    full_env.update(env or {})
    return subprocess.Popen(supervise_argv(*args), env=full_env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def run_supervise(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    p = start_supervise(*args, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"supervise did not finish in {timeout}s: {err}") from None
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@contextmanager
def killed_on_exit(p: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Whatever the test's outcome, ``p`` is not left running: killed and reaped on the way out."""
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def recorded(log: Path) -> list[str]:
    """Signal names a recorder saw, in order."""
    if not log.exists():
        return []
    return [line.split()[0] for line in log.read_text().splitlines() if line.strip()]


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def reaper():
    """Kill any pid registered by a test, whatever the test's outcome."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# Under pytest-xdist (scripts/test.sh runs `-n 3 --dist loadgroup`), the tests that share one
# expensive, stateful thing run on one worker, one after another: every user of the session's
# Slurm cluster (one cluster, not one per worker), and each module whose tests share a
# module-scoped fixture (built once, not once per worker). Everything else is spread test by test.
# The multi-node cluster (cluster3) goes with them: two clusters' daemons on two cores at once
# were seen to leave a killed node unmarked (CI, stop 27).
# Two things must hold for the grouping to take effect, and until stop 28 neither did, so every
# "serial" test ran beside its siblings: this hook runs before pytest-xdist's own (which turns the
# marker into the node-id suffix the scheduler groups by), and pytest is below 9.2, whose
# structured node ids drop that suffix (pytest-xdist#1386). pytest_configure checks it.
# The PBS cluster is another group: its tests run one after another, beside the Slurm ones.
SERIAL_FIXTURES = {"slurm": "slurm", "cluster3": "slurm", "cluster4": "slurm", "pbs_session": "pbs"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        group = next((g for f, g in SERIAL_FIXTURES.items() if f in names), None)
        if group is None and _module_fixtures(item) & names:
            group = item.nodeid.split("::", 1)[0]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config):  # noqa: ANN001, ANN201
    """Refuse --dist loadgroup where it would not group: the serial tests would run in parallel."""
    if config.getvalue("dist") == "loadgroup" and _version(pytest.__version__) >= (9, 2):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} drops the node-id suffix --dist loadgroup groups by"
            " (pytest-xdist#1386), so the Slurm tests would run side by side: pip install 'pytest<9.2'")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def _module_fixtures(item) -> set[str]:  # noqa: ANN001
    """Names of the fixtures with a module or package scope that this item's module can see."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {name for name, defs in info.name2fixturedefs.items()
            if defs and defs[-1].scope in ("module", "package")}


# In CI every component is installed, so a skip means something is broken: fail it.
# Only skips that no CI machine can satisfy (a real GPU) stay skips. Horovod is built by
# scripts/setup.sh (scripts/build-horovod.sh), so a Horovod skip fails in CI too.
ALLOWED_SKIPS = ("gpu", "nvml", "driver", "the long set")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and os.environ.get("REQUIRE_ALL_COMPONENTS") and not hasattr(rep, "wasxfail"):
        reason = str(rep.longrepr[-1] if isinstance(rep.longrepr, tuple) else rep.longrepr)
        if not any(word in reason.lower() for word in ALLOWED_SKIPS):
            rep.outcome = "failed"
            rep.longrepr = f"skipped in CI, where every component is installed: {reason}"


# ---- the journal/notification contract, checked once a whole run is done (tests/test_contract.py) ----


def _whole_run(config: pytest.Config) -> bool:
    opt = config.option
    if getattr(opt, "keyword", "") or getattr(opt, "markexpr", "") or getattr(opt, "lf", False) or getattr(opt, "deselect", None):
        return False
    return all(Path(a).resolve() == ROOT / "tests" for a in config.args)


JOURNAL_READ_MAX = 64 << 20  # the largest journal a test's supervise writes is well under 1 MiB


def journal_kinds(base: Path) -> tuple[set[str], set[str]]:
    """The journal kinds, and the notified events, that real supervise runs under ``base`` wrote."""
    kinds: set[str] = set()
    notices: set[str] = set()
    for journal in base.rglob("events.jsonl"):
        # Only a real supervise's journal: a regular file, not a link, of a sane size. The tests
        # plant hostile ones (a link to /dev/zero, a FIFO, 200 MB of spaces: tests/report/test_fleet.py)
        # that would read forever or block (CI, stop 28: this check was OOM-killed at 24 GB).
        try:
            st = journal.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_size > JOURNAL_READ_MAX:
                continue
            lines = journal.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if not lines or '"kind":"start"' not in lines[0] and '"kind":"node-start"' not in lines[0]:
            continue  # a journal a unit test wrote by hand, not a real supervise's
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("kind"), str):
                kinds.add(event["kind"])
                if event["kind"] == "notify" and isinstance(event.get("event"), str):
                    notices.add(event["event"])
    return kinds, notices


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After a whole, green run: every kind and notification documented in docs/ was produced by a
    real `supervise` in some test, and nothing undocumented was (read from every run directory the
    tests left under pytest's base temp directory)."""
    if (exitstatus != 0 or not _whole_run(session.config) or os.environ.get("PYTEST_XDIST_WORKER")
            or session.config.option.collectonly):
        return
    from tests.test_contract import NOT_END_TO_END, documented

    base = session.config._tmp_path_factory.getbasetemp()  # noqa: SLF001 - pytest's own temp root
    kinds, notices = journal_kinds(base)
    want_kinds, want_notices = documented("kind") - set(NOT_END_TO_END), documented("event", [ROOT / "docs" / "notify.md"])
    problems = []
    if want_kinds - kinds:
        problems.append(f"documented journal kinds no test's supervise produced: {sorted(want_kinds - kinds)}")
    if kinds - want_kinds - set(NOT_END_TO_END):
        problems.append(f"journal kinds produced but not documented: {sorted(kinds - want_kinds - set(NOT_END_TO_END))}")
    if want_notices - notices:
        problems.append(f"documented notifications no test's supervise sent: {sorted(want_notices - notices)}")
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print("\ncontract: " + "\ncontract: ".join(problems), file=sys.stderr)
    else:
        print(f"\ncontract: {len(kinds)} journal kinds and {len(notices)} notifications, each produced by a real run",
              file=sys.stderr)
