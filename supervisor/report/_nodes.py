"""One row per node of a multi-node run: where its samples went and what became of it.

A multi-node run directory holds the batch node's samples beside the leader's journal
(``gpu.csv``, ``host.csv``) and every other node's in ``nodes/node-K/`` (the node agent's
journal and samples; docs/multinode.md). ``node-K`` is a node *rank*, not a machine: after a
requeue onto other nodes, node 1 may be another host. So every sample row goes to the host
that held that rank at the row's time: the leader's ``start`` events (``host``) split its own
files, each agent's ``node-start`` events (``host``) split its node's. The rows are keyed by
hostname, with the roles each host had (``start.nodes``: attempt → node rank → host).

What a row says went wrong, from the journals: the node died (``node-lost``), its agent was
not ready (``node-agents.missing``), its agent left no ``end`` (killed with its node when
it is lost, else stopped or hung),
its copies failed (``sync-failed``), its local disk could not hold another checkpoint
(``local-disk-full``), its GPUs had a hardware fault (``gpu-xid``,
``gpu-lost``: suspect), or it was in an attempt and not in a later one (excluded, busy or
down), or it did not answer the leader's last flush though it held no part of any checkpoint
(``partless_nodes``: then the verdict names nothing of it as left on local disk). The sample
files are streamed once in bounded memory, as the leader's are.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from supervisor._units import natural_key
from supervisor.journal import EVENTS_FILE, NODES_DIR, read_journal
from supervisor.report._load import GPU_FILE, HOST_FILE, _f, _rows
from supervisor.sched import label_of


@dataclass
class NodeRow:
    node: str  # hostname
    roles: list[list[int]]  # [attempt, node rank] for each attempt the node was in
    gpu_samples: int = 0
    gpus: int = 0  # distinct GPU devices sampled on it
    util_mean_pct: float | None = None
    host_samples: int = 0
    mem_min_available_mib: float | None = None
    mem_total_mib: float | None = None
    load1_mean: float | None = None
    lost: bool = False  # `node-lost`: the scheduler called it down after an attempt it was in
    suspect: bool = False  # a GPU hardware fault on it
    problems: list[str] = field(default_factory=list)  # one phrase each, worst first


@dataclass
class _Acc:
    gpu_n: int = 0
    util_n: int = 0
    util_sum: float = 0.0
    uuids: set[str] = field(default_factory=set)
    host_n: int = 0
    avail_min: float | None = None
    total: float | None = None
    load_n: int = 0
    load_sum: float = 0.0


class _Windows:
    """Which host held a directory's samples at a time: the latest start at or before it (a
    row before the first start is the first start's)."""

    def __init__(self, starts: list[tuple[float, str]]) -> None:
        starts = sorted(starts)
        self.times = [t for t, _ in starts]
        self.hosts = [h for _, h in starts]

    def host(self, t: float) -> str | None:
        if not self.hosts:
            return None
        return self.hosts[max(0, bisect.bisect_right(self.times, t) - 1)]


def _agent_windows(evs: list[dict[str, Any]]) -> _Windows:
    """A node agent's directory: each ``node-start`` says which host its samples came from."""
    return _Windows([(float(e["t"]), e["host"]) for e in evs if e.get("kind") == "node-start" and isinstance(e.get("host"), str)])


def _scan(where: Path, windows: _Windows, accs: dict[str, _Acc]) -> None:
    """Stream ``where``'s gpu.csv and host.csv into the per-host accumulators."""
    if not windows.hosts:
        return
    try:
        _scan_files(where, windows, accs)
    except OSError:
        pass  # an unreadable node's files: its row has the samples read so far, the report goes on


def _scan_files(where: Path, windows: _Windows, accs: dict[str, _Acc]) -> None:
    for a, cols, row in _timed_rows(where / GPU_FILE, windows, accs):
        a.gpu_n += 1
        u = cols.get("uuid")
        if u is not None and u < len(row) and row[u]:
            a.uuids.add(row[u])
        util = _cell(cols, row, "util_gpu_pct")
        if util is not None:
            a.util_n += 1
            a.util_sum += util
    for a, cols, row in _timed_rows(where / HOST_FILE, windows, accs):
        a.host_n += 1
        avail, total, load = (_cell(cols, row, k) for k in ("node_mem_available_mib", "node_mem_total_mib", "load1"))
        if avail is not None:
            a.avail_min = avail if a.avail_min is None else min(a.avail_min, avail)
        if total is not None:
            a.total = total
        if load is not None:
            a.load_n += 1
            a.load_sum += load


def _timed_rows(path: Path, windows: _Windows, accs: dict[str, _Acc]) -> Iterator[tuple[_Acc, dict[str, int], list[str]]]:
    """Each row of a sample file that has a time, with the accumulator of the host that held
    the directory then."""
    if not path.is_file():
        return
    for cols, row in _rows(path):
        t = _cell(cols, row, "time")
        if t is not None:
            yield accs.setdefault(str(windows.host(t)), _Acc()), cols, row


def _cell(cols: dict[str, int], row: list[str], name: str) -> float | None:
    i = cols.get(name)
    return _f(row[i]) if i is not None and i < len(row) else None


def _attempts(nums: list[int]) -> str:
    return f"attempt{'s' if len(nums) > 1 else ''} {', '.join(map(str, nums))}"


def _no_end(r: NodeRow | None, attempt: int) -> str:
    """Why an agent's attempt has no ``end``, as far as the journals tell: its node died
    (``node-lost``), or it stayed up (it served a later attempt: the agent was stopped or
    hung), or nothing says which. A surviving node is never called killed (issue 30)."""
    if r is not None and r.lost:
        return "killed with its node"
    if r is not None and any(a > attempt for a, _ in r.roles):
        return "the node stayed up: the agent was stopped or hung"
    return "the agent was killed or hung"


def _node_journals(run_dir: Path) -> list[tuple[int, list[dict[str, Any]], Path]]:
    """(node rank, its agent's events, its directory) for each ``nodes/node-K/`` that can be read."""
    node_dirs = sorted((run_dir / NODES_DIR).glob("node-*")) if (run_dir / NODES_DIR).is_dir() else []
    out = []
    for d in node_dirs:
        try:
            rank = int(d.name.split("-", 1)[1])
            evs = read_journal(d / EVENTS_FILE).events if (d / EVENTS_FILE).is_file() else []
        except (ValueError, OSError, UnicodeDecodeError):
            continue
        out.append((rank, [e for e in evs if isinstance(e, dict) and isinstance(e.get("t"), (int, float))], d))
    return out


def node_events(run_dir: Path, kinds: frozenset[str]) -> list[dict[str, Any]]:
    """Every node agent's events of ``kinds`` (``nodes/node-K/events.jsonl``), in journal order per node."""
    return [e for _rank, evs, _d in _node_journals(run_dir) for e in evs if e.get("kind") in kinds]


# The leader's line for a node that did not answer its last flush, or that the scheduler calls
# down (conduct/fleet.py, ``Fleet.flush``): said of any node, whether it held a part or not.
_PART_MAY_BE_MISSING = re.compile(r"^node (\d+)\b[^:]*: .*its newest part may be missing$")
# What in a node's own journal says it held a part of a checkpoint on its local disk.
AGENT_ENDS = frozenset({"end", "node-end"})  # a node agent's last line (``node-end``: journals before issue 46)
_HELD = frozenset({"part", "part-withdrawn", "local-disk-full", "torn", "sync-deferred", "part-set-aside"})


def silent_node(line: str) -> int | None:
    """The node rank a ``not_durable`` line says may be missing its newest part, else None."""
    m = _PART_MAY_BE_MISSING.match(line)
    return int(m.group(1)) if m else None


def partless_nodes(run_dir: Path, events: list[dict[str, Any]],
                   node_journals: list[tuple[int, list[dict[str, Any]], Path]] | None = None) -> dict[int, str]:
    """The node ranks that held no part of any checkpoint, each with why we know (issue 42).

    The leader says "its newest part may be missing" of every node that did not answer its
    last flush, whether it ever had a part or not; it cannot look at that node's disk. The
    journals can tell: node K held no part when its own journal staged nothing (no ``part``,
    no pass that copied a file of a checkpoint pair, no part set aside, withdrawn, deferred or
    torn, no last flush that named one) and the per-node pairs published at least one version,
    none with a part from K (each ``whole on node J``, a single file that another node's
    rank wrote). No journal of K, or no version published: unknown, so it is not said."""
    pubs = [e for e in events if e.get("kind") == "publish" and not e.get("pointer")
            and isinstance(e.get("nodes"), int) and e["nodes"] > 1]
    if not pubs:
        return {}
    from_nodes = sorted({m.group(1) for e in pubs if (m := re.match(r"whole on node (\d+)$", str(e.get("why") or "")))})
    waited = {str(k) for e in events if e.get("kind") == "parts-waiting" for k in e.get("have") or []}
    out = {}
    for rank, evs, _ in _node_journals(run_dir) if node_journals is None else node_journals:
        if not any(e.get("kind") == "node-start" for e in evs):
            continue
        if any(str(rank) in (e.get("parts") or {}) for e in pubs) or str(rank) in waited:
            continue
        checkpoint_pairs = {str(p.get("name")) for e in evs if e.get("kind") == "node-start"
                            for p in e.get("pairs") or [] if isinstance(p, dict) and p.get("kind") == "checkpoint"}
        staged = any(e.get("kind") in _HELD
                     or (e.get("kind") == "sync" and e.get("files") and str(e.get("pair")) in checkpoint_pairs)
                     or (e.get("kind") == "node-flush" and e.get("not_durable"))
                     for e in evs)
        if not staged:
            came = (f"every version was published whole from node {', '.join(from_nodes)}"
                    if len(from_nodes) and all(str(e.get("why") or "").startswith("whole on node") for e in pubs)
                    else "no published version had a part from it")
            out[rank] = f"its journal staged nothing, and {came}"
    return out


def node_rows(run_dir: Path, events: list[dict[str, Any]], *, samples: bool = True) -> list[NodeRow]:
    """The per-node rows of a multi-node run (an attempt on several nodes, or node agents'
    directories); ``[]`` for a single-node run. ``samples=False`` reads only the journals."""
    node_journals = _node_journals(run_dir)
    starts = [e for e in events if e.get("kind") == "start"]
    allocation = {int(e.get("attempt") or 0): [str(n) for n in (e.get("nodes") or [])] or ([str(e["host"])] if e.get("host") else [])
                  for e in starts}
    if not node_journals and not any(len(nodes) > 1 for nodes in allocation.values()):
        return []
    rows: dict[str, NodeRow] = {}

    def row(host: str) -> NodeRow:
        return rows.setdefault(host, NodeRow(host, []))

    for attempt, nodes in sorted(allocation.items()):
        for rank, host in enumerate(nodes):
            row(host).roles.append([attempt, rank])
    accs: dict[str, _Acc] = {}
    leader_windows = _Windows([(float(e["t"]), str(e["host"])) for e in starts if e.get("host")])
    if samples:
        _scan(run_dir, leader_windows, accs)
        for _, evs, d in node_journals:
            _scan(d, _agent_windows(evs), accs)
    for host, a in accs.items():
        r = row(host)
        r.gpu_samples, r.gpus, r.host_samples = a.gpu_n, len(a.uuids), a.host_n
        r.util_mean_pct = round(a.util_sum / a.util_n, 1) if a.util_n else None
        r.mem_min_available_mib, r.mem_total_mib = a.avail_min, a.total
        r.load1_mean = round(a.load_sum / a.load_n, 2) if a.load_n else None

    problems: dict[str, list[tuple[int, str]]] = {}  # host → (rank of badness, phrase)

    def say(host: str | None, level: int, text: str) -> None:
        if host:
            problems.setdefault(host, []).append((level, text))

    def at(attempt: Any, rank: Any) -> str | None:
        nodes = allocation.get(int(attempt or 0), [])
        return nodes[rank] if isinstance(rank, int) and 0 <= rank < len(nodes) else None

    def sampled(e: dict[str, Any], windows: _Windows) -> None:
        """A GPU fault or a failed copy, on the host that held this directory's node then."""
        kind, host = e.get("kind"), windows.host(float(e["t"]))
        if host is None:
            return
        if kind in ("gpu-xid", "gpu-lost") or (kind == "gpu-end" and (e.get("ecc_uncorrected_delta") or 0) > 0):
            say(host, 1, _fault(e))
            row(host).suspect = True
        elif kind == "sync-failed":
            say(host, 2, "sync failed")
        elif kind == "local-disk-full":
            say(e.get("host") if isinstance(e.get("host"), str) else host, 1,
                f"local disk full in attempt {e.get('attempt')} ({_size(e.get('free_bytes'))} free, "
                f"{e.get('checkpoint')} takes {_size(e.get('need_bytes'))})")

    for e in events:
        kind = e.get("kind")
        if kind == "node-lost" and isinstance(e.get("node"), str):
            row(e["node"]).lost = True
            why = ", ".join(str(x) for x in (e.get("state"), e.get("reason")) if x)
            lost = e.get("lost") or []
            said_by = label_of(str(e.get("scheduler") or "slurm"))  # who called it down; before the field: Slurm
            say(e["node"], 0, f"LOST in attempt {e.get('in_attempt')}" + (f" ({said_by}: {why})" if why else "")
                + (f"; never published: {', '.join(map(str, lost))}" if lost else ""))
        elif kind == "node-agents":
            for k in e.get("missing") or []:
                say(at(e.get("attempt"), k), 1, f"agent not ready in attempt {e.get('attempt')}")
        else:
            sampled(e, leader_windows)
    for rank, evs, _ in node_journals:
        windows = _agent_windows(evs)
        by_attempt: dict[int, list[dict[str, Any]]] = {}
        for e in evs:
            by_attempt.setdefault(int(e.get("attempt") or 0), []).append(e)
        for attempt, aevs in sorted(by_attempt.items()):
            start = next((e for e in aevs if e.get("kind") == "node-start"), None)
            if start is None:
                continue
            host = str(start.get("host"))
            if not any(e.get("kind") in AGENT_ENDS for e in aevs):
                say(host, 1, f"its agent (node {rank}) left no end in attempt {attempt} ({_no_end(rows.get(host), attempt)})")
        for e in evs:
            sampled(e, windows)
    partless = partless_nodes(run_dir, events, node_journals)
    for e in events:
        if e.get("kind") == "end":
            for k in sorted(set(partless).intersection(silent_node(str(line)) for line in e.get("not_durable") or [])):
                say(at(e.get("attempt"), k), 1, f"no answer to the last flush of attempt {e.get('attempt')}, but it "
                                                f"held no part of any checkpoint ({partless[k]}): nothing left on its disk")
    attempts = sorted(allocation)
    for host, r in rows.items():
        mine = sorted({a for a, _ in r.roles})
        later = [a for a in attempts if mine and a > mine[0] and a not in mine]
        if later and not r.lost:  # a lost node's absence after its death is said by LOST
            say(host, 3, f"not in {_attempts(later)}")
    for host, r in rows.items():
        seen: dict[str, int] = {}
        for _level, text in sorted(problems.get(host, []), key=lambda p: p[0]):
            seen[text] = seen.get(text, 0) + 1
        r.problems = [f"{text} ×{n}" if n > 1 else text for text, n in seen.items()]
    return sorted(rows.values(), key=lambda r: (r.roles[0] if r.roles else [10**9, 0], natural_key(r.node)))


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "?"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return "?"


def _fault(e: dict[str, Any]) -> str:
    kind = e.get("kind")
    if kind == "gpu-xid":
        return f"GPU fault: XID {e.get('xid')} (suspect)"
    if kind == "gpu-lost":
        return "GPU fault: a GPU lost (suspect)"
    return "GPU fault: uncorrected ECC errors (suspect)"
