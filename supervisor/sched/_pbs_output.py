"""What PBS's tools print, read: ``qstat -f`` as JSON (``-F json``) or as text, ``qstat -Qf``
and ``pbsnodes``; and what the job's attributes mean: its end, its GPUs per node, its state
while it is being stopped, its reruns. Pure functions of the output: asking the server is
``_pbs_server.py``'s, deciding on the answers ``pbs.py``'s.

``qstat -f -F json`` is read first (measured on OpenPBS 23.06: valid JSON, each value whole);
the text, whose long values go on in continuation lines, where a qstat has no JSON (an older PBS
Pro) or its JSON does not parse (PBS Pro before 2020 escaped environment values badly).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping

from supervisor.sched._job import as_int
from supervisor.sched._tool import Report

# JOB_SUBSTATE_RERUN..RERUN3 (OpenPBS src/include/job.h): the server is rerunning the job
# (``qrerun``; measured: substate 60 from the qrerun until the run ends, job_state still R).
PBS_RERUN_SUBSTATES = frozenset({60, 61, 62, 63})


def parse_qstat_json(text: str) -> dict[str, dict[str, str]] | None:
    """``qstat -f -F json`` output → {job id: {attribute: value}}, the same attributes and values
    ``parse_qstat_f`` reads from the text; None when it is not JSON.

    Measured on OpenPBS 23.06 (tests/fixtures/pbs/real/json/): ``{"Jobs": {ID: {…}}}``; a
    resource list is an object (``"Resource_List": {"walltime": "00:05:00", "ncpus": 1}``),
    flattened here to ``Resource_List.walltime``; qstat types every value that reads as JSON
    (``run_count`` 1, ``substate`` 42, an environment value ``true``), written back here as the
    JSON spells it (an environment value ``005`` comes as 5: qstat's cJSON takes it for a number).
    """
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    jobs: dict[str, dict[str, str]] = {}
    listed = doc.get("Jobs") if isinstance(doc, dict) else None
    for job_id, attrs in (listed if isinstance(listed, dict) else {}).items():
        flat: dict[str, str] = {}
        for name, value in (attrs if isinstance(attrs, dict) else {}).items():
            if isinstance(value, dict):
                flat.update({f"{name}.{k}": _as_text(v) for k, v in value.items()})
            else:
                flat[name] = _as_text(value)
        jobs[job_id] = flat
    return jobs


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def parse_qstat_f(text: str) -> dict[str, dict[str, str]]:
    """``qstat -f`` output → {job id: {attribute: value}}.

    Attribute lines are ``    name = value``; a long value goes on in lines that start with
    a tab, which are glued to it without a separator (PBS breaks values anywhere, even inside
    a word). Blank lines separate jobs.
    """
    jobs: dict[str, dict[str, str]] = {}
    cur: dict[str, str] | None = None
    last: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip("\n")
        if line.startswith("Job Id:"):
            cur = jobs.setdefault(line.split(":", 1)[1].strip(), {})
            last = None
        elif cur is None or not line.strip():
            last = None if not line.strip() else last
        elif line.startswith("\t") and last is not None:
            cur[last] += line[1:].rstrip()
        else:
            name, sep, value = line.strip().partition(" = ")
            if sep:
                last = name
                cur[name] = value.rstrip()
    return jobs


def pbs_job_attrs(text: str, job_id: str, report: Report | None = None) -> dict[str, str] | None:
    """The attributes of ``job_id`` in ``qstat -f`` output, JSON or text (the only job listed will do)."""
    jobs = parse_qstat_json(text) if text.lstrip().startswith("{") else None
    if jobs is None:
        jobs = parse_qstat_f(text)
    attrs = jobs.get(job_id) or (next(iter(jobs.values())) if len(jobs) == 1 else None)
    if attrs is None and report is not None:
        report(f"qstat -f {job_id} did not list the job")
    return attrs


def parse_walltime(text: str) -> float | None:
    """PBS ``HH:MM:SS`` (hours may exceed 24), ``MM:SS`` or plain seconds → seconds."""
    parts = text.strip().split(":")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        return None
    if not 1 <= len(nums) <= 3 or any(n < 0 for n in nums):
        return None
    total = 0.0
    for n in nums:
        total = total * 60 + n
    return total


def parse_pbs_time(text: str) -> float | None:
    """``Thu Nov 20 10:15:32 2025`` (ctime, local time) or epoch seconds → unix seconds."""
    s = " ".join(text.split())
    if s.isdigit():
        return float(s)
    try:
        return time.mktime(time.strptime(s, "%a %b %d %H:%M:%S %Y"))
    except (ValueError, OverflowError):
        return None


def pbs_end_time(attrs: Mapping[str, str], now: float) -> float | None:
    """End of a PBS job from its ``qstat -f`` attributes: start + walltime limit.

    The start is ``stime`` (PBS Pro) or ``start_time`` (Torque-style); without one, the
    walltime already used is taken off the limit. None when there is no walltime limit.
    """
    limit = attrs.get("Resource_List.walltime")
    walltime = parse_walltime(limit) if limit else None
    if walltime is None:
        return None
    for key in ("stime", "start_time"):
        if attrs.get(key):
            start = parse_pbs_time(attrs[key])
            if start is not None:
                return start + walltime
    used = attrs.get("resources_used.walltime")
    used_s = parse_walltime(used) if used else None
    if used_s is not None:
        return now + walltime - used_s
    return None


def pbs_gpus_per_node(attrs: Mapping[str, str]) -> int | None:
    """GPUs per node from ``qstat -f`` attributes.

    ``ngpus=N`` in the first chunk of ``Resource_List.select`` (``2:ncpus=64:ngpus=4``), else
    in the first vnode of ``exec_vnode`` (Polaris' select names only ``system=polaris``),
    else ``Resource_List.ngpus`` (a job total) over ``Resource_List.nodect``.
    """
    for key in ("Resource_List.select", "exec_vnode"):
        first_chunk = attrs.get(key, "").split("+")[0]
        m = re.search(r"\bngpus=(\d+)", first_chunk)
        if m:
            return int(m.group(1))
    total, nodes = as_int(attrs.get("Resource_List.ngpus")), as_int(attrs.get("Resource_List.nodect"))
    if total is not None and nodes:
        return total // nodes
    return None


@dataclass(frozen=True)
class PbsView:
    """What ``qstat -f`` says of the job while it is being stopped (measured, OpenPBS 23.06).

    During a ``qdel``'s kill_delay the job stays ``job_state = R`` (substate 42) with no
    ``Exit_status``; only the ``comment`` changes, at once, to ``... and terminated by
    USER@HOST``. During a ``qrerun`` it is ``R`` with substate 60 (RERUN); ``run_count`` rises
    only when the next run starts. At the walltime's TERM nothing changes (the comment says
    ``exceeded resource walltime`` only once the job has finished)."""

    state: str | None           # job_state: R, E, Q, F, ...
    substate: int | None
    run_count: int | None       # runs so far, this one included (1 on the first)
    terminated_by: str | None   # USER@HOST of a qdel, from the comment
    queue: str | None

    @property
    def rerunning(self) -> bool:
        return self.substate in PBS_RERUN_SUBSTATES


def parse_pbs_view(attrs: Mapping[str, str] | None) -> PbsView | None:
    """``qstat -f`` attributes (``pbs_job_attrs``) → PbsView; None without a job_state."""
    if not attrs or not attrs.get("job_state"):
        return None
    # the text (parse_qstat_f) glues continuation lines without a separator: "terminated by" +
    # "alice@head"; the JSON keeps the space
    m = re.search(r"\bterminated by\s*(\S+)", attrs.get("comment", ""))
    return PbsView(state=attrs["job_state"].strip(), substate=as_int(attrs.get("substate")),
                   run_count=as_int(attrs.get("run_count")), terminated_by=m.group(1) if m else None,
                   queue=attrs.get("queue") or None)


def pbs_reason(view: PbsView | None, was: str) -> tuple[str, bool]:
    """(reason, requeued by the scheduler) from ``qstat -f`` after a SIGTERM under PBS: a
    ``qdel`` is ``cancelled``; a ``qrerun`` (an operator's) requeues the job, whatever we took
    the TERM for (kept, as under Slurm: a deadline stays one, else a preemption); anything else
    (the walltime: nothing changes) stays what the signal's timing said."""
    if view is None:
        return was, False
    if view.rerunning:
        return ("deadline" if was == "deadline" else "preempted"), True
    if view.terminated_by is not None:
        return "cancelled", False
    return was, False


def pbs_restart_count(attrs: Mapping[str, str] | None) -> int | None:
    """Reruns before this run: ``run_count`` − 1 (qstat -f only; PBS sets no variable)."""
    count = as_int((attrs or {}).get("run_count"))
    return max(0, count - 1) if count is not None else None


def parse_kill_delay(text: str) -> float | None:
    """``kill_delay`` of ``qstat -Qf QUEUE`` output (seconds); None when the queue has none set."""
    m = re.search(r"^\s*kill_delay\s*=\s*(\d+)\s*$", text, re.M)
    return float(m.group(1)) if m else None


def parse_pbsnodes(out: str) -> tuple[str, str] | None:
    """(state, comment) from the text of ``pbsnodes HOST``; None without a state line (an
    unknown node: ``pbsnodes: Unknown node``, on stderr, leaves stdout empty)."""
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(" = ") for line in out.splitlines()) if v}
    if "state" not in fields:
        return None
    return fields["state"], fields.get("comment", "")
