"""The suite's fixtures and hooks; what tests import (helpers, clusters, the webhook) is in tests/support/."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.contract import NOT_END_TO_END, documented, journal_kinds
from tests.support.paths import ROOT
from tests.support.webhook import Server


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


@pytest.fixture
def server() -> Iterator[Server]:
    """A webhook receiver for the notifier (tests/support/webhook.py), closed after the test."""
    s = Server()
    yield s
    s.close()


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
    """Refuse --dist loadgroup where it would not group: the serial tests would run in parallel.
    Start every test process (and so every supervise it runs) with the signals the tests send
    at their defaults: a shell that starts the suite in the background ignores SIGINT (and
    ``nohup`` SIGHUP), an ignored signal is discarded even while blocked, and the tests of what
    supervise does with an early INT or HUP would then test the shell that started them."""
    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL)):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, default)
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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After a whole, green run: every kind and notification documented in docs/ was produced by a
    real `supervise` in some test, and nothing undocumented was (read from every run directory the
    tests left under pytest's base temp directory)."""
    if (exitstatus != 0 or not _whole_run(session.config) or os.environ.get("PYTEST_XDIST_WORKER")
            or session.config.option.collectonly):
        return

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
