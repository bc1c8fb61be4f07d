"""The PBS cluster's fixtures: one 3-node OpenPBS for every PBS test of the session
(``PbsCluster``, tests/support/pbs.py; docs/pbs.md, "The test cluster"), and each test's view
of it. Where this machine cannot run it (not root, no OpenPBS), the tests skip with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.pbs import DOWN, UP, PbsCluster, keep_journals, why_not


@pytest.fixture(scope="session")
def pbs_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PbsCluster]:
    """One 3-node PBS cluster for every PBS test of this session (one worker: the xdist group):
    a 2-node job can be rerun without a node that died."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="supervise-pbs-", dir="/var/tmp"))
    proc = subprocess.run(["bash", str(UP), str(root), "--nodes", "3"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, timeout=120)
        pytest.fail(f"pbs-up.sh failed ({proc.returncode}): {proc.stderr[-3000:]}")
    try:
        yield PbsCluster(root, 3)
    finally:
        subprocess.run(["bash", str(DOWN), str(root)], capture_output=True, timeout=180)
        keep_journals(root, tmp_path_factory.mktemp("pbs-journals"))
        if not os.environ.get("SUPERVISE_KEEP_PBS"):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pbs(pbs_session: PbsCluster) -> Iterator[PbsCluster]:
    """The session's cluster as each test finds it: PBS's own kill_delay (10 s), no operators,
    and no job of an earlier test left when it ends."""
    pbs = pbs_session
    pbs.qmgr("set queue workq kill_delay = 10")
    pbs.admin("qmgr", "-c", "unset server operators", check=False)
    yield pbs
    left = pbs.admin("qselect", check=False).stdout.split()
    if left:
        pbs.admin("qdel", "-W", "force", *left, check=False)
