"""Questions a test asks of one supervised run's journal, whatever scheduler ran it."""

from __future__ import annotations

from pathlib import Path

from tests.support import journal


class RunJournal:
    """Mixed into a test's job object: ``run`` is the run directory, ``tail()`` what to show
    when an expectation fails (the job's output)."""

    @property
    def run(self) -> Path:
        raise NotImplementedError

    def tail(self, n: int = 40) -> str:
        raise NotImplementedError

    def events(self, kind: str | None = None, attempt: int | None = None) -> list[dict]:
        return [e for e in journal.events(self.run, kind) if attempt is None or e.get("attempt") == attempt]

    def one(self, kind: str, attempt: int | None = None, **match: object) -> dict:
        """The one event of ``kind`` (in ``attempt``) whose fields match; fails if not exactly one."""
        found = [e for e in self.events(kind, attempt) if all(e.get(k) == v for k, v in match.items())]
        assert len(found) == 1, f"expected one {kind} {match} (attempt {attempt}), got {found}\n{self.tail()}"
        return found[0]

    def step(self, name: str, attempt: int | None = None) -> dict:
        return self.one("stop-step", attempt, step=name)


def first_publish_after(job: RunJournal, t: float, attempt: int | None = None) -> dict | None:
    """The first checkpoint (not a pointer) the run published at or after ``t``, or None."""
    pubs = [e for e in job.events("publish", attempt) if not e.get("pointer") and e["t"] >= t]
    return min(pubs, key=lambda e: e["t"]) if pubs else None
