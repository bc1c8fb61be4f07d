"""The one-pass, bounded-memory reading of the sample files, on generated CSVs."""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

from supervisor.gpu import GPU_COLUMNS
from supervisor.report import facts_of
from supervisor.report._load import BUCKETS, Grid, Histogram, Series, load


def _write_run(run: Path, rows: int, *, gpus: int = 2, every: float = 10.0, seed: int = 1) -> list[list[float]]:
    """A run directory with a journal and ``rows`` samples per GPU; returns the utilisations."""
    run.mkdir()
    t0 = 1_700_000_000.0
    events = [{"v": 1, "t": t0, "attempt": 1, "kind": "start", "host": "n1"},
              {"v": 1, "t": t0 + 0.5, "attempt": 1, "kind": "gpu-start", "every": every, "devices": []}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rng = random.Random(seed)
    utils: list[list[float]] = [[] for _ in range(gpus)]
    with open(run / "gpu.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(GPU_COLUMNS)
        for k in range(rows):
            for g in range(gpus):
                u = float(rng.randint(0, 100))
                utils[g].append(u)
                w.writerow([f"{t0 + k * every:.3f}", g, f"GPU-{g}", u, 10, 1000 + k % 7, 81920, 300, k * 3000.0, 60,
                            1410, 1593, "sw_power_cap" if k % 4 == 0 else "", 900])
    return utils


def test_aggregates_are_exact_and_series_bounded(tmp_path: Path) -> None:
    utils = _write_run(tmp_path / "run", 5000)  # the journal says nothing of the length: the grid coarsens
    data = load(tmp_path / "run")
    f, _ = facts_of(tmp_path / "run")
    for g, u in zip(f.gpus, utils):
        s = sorted(u)
        assert g.util_mean_pct == round(sum(u) / len(u), 1)
        assert g.util_p95_pct == s[math.ceil(0.95 * len(s)) - 1]
        assert g.throttled_s["sw_power_cap"] == 1250 * 10.0
        assert g.energy_kwh == round(4999 * 3000.0 / 3.6e6, 4)
    for acc in data.gpus:
        assert len(acc.s_util.values()) == BUCKETS
        got = [v for v in acc.s_util.values() if v is not None]
        assert 100 < len(got) <= BUCKETS
        # Every row landed in a bucket after the coarsening: the counts add up.
        assert sum(acc.s_util.cnt) == 5000
    assert data.grid.width * BUCKETS >= 5000 * 10.0


def test_histogram_quantiles_match_a_sorted_list() -> None:
    rng = random.Random(7)
    values = [float(rng.randint(0, 100)) for _ in range(999)]
    h = Histogram()
    for v in values:
        h.add(v)
    s = sorted(values)
    for q in (0.05, 0.5, 0.95, 1.0):
        assert h.quantile(q) == s[math.ceil(q * len(s)) - 1]
    assert Histogram().quantile(0.5) is None


def test_coarsening_keeps_means_and_maxima() -> None:
    grid = Grid(0.0, 1.0, n=4)
    mean, peak = Series(grid), Series(grid, "max")
    for t, v in [(0.5, 10.0), (1.5, 30.0), (2.5, 50.0), (3.5, 70.0), (4.5, 90.0)]:  # the last forces a coarsening
        i = grid.index(t)
        mean.add(i, v)
        peak.add(i, v)
    assert grid.width == 2.0
    assert mean.values() == [20.0, 60.0, 90.0, None]
    assert peak.values() == [30.0, 70.0, 90.0, None]


def test_bad_csv_rows_and_a_repeated_header_are_skipped(tmp_path: Path) -> None:
    _write_run(tmp_path / "run", 20, gpus=1)
    with open(tmp_path / "run" / "gpu.csv", "a") as f:
        f.write(",".join(GPU_COLUMNS) + "\n")  # a new attempt's writer repeating the header
        f.write("not-a-time,0,GPU-0\n")
        f.write("1700000300.0,0,GPU-0,")  # torn: the writer was killed mid-row
    f, _ = facts_of(tmp_path / "run")
    assert f.journal["gpu_bad_rows"] == 1
    assert f.gpus[0].samples == 21  # the torn row still has a time and a GPU; its empty cells count for nothing
    assert f.gpus[0].util_mean_pct is not None


def test_a_requeue_onto_another_node_is_still_the_jobs_gpu_0(tmp_path: Path) -> None:
    """Attempt 2 ran on another node: other UUIDs, energy counters from 0 again, an XID there."""
    run = tmp_path / "run"
    run.mkdir()
    t0 = 1_700_000_000.0
    events = [{"v": 1, "t": t0, "attempt": 1, "kind": "start", "host": "node-a"},
              {"v": 1, "t": t0 + 1000, "attempt": 2, "kind": "start", "host": "node-b"},
              {"v": 1, "t": t0 + 1050, "attempt": 2, "kind": "gpu-xid", "device": 0, "uuid": "GPU-b0", "xid": 79}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    with open(run / "gpu.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(GPU_COLUMNS)
        for start, node in [(t0, "a"), (t0 + 1000, "b")]:
            for k in range(50):
                for g in range(2):
                    w.writerow([start + 10 * k, g, f"GPU-{node}{g}", 50, "", 100, 1000, 200, 2000.0 * (k + 1), "", "", "",
                                "", ""])
    f, _ = facts_of(run)
    assert [g.index for g in f.gpus] == [0, 1]
    assert f.gpus[0].uuids == ["GPU-a0", "GPU-b0"] and f.gpus[0].samples == 100
    assert f.gpus[0].energy_kwh == round(2 * 100_000.0 / 3.6e6, 4)  # both attempts' counters, added
    assert f.gpus[0].xids == [79] and f.gpus[0].faulty == ["GPU-b0 on node-b"] and f.gpus[1].xids == []
    assert any("--exclude=node-b" in n.text for n in f.notes)


def test_garbage_in_the_journal_is_counted_and_left_out(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").write_text(
        '{"kind":"start","t":"yesterday"}\n'  # no numeric time: cannot be placed
        '{"v":1,"t":5,"attempt":1,"kind":"spawn"}\n'
        '[1, 2]\n'  # not an event
        '{"v":1,"t":6,"attempt":1,"kind":"end","reason":"child-exit","exit_status":0,"seconds":1}\n')
    f, _ = facts_of(run)
    assert f.verdict.status == "finished" and [a.reason for a in f.attempts] == ["child-exit"]
    assert f.journal["malformed_events"] == 1 and f.journal["bad_lines"] == [3]


def test_an_empty_journal_says_so(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text("")
    f, _ = facts_of(tmp_path)
    assert f.verdict.status == "empty" and f.attempts == [] and f.gpus == []
