"""The dmon parser on golden outputs of three driver generations, and the dmon backend
against a stand-in ``nvidia-smi`` (a real subprocess)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import anyio
import pytest

from supervisor.gpu import GpuSampler
from supervisor.gpu._dmon import DmonParser, parse_dmon, row_to_sample
from supervisor.gpu._types import DeviceInfo
from tests.support.emit import Events
from tests.support.wait import wait_for_async

from ._util import read_csv


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    "name, expected",
    [
        # (rows, first row of gpu 0 as sm, mem, pwr, gtemp, mclk, pclk, fb)
        ("dmon_r470_puc.txt", (4, ("97", "55", "68", "41", "1215", "1410", None))),
        ("dmon_r550_puc.txt", (4, ("99", "63", "312", "62", "2619", "1980", None))),
        ("dmon_r575_DT_pucvmet.txt", (3, ("0", "0", "15", "27", "405", "225", "2"))),
    ],
)
def test_dmon_parser_reads_each_header_generation(name: str, expected: tuple) -> None:
    rows = list(parse_dmon((FIXTURES / name).read_text().splitlines()))
    count, first = expected
    assert len(rows) == count
    r = rows[0]
    assert r["gpu"] == "0"
    assert (r["sm"], r["mem"], r["pwr"], r["gtemp"], r["mclk"], r["pclk"], r.get("fb")) == first


def test_dmon_row_to_sample_by_name_not_position() -> None:
    dev = DeviceInfo(index=0, uuid="GPU-x", memory_total=80 * 2**30)
    old, new = (list(parse_dmon((FIXTURES / n).read_text().splitlines()))
                for n in ("dmon_r470_puc.txt", "dmon_r575_DT_pucvmet.txt"))
    s = row_to_sample(old[0], dev, 1.0)
    assert (s.util_gpu, s.util_mem, s.power_w, s.temp_c, s.sm_mhz, s.mem_mhz, s.mem_used) == (97, 55, 68, 41, 1410, 1215, None)
    s = row_to_sample(new[1], dev, 1.0)
    assert (s.util_gpu, s.power_w, s.sm_mhz, s.mem_used) == (87, 214, 1410, 40311 * 2**20)


def test_dmon_parser_follows_a_header_change_and_skips_unplaceable_lines() -> None:
    p = DmonParser()
    assert p.feed("    0    43    48     0     1     0     0  3505   936") is None  # before any header
    p.feed("# gpu   pwr  temp    sm   mem   enc   dec  mclk  pclk")
    p.feed("# Idx     W     C     %     %     %     %   MHz   MHz")
    r = p.feed("    0    43    48     7     1     0     0  3505   936")
    assert r is not None and r["temp"] == "48" and r["sm"] == "7"
    assert p.feed("    0    43    48") is None  # truncated line
    p.feed("# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk")
    r = p.feed("    1    312     62     71     99     63      0      0      0      0   2619   1980")
    assert r is not None and r["gpu"] == "1" and r["pclk"] == "1980" and "temp" not in r
    # MIG: utilisation is "-" and becomes "not available", not zero
    s = row_to_sample({"gpu": "0", "sm": "-", "mem": "-", "pwr": "80"}, DeviceInfo(0, "GPU-x"), 0.0)
    assert s.util_gpu is None and s.power_w == 80


STAND_IN = r'''#!{python}
"""Stands in for nvidia-smi: --query-gpu and dmon, from a golden fixture."""
import sys, time
args = sys.argv[1:]
uuids = ["GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000001"]
if args and args[0].startswith("--query-gpu="):
    fields = args[0].split("=", 1)[1].split(",")
    if "mig.mode.current" in fields:  # an R440 driver: no MIG fields yet
        print('Field "mig.mode.current" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
    for i, u in enumerate(uuids):
        vals = {{"index": str(i), "uuid": u, "name": "NVIDIA A100-SXM4-80GB", "memory.total": "81920",
                "driver_version": "440.118.02"}}
        print(", ".join(vals.get(f, "3") for f in fields))
    sys.exit(0)
if args and args[0] == "dmon":
    with open(sys.argv[0] + ".args", "w") as f:
        f.write(" ".join(args))
    delay = float(args[args.index("-d") + 1])
    ids = args[args.index("-i") + 1].split(",")
    lines = open({fixture!r}).read().splitlines()
    head = [l for l in lines if l.startswith("#")][:2]
    body = [l for l in lines if not l.startswith("#")]
    for h in head:
        print(h, flush=True)
    n = 0
    while True:
        for l in body:
            if l.split()[0] in ids:
                print(l, flush=True)
        n += 1
        time.sleep(delay / 10)  # faster than real, so the test is quick
sys.exit(2)
'''


@pytest.mark.asyncio
async def test_dmon_backend_with_stand_in_nvidia_smi(tmp_path: Path, events: Events) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(STAND_IN.format(python=sys.executable, fixture=str(FIXTURES / "dmon_r470_puc.txt")))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "1"}
    sampler = GpuSampler(run_dir=run_dir, emit=events, every=0.2, backend="dmon", env=env)
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: sampler.run(tree_pids=set, task_status=task_status))
        await wait_for_async(lambda: sampler.samples >= 3)
        tg.cancel_scope.cancel()
    start = events.of("gpu-start")[0]
    assert start["backend"] == "dmon" and [d["index"] for d in start["devices"]] == [1]
    assert start["driver"] == "440.118.02" and start["devices"][0]["uuid"].startswith("GPU-bbbbbbbb")
    assert "-i 1" in (bindir / "nvidia-smi.args").read_text()
    rows = read_csv(run_dir / "gpu.csv")
    assert {r["gpu"] for r in rows} == {"1"}
    assert {r["util_gpu_pct"] for r in rows} <= {"93", "94"}
    assert {r["mem_total_mib"] for r in rows} == {"81920"}
    end = events.of("gpu-end")[0]
    (dev,) = end["devices"]
    assert dev["energy_source"] == "power-integral" and dev["energy_j"] > 0
    assert dev["ecc_corrected_delta"] == 0
    assert not events.of("gpu-error")


@pytest.mark.asyncio
async def test_dmon_backend_without_nvidia_smi_journals_gpu_none(tmp_path: Path, events: Events) -> None:
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=1.0, backend="dmon", env={"PATH": str(tmp_path)})
    with anyio.fail_after(10):
        await sampler.run(tree_pids=set)
    assert [e["reason"] for e in events.of("gpu-none")] == ["nvidia-smi not found on PATH"]
