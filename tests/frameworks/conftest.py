"""Fixtures for the framework tests: one scratch ``Run`` per case, with the poller on its
persistent side; a case whose library is missing skips with the reason (a failure in CI,
where REQUIRE_ALL_COMPONENTS=1 and scripts/setup.sh installs every library)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.frameworks._harness import CASES, Poller, Run


@pytest.fixture
def open_run(tmp_path: Path) -> Iterator[Callable[[str], tuple[Run, Poller]]]:
    pollers: list[Poller] = []
    runs: list[Run] = []

    def make(case_id: str) -> tuple[Run, Poller]:
        case = CASES[case_id]
        why = case.missing()
        if why:
            pytest.skip(why)
        run = Run(case, tmp_path / case_id)
        poller = Poller.start(case.loader, run.persistent, tmp_path / f"{case_id}-sightings.jsonl")
        pollers.append(poller)
        runs.append(run)
        return run, poller

    yield make
    for p in pollers:
        p.stop()
    for r in runs:
        r.close()
