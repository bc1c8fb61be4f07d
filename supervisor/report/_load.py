"""Read a run directory in one pass and in bounded memory.

The journal is small (events, not samples) and is read whole with the tolerant reader.
``gpu.csv`` and ``host.csv`` can hold millions of rows after a week on eight GPUs, so they
are streamed once: every GPU keeps running sums, a 1 %-bin histogram for percentiles and a
fixed number of time buckets for the plots. Memory does not grow with the run's length.
"""

from __future__ import annotations

import csv
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from supervisor.journal import EVENTS_FILE, JournalRead, read_journal

GPU_FILE = "gpu.csv"
HOST_FILE = "host.csv"
BUCKETS = 720  # plot points per series: one per ~14 min over a week, one per sample on short runs
MIN_BUCKET_S = 1.0


class Histogram:
    """Counts of 0–100 % in 1 % bins: percentiles exact to 1 %, in constant memory."""

    def __init__(self) -> None:
        self.bins = [0] * 101
        self.n = 0

    def add(self, pct: float) -> None:
        self.bins[min(100, max(0, int(pct + 0.5)))] += 1
        self.n += 1

    def quantile(self, q: float) -> float | None:
        if not self.n:
            return None
        rank = math.ceil(q * self.n)  # nearest-rank, as for a sorted list
        seen = 0
        for pct, count in enumerate(self.bins):
            seen += count
            if seen >= rank:
                return float(pct)
        return 100.0


class Grid:
    """A shared time axis of at most ``BUCKETS`` buckets that coarsens as rows arrive.

    The run's length is not known before the CSV is read (a run in progress writes rows
    after its last journal event), so when a row falls past the last bucket every series
    on the grid merges neighbouring buckets pairwise and the bucket width doubles.
    """

    def __init__(self, origin: float, width: float, n: int = BUCKETS) -> None:
        self.origin = origin
        self.width = max(MIN_BUCKET_S, width)
        self.n = n
        self.series: list[Series] = []

    def index(self, t: float) -> int:
        i = int((t - self.origin) // self.width)
        while i >= self.n:
            for s in self.series:
                s.coarsen()
            self.width *= 2
            i = int((t - self.origin) // self.width)
        return max(0, i)

    def times(self) -> list[float]:
        return [self.origin + (i + 0.5) * self.width for i in range(self.n)]


class Series:
    """One downsampled metric: per bucket the mean (``mode="mean"``) or the maximum."""

    def __init__(self, grid: Grid, mode: str = "mean") -> None:
        self.mode = mode
        self.sum = [0.0] * grid.n
        self.cnt = [0] * grid.n
        grid.series.append(self)

    def add(self, i: int, v: float) -> None:
        if self.mode == "max":
            if not self.cnt[i] or v > self.sum[i]:
                self.sum[i] = v
        else:
            self.sum[i] += v
        self.cnt[i] += 1

    def coarsen(self) -> None:
        n = len(self.sum)
        s, c = [0.0] * n, [0] * n
        for j in range(n // 2):
            a, b = 2 * j, 2 * j + 1
            c[j] = self.cnt[a] + self.cnt[b]
            if self.mode == "max":
                vals = [self.sum[k] for k in (a, b) if self.cnt[k]]
                s[j] = max(vals) if vals else 0.0
            else:
                s[j] = self.sum[a] + self.sum[b]
        self.sum, self.cnt = s, c

    def values(self) -> list[float | None]:
        """Per bucket, None where no row fell: the plot shows a gap (e.g. between attempts)."""
        if self.mode == "max":
            return [round(v, 2) if c else None for v, c in zip(self.sum, self.cnt)]
        return [round(v / c, 2) if c else None for v, c in zip(self.sum, self.cnt)]


@dataclass
class GpuAcc:
    """Running aggregates of the job's GPU ``index`` over all attempts.

    A requeued job may land on another node: its GPU 0 is then another device (another
    UUID), but it is still the job's GPU 0, which is what the researcher asks about. The
    UUIDs are kept, in order, for the hardware faults.
    """

    index: int
    uuid: str  # the last one seen
    grid: Grid
    uuids: list[str] = field(default_factory=list)
    samples: int = 0
    util_n: int = 0
    util_sum: float = 0.0
    util_hist: Histogram = field(default_factory=Histogram)
    mem_peak: float | None = None
    mem_total: float | None = None
    proc_mem_peak: float | None = None
    power_n: int = 0
    power_sum: float = 0.0
    power_max: float | None = None
    temp_max: float | None = None
    energy_done: float = 0.0  # J of earlier attempts (the counter restarts with each sampler)
    energy_last: float | None = None
    throttle_s: dict[str, float] = field(default_factory=dict)
    sampled_s: float = 0.0
    last_t: float | None = None
    first_t: float | None = None

    def __post_init__(self) -> None:
        self.s_util = Series(self.grid)
        self.s_mem = Series(self.grid, "max")
        self.s_power = Series(self.grid)

    def new_segment(self) -> None:
        if self.energy_last is not None:
            self.energy_done += self.energy_last
            self.energy_last = None

    @property
    def energy_j(self) -> float | None:
        if self.energy_last is None and not self.energy_done:
            return None
        return self.energy_done + (self.energy_last or 0.0)


@dataclass
class HostAcc:
    grid: Grid
    samples: int = 0
    cpu_n: int = 0
    cpu_sum: float = 0.0
    cpu_max: float | None = None
    rss_peak: float | None = None
    nprocs_max: int = 0
    node_mem_total: float | None = None
    node_avail_min: float | None = None

    def __post_init__(self) -> None:
        self.s_cpu = Series(self.grid)
        self.s_rss = Series(self.grid, "max")


@dataclass
class RunData:
    """Everything the report knows, read from the run directory."""

    run_dir: Path
    journal: JournalRead
    grid: Grid
    gpus: list[GpuAcc]
    host: HostAcc | None
    gpu_bad_rows: int = 0
    host_bad_rows: int = 0
    malformed_events: int = 0  # JSON objects without a numeric time or attempt: left out


T_MAX = 1e11  # unix seconds past year 5000: a time no journal can hold (1e308 broke the timeline)

# Fields the report reads, by the type it expects. A field of another type (a hand-edited
# or foreign journal) is dropped from its event, not trusted: the report then says "unknown".
_STR_FIELDS = frozenset({"checkpoint", "pair", "uuid", "reason", "step", "name", "why", "signal",
                         "outcome", "launcher", "source", "scheduler", "job_id", "host", "error", "detail"})
_NUM_FIELDS = frozenset({"lag_s", "seconds", "every", "end", "lead_s", "ecc_uncorrected_delta",
                         "ecc_corrected_delta", "grace_s", "bound_s", "kill_in_s", "left_s", "time_left_s"})
_INT_FIELDS = frozenset({"exit_status", "restart_count", "files", "bytes", "pid", "restarts"})
_LIST_FIELDS = frozenset({"not_durable", "killed", "devices", "argv", "command", "sent_to"})
_BOOL_FIELDS = frozenset({"graceful", "requeued", "requeued_by_scheduler", "pointer"})


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e300 and v - v == 0


def _well_formed(e: dict[str, Any]) -> bool:
    """An event the report can place: a finite, plausible time and an integer attempt."""
    t: Any = e.get("t")
    a: Any = e.get("attempt", 0)
    return (_finite(t) and 0 <= t < T_MAX and isinstance(a, int) and not isinstance(a, bool) and 0 <= a < 10**6
            and isinstance(e.get("kind"), str))


def _field_ok(k: str, v: Any) -> bool:
    if v is None:
        return True
    if k in _STR_FIELDS:
        return isinstance(v, str)
    if k in _NUM_FIELDS:
        return _finite(v)
    if k in _INT_FIELDS:
        return isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**63
    if k in _LIST_FIELDS:
        return isinstance(v, list)
    if k in _BOOL_FIELDS:
        return isinstance(v, bool)
    if k == "scheduler_env":
        return isinstance(v, dict)
    return not isinstance(v, float) or _finite(v)


_CHECKED = _STR_FIELDS | _NUM_FIELDS | _INT_FIELDS | _LIST_FIELDS | _BOOL_FIELDS | {"scheduler_env"}


def _typed(e: dict[str, Any]) -> dict[str, Any]:
    """``e`` without the fields whose type is not the one the report reads. Most events have
    none: they are returned as they are, checked without a call per field (the fleet view
    reads a thousand journals)."""
    for k, v in e.items():
        if k in _CHECKED:
            if v is not None and not _field_ok(k, v):
                break
        elif type(v) is float and not (v - v == 0 and abs(v) < 1e300):
            break
    else:
        return e
    return {k: v for k, v in e.items() if _field_ok(k, v)}


def _f(cell: str) -> float | None:
    if not cell:
        return None
    try:
        v = float(cell)
    except ValueError:
        return None
    return v if v - v == 0 else None  # finite: inf - inf and nan - nan are nan


def _rows(path: Path) -> Iterator[tuple[dict[str, int], list[str]]]:
    """Rows of a CSV with the column positions by name; a repeated header row is skipped."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header:
            return
        cols = {name: i for i, name in enumerate(header)}
        for row in reader:
            if row and row[0] == header[0]:
                continue
            yield cols, row


def load(run_dir: Path, *, buckets: int = BUCKETS, samples: bool = True) -> RunData:
    """Read the journal and stream the sample files of ``run_dir`` (``samples=False``: only the
    GPUs' indices from the head of ``gpu.csv``, for the fleet view)."""
    journal = read_journal(run_dir / EVENTS_FILE)
    if not samples:
        buckets = 1  # no plots: no time buckets to hold
    good = [_typed(e) for e in journal.events if _well_formed(e)]
    malformed = len(journal.events) - len(good)
    journal.events = good
    times = [e["t"] for e in journal.events if isinstance(e.get("t"), (int, float))]
    t0, t1 = (min(times), max(times)) if times else (0.0, 0.0)
    every = max((float(e.get("every") or 0) for e in journal.events if e.get("kind") == "gpu-start"), default=0.0)
    grid = Grid(t0, (t1 - t0) / buckets, buckets)
    data = RunData(run_dir, journal, grid, [], None, malformed_events=malformed)
    if not samples:
        if (run_dir / GPU_FILE).exists():
            data.gpus = [GpuAcc(i, uuid, grid, [uuid]) for i, uuid in sorted(gpu_indices(run_dir / GPU_FILE).items())]
        return data
    if (run_dir / GPU_FILE).exists():
        _scan_gpu(run_dir / GPU_FILE, data, every or 10.0, times_known=bool(times))
    if (run_dir / HOST_FILE).exists():
        _scan_host(run_dir / HOST_FILE, data, times_known=bool(times))
    return data


GPU_FIELDS = ("time", "gpu", "uuid", "util_gpu_pct", "mem_used_mib", "mem_total_mib", "proc_mem_mib", "power_w",
              "temp_c", "energy_j", "clock_events")


HEAD_BYTES = 64 * 1024  # far more than one sampling round of any node's GPUs


def gpu_indices(path: Path) -> dict[int, str]:
    """GPU index → UUID from the head of ``gpu.csv``: the sampler writes every GPU in each round,
    so the first round names them all; reading stops when an index comes again."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO planted there never blocks
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        head = f.read(HEAD_BYTES)
    lines = head.decode("utf-8", "replace").split("\n")
    if len(head) == HEAD_BYTES:
        lines = lines[:-1]  # cut in the middle
    out: dict[int, str] = {}
    cols: dict[str, int] = {}
    for row in csv.reader(lines):
        if not row:
            continue
        if "gpu" in row and "time" in row:
            cols = {name: i for i, name in enumerate(row)}
            continue
        try:
            index = int(row[cols["gpu"]])
            float(row[cols["time"]])
        except (KeyError, ValueError, IndexError):
            continue
        if index in out:
            break  # the next round
        u = cols.get("uuid")
        out[index] = row[u] if u is not None and u < len(row) else ""
    return out


def _scan_gpu(path: Path, data: RunData, every: float, *, times_known: bool) -> None:
    accs: dict[int, GpuAcc] = {}
    gap = 2.5 * every  # a longer silence is a gap (another attempt), not time spent in a state
    header: dict[str, int] | None = None
    for cols, row in _rows(path):
        if cols is not header:  # positions by name, once per header: this loop runs millions of times
            header = cols
            width = len(cols)
            ix = [cols.get(name, width) for name in GPU_FIELDS]  # a missing column reads as an empty cell
        if len(row) <= width:
            row = row + [""] * (width + 1 - len(row))
        try:
            t = float(row[ix[0]])
            index = int(row[ix[1]])
        except ValueError:
            data.gpu_bad_rows += 1
            continue
        uuid = row[ix[2]]
        if not times_known and not accs:
            data.grid.origin = t
        g = accs.get(index)
        if g is None:
            g = accs[index] = GpuAcc(index, uuid, data.grid)
        if uuid != g.uuid or not g.uuids:
            if g.uuids:
                g.new_segment()  # another device: its energy counter starts again
            g.uuid = uuid
            if uuid not in g.uuids:
                g.uuids.append(uuid)
        _add_gpu_row(g, [row[i] for i in ix[3:]], t, gap, every)
    data.gpus = [accs[i] for i in sorted(accs)]


def _add_gpu_row(g: GpuAcc, cells: list[str], t: float, gap: float, every: float) -> None:
    """One row into the running aggregates; ``cells`` in the order of ``GPU_FIELDS[3:]``."""
    util_s, used_s, total_s, proc_s, power_s, temp_s, energy_s, events = cells
    dt = every if g.last_t is None or not 0 <= t - g.last_t <= gap else t - g.last_t
    if g.first_t is None:
        g.first_t = t
    g.last_t = t
    g.samples += 1
    g.sampled_s += dt
    i = g.grid.index(t)
    util = _f(util_s)
    if util is not None:
        g.util_n += 1
        g.util_sum += util
        g.util_hist.add(util)
        g.s_util.add(i, util)
    used, total = _f(used_s), _f(total_s)
    if used is not None:
        if g.mem_peak is None or used > g.mem_peak:
            g.mem_peak = used
        if total:
            g.s_mem.add(i, 100.0 * used / total)
    if total is not None and (g.mem_total is None or total > g.mem_total):
        g.mem_total = total
    if proc_s:
        proc = _f(proc_s)
        if proc is not None and (g.proc_mem_peak is None or proc > g.proc_mem_peak):
            g.proc_mem_peak = proc
    power = _f(power_s)
    if power is not None:
        g.power_n += 1
        g.power_sum += power
        if g.power_max is None or power > g.power_max:
            g.power_max = power
        g.s_power.add(i, power)
    temp = _f(temp_s)
    if temp is not None and (g.temp_max is None or temp > g.temp_max):
        g.temp_max = temp
    energy = _f(energy_s)
    if energy is not None:
        if g.energy_last is not None and energy < g.energy_last:  # a new sampler: the counter restarted
            g.new_segment()
        g.energy_last = energy
    if events:
        for name in events.split("|"):
            g.throttle_s[name] = g.throttle_s.get(name, 0.0) + dt


def _scan_host(path: Path, data: RunData, *, times_known: bool) -> None:
    h = HostAcc(data.grid)
    for cols, row in _rows(path):
        try:
            t = float(row[cols["time"]])
        except (KeyError, ValueError, IndexError):
            data.host_bad_rows += 1
            continue
        if not times_known and not h.samples and not data.gpus:
            data.grid.origin = t

        def cell(name: str) -> float | None:
            i = cols.get(name)
            return _f(row[i]) if i is not None and i < len(row) else None

        h.samples += 1
        i = data.grid.index(t)
        cpu, rss, nprocs = cell("cpu_pct"), cell("rss_mib"), cell("nprocs")
        total, avail = cell("node_mem_total_mib"), cell("node_mem_available_mib")
        if cpu is not None:
            h.cpu_n += 1
            h.cpu_sum += cpu
            h.cpu_max = cpu if h.cpu_max is None else max(h.cpu_max, cpu)
            h.s_cpu.add(i, cpu)
        if rss is not None:
            h.rss_peak = rss if h.rss_peak is None else max(h.rss_peak, rss)
            h.s_rss.add(i, rss)
        if nprocs is not None:
            h.nprocs_max = max(h.nprocs_max, int(nprocs))
        if total is not None:
            h.node_mem_total = total
        if avail is not None:
            h.node_avail_min = avail if h.node_avail_min is None else min(h.node_avail_min, avail)
    data.host = h if h.samples else None

