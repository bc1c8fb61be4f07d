"""The NVML backend's own logic, run against a fake of the pynvml module surface."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import anyio
import pytest

from supervisor.gpu import GPU_COLUMNS, GpuSampler
from supervisor.gpu._nvml import NvmlBackend
from supervisor.gpu.fake import (NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_NO_PERMISSION,
                                 FakeGpu, FakeNvml, eight_gpus, fake_uuid)
from supervisor.proctree import descendants
from tests.support.emit import Events
from tests.support.wait import wait_for_async

from ._util import read_csv


async def run_sampler(tmp_path: Path, events: Events, fake: FakeNvml, *, until, every: float = 0.05,
                      env: dict[str, str] | None = None, tree=lambda: set(), timeout: float = 30.0,
                      dmon_log: bool = False) -> GpuSampler:
    """Run a sampler on ``fake`` until ``until(sampler)`` holds, then cancel it."""
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=every, env=env or {}, dmon_log=dmon_log,
                         _backend_override=NvmlBackend(fake))
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: sampler.run(tree_pids=tree, task_status=task_status))
        await wait_for_async(lambda: until(sampler), timeout=timeout)
        tg.cancel_scope.cancel()
    return sampler


@pytest.mark.asyncio
async def test_nvml_eight_gpus_one_without_power_one_lost(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml(eight_gpus({3: {"unsupported": ["power"]}, 5: {"lost_after": 0.5}}))
    at_loss: list[int] = []

    def until(s: GpuSampler) -> bool:
        if events.of("gpu-lost") and not at_loss:
            at_loss.append(s.samples)
        return bool(at_loss) and s.samples >= max(15, at_loss[0] + 8)

    await run_sampler(tmp_path, events, fake, until=until)

    start = events.of("gpu-start")[0]
    assert start["backend"] == "nvml" and start["source"] == "all"
    assert [d["uuid"] for d in start["devices"]] == [fake_uuid(i) for i in range(8)]
    # NotSupported is journaled once, and never asked again after the first refusal.
    unsupported = events.of("gpu-unsupported")
    assert [(e["device"], e["metric"]) for e in unsupported] == [(3, "power")]
    assert fake.calls_by[("power", 3)] == 1
    assert fake.calls_by[("power", 0)] >= 15
    lost = events.of("gpu-lost")
    assert [(e["device"], e["error"]) for e in lost] == [(5, "GPU is lost")]
    assert not events.of("gpu-error")

    rows = read_csv(tmp_path / "gpu.csv")
    assert list(rows[0]) == list(GPU_COLUMNS)
    by_gpu = {i: [r for r in rows if r["gpu"] == str(i)] for i in range(8)}
    assert all(r["power_w"] == "" for r in by_gpu[3]) and all(r["util_gpu_pct"] == "90" for r in by_gpu[3])
    assert all(r["power_w"] == "300" for r in by_gpu[0])
    last_lost_row = max(float(r["time"]) for r in by_gpu[5])
    assert max(float(r["time"]) for r in by_gpu[0]) > last_lost_row + 0.3  # the others went on
    assert len(by_gpu[5]) < len(by_gpu[0])

    end = events.of("gpu-end")[0]
    assert end["complete"] is True
    assert len(end["devices"]) == 8
    assert [d["lost"] for d in end["devices"]] == [i == 5 for i in range(8)]
    assert end["devices"][0]["ecc_uncorrected_delta"] == 0
    assert end["devices"][0]["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0}


@pytest.mark.asyncio
async def test_nvml_no_permission_and_function_not_found_are_remembered(tmp_path: Path, events: Events) -> None:
    gpus = [FakeGpu(uuid=fake_uuid(0), errors={"ecc": NVML_ERROR_NO_PERMISSION,
                                               "clock_events": NVML_ERROR_FUNCTION_NOT_FOUND})]
    fake = FakeNvml(gpus)
    await run_sampler(tmp_path, events, fake, until=lambda s: s.samples >= 5)
    got = sorted((e["metric"], e["error"]) for e in events.of("gpu-unsupported"))
    assert got == [("clock_events", "Function Not Found"), ("ecc", "Insufficient Permissions")]
    # FunctionNotFound on the new name tried the older name once, then both were left alone.
    assert fake.calls_by[("clock_events", 0)] == 2
    assert fake.calls_by[("ecc", 0)] == 1
    end = events.of("gpu-end")[0]["devices"][0]
    assert end["ecc_corrected"] is None and end["ecc_corrected_delta"] is None


@pytest.mark.asyncio
async def test_nvml_energy_counter_agrees_with_power_times_time(tmp_path: Path, events: Events) -> None:
    def power(t: float) -> float:  # a busy GPU's power swings; the counter must follow it
        return 250 + 100 * math.sin(2 * math.pi * t / 1.5)

    fake = FakeNvml([FakeGpu(uuid=fake_uuid(0), power_w=power)])
    await run_sampler(tmp_path, events, fake, every=0.03, until=lambda s: s.samples >= 60)
    rows = read_csv(tmp_path / "gpu.csv")
    t = [float(r["time"]) for r in rows]
    p = [float(r["power_w"]) for r in rows]
    e = [float(r["energy_j"]) for r in rows]
    integral = sum((t[i + 1] - t[i]) * (p[i + 1] + p[i]) / 2 for i in range(len(t) - 1))
    from_counter = e[-1] - e[0]
    assert integral > 100  # ~1.8 s at ~250 W
    assert abs(from_counter - integral) / integral < 0.05, (from_counter, integral)
    end = events.of("gpu-end")[0]["devices"][0]
    assert end["energy_source"] == "counter"
    assert end["energy_j"] >= e[-1] - 0.1


@pytest.mark.asyncio
async def test_nvml_energy_without_counter_integrates_power(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml([FakeGpu(uuid=fake_uuid(0), power_w=200.0, unsupported=["energy"])])
    await run_sampler(tmp_path, events, fake, until=lambda s: s.samples >= 10)
    rows = read_csv(tmp_path / "gpu.csv")
    span = float(rows[-1]["time"]) - float(rows[0]["time"])
    end = events.of("gpu-end")[0]["devices"][0]
    assert end["energy_source"] == "power-integral"
    assert end["energy_j"] == pytest.approx(200 * span, rel=0.05, abs=1.0)


@pytest.mark.asyncio
async def test_nvml_process_memory_counts_only_the_training_tree(tmp_path: Path, events: Events, tree) -> None:
    shell, grandchild = tree
    foreign = os.getpid()  # a process with GPU memory that is not the training's
    fake = FakeNvml([FakeGpu(uuid=fake_uuid(0), procs={grandchild: 1024 * 2**20, foreign: 2048 * 2**20})])
    await run_sampler(tmp_path, events, fake, until=lambda s: s.samples >= 3,
                      tree=lambda: {shell.pid} | descendants(shell.pid))
    rows = read_csv(tmp_path / "gpu.csv")
    assert {r["proc_mem_mib"] for r in rows} == {"1024"}
    (end,) = events.of("gpu-end")[0]["devices"]
    assert end["peak_proc_mem_mib"] == 1024 and end["peak_mem_used_mib"] == 30 * 1024


@pytest.mark.asyncio
async def test_nvml_xid_is_journaled(tmp_path: Path, events: Events) -> None:
    gpus = eight_gpus({2: {"xids": [(0.2, 79)]}})
    await run_sampler(tmp_path, events, FakeNvml(gpus), until=lambda s: bool(events.of("gpu-xid")))
    assert [(e["device"], e["uuid"], e["xid"]) for e in events.of("gpu-xid")] == [(2, fake_uuid(2), 79)]
    assert events.of("gpu-start")[0]["xid"] is True


@pytest.mark.asyncio
async def test_gpu_stop_during_slow_nvml_call_is_not_delayed(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml([FakeGpu(uuid=fake_uuid(0), slow={"util": 5.0})])
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=0.1, env={}, _backend_override=NvmlBackend(fake))
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: sampler.run(tree_pids=set, task_status=task_status))
        await wait_for_async(lambda: fake.slow_entered >= 1)
        t0 = time.monotonic()
        tg.cancel_scope.cancel()
    took = time.monotonic() - t0
    assert took < 1.0, f"the stop waited {took:.2f}s for a blocked NVML call"
    end = events.of("gpu-end")[0]
    assert end["complete"] is True  # end counters did not need the blocked call
    assert fake.shutdowns == 0  # nvmlShutdown is not called under a call still in flight


@pytest.mark.asyncio
async def test_gpu_end_stats_are_bounded_when_nvml_hangs(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml([FakeGpu(uuid=fake_uuid(0), slow={"ecc": 30.0})])
    fake.gpus[0].slow = {}
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=0.05, env={}, _backend_override=NvmlBackend(fake))
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: sampler.run(tree_pids=set, task_status=task_status))
        await wait_for_async(lambda: sampler.samples >= 2)
        fake.gpus[0].slow = {"ecc": 30.0}  # the driver hangs just as the job ends
        t0 = time.monotonic()
        tg.cancel_scope.cancel()
    took = time.monotonic() - t0
    assert took < 4.0, took
    end = events.of("gpu-end")[0]
    assert end["complete"] is False and end["samples"] >= 2
    assert end["devices"] == [{"index": 0, "uuid": fake_uuid(0), "peak_mem_used_mib": 30 * 1024, "peak_proc_mem_mib": 0}]
    assert read_csv(tmp_path / "gpu.csv")  # samples were still flushed


@pytest.mark.asyncio
async def test_nvml_library_missing_journals_gpu_none(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml(eight_gpus(), init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=1.0, env={}, _backend_override=NvmlBackend(fake))
    with anyio.fail_after(10):
        await sampler.run(tree_pids=set)
    assert [e["reason"] for e in events.of("gpu-none")] == ["NVML: NVML Shared Library Not Found"]
    assert not (tmp_path / "gpu.csv").exists()
    assert sampler.last_busy() is None


@pytest.mark.asyncio
async def test_gpu_none_here_says_why(tmp_path: Path, events: Events) -> None:
    """On this machine (no driver, no nvidia-smi) auto mode ends in one gpu-none event."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("a GPU driver is present")
    env = {"PATH": str(tmp_path)}  # no nvidia-smi here
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=1.0, env=env)
    with anyio.fail_after(30):
        await sampler.run(tree_pids=set)
    (none,) = events.of("gpu-none")
    assert "NVML Shared Library Not Found" in none["reason"]
    assert "nvidia-smi not found on PATH" in none["reason"]
    assert len(events) == 1


@pytest.mark.asyncio
async def test_gpu_sampling_off_when_every_is_zero(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml(eight_gpus())
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=0, env={}, _backend_override=NvmlBackend(fake))
    with anyio.fail_after(5):
        await sampler.run(tree_pids=set)
    assert [e["kind"] for e in events] == ["gpu-none"]
    assert fake.calls == 0


@pytest.mark.asyncio
async def test_gpu_last_busy_follows_utilisation(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml([FakeGpu(uuid=fake_uuid(0), util_gpu=lambda t: 80.0 if t < 0.4 else 2.0)])
    seen: list[float | None] = []

    def until(s: GpuSampler) -> bool:
        seen.append(s.last_busy())
        return fake.elapsed() > 1.2 and s.samples >= 10

    sampler = await run_sampler(tmp_path, events, fake, until=until)
    assert any(b is not None for b in seen)
    busy = sampler.last_busy()
    assert busy is not None
    # The GPU went idle at ~0.4 s: the last busy stamp is well before the end.
    assert time.monotonic() - busy > 0.5


@pytest.mark.asyncio
async def test_nvml_filters_by_cuda_visible_devices_uuids(tmp_path: Path, events: Events) -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"{fake_uuid(6)},{fake_uuid(1)[:12]}", "SLURM_JOB_GPUS": "0,1,2,3"}
    await run_sampler(tmp_path, events, FakeNvml(eight_gpus()), env=env, until=lambda s: s.samples >= 3)
    start = events.of("gpu-start")[0]
    assert start["source"] == "CUDA_VISIBLE_DEVICES"
    assert [d["index"] for d in start["devices"]] == [6, 1]
    assert {r["uuid"] for r in read_csv(tmp_path / "gpu.csv")} == {fake_uuid(6), fake_uuid(1)}


@pytest.mark.asyncio
async def test_nvml_filters_by_cuda_visible_devices_indices(tmp_path: Path, events: Events) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    await run_sampler(tmp_path, events, FakeNvml(eight_gpus()), env=env, until=lambda s: s.samples >= 3)
    assert {r["gpu"] for r in read_csv(tmp_path / "gpu.csv")} == {"2", "3"}


@pytest.mark.asyncio
async def test_nvml_filters_by_slurm_job_gpus(tmp_path: Path, events: Events) -> None:
    env = {"SLURM_JOB_GPUS": "4-5,7"}
    await run_sampler(tmp_path, events, FakeNvml(eight_gpus()), env=env, until=lambda s: s.samples >= 2)
    assert events.of("gpu-start")[0]["source"] == "SLURM_JOB_GPUS"
    assert {r["gpu"] for r in read_csv(tmp_path / "gpu.csv")} == {"4", "5", "7"}


@pytest.mark.asyncio
async def test_nvml_cuda_visible_devices_naming_no_gpu_journals_gpu_none(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml(eight_gpus())
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=1.0, env={"CUDA_VISIBLE_DEVICES": ""},
                         _backend_override=NvmlBackend(fake))
    with anyio.fail_after(10):
        await sampler.run(tree_pids=set)
    (none,) = events.of("gpu-none")
    assert "CUDA_VISIBLE_DEVICES=''" in none["reason"]
    assert fake.shutdowns == 1


@pytest.mark.asyncio
async def test_nvml_mig_is_noted(tmp_path: Path, events: Events) -> None:
    mig = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    gpus = [FakeGpu(uuid=fake_uuid(0)), FakeGpu(uuid=fake_uuid(1), mig=True, mig_uuids=(mig,), unsupported=["util"])]
    await run_sampler(tmp_path, events, FakeNvml(gpus), env={"CUDA_VISIBLE_DEVICES": mig},
                      until=lambda s: s.samples >= 2)
    (dev,) = events.of("gpu-start")[0]["devices"]
    assert dev["index"] == 1 and dev["mig"] is True and dev["mig_uuids"] == [mig]
    assert [e["metric"] for e in events.of("gpu-unsupported")] == ["util"]


@pytest.mark.asyncio
async def test_gpu_csv_is_written_in_batches_while_running(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml(eight_gpus())
    path = tmp_path / "gpu.csv"

    def rows_on_disk() -> int:
        return len(path.read_text().splitlines()) - 1 if path.exists() else 0

    pending: list[int] = []

    def until(s: GpuSampler) -> bool:
        assert s._csv is not None
        pending.append(s._csv.pending())
        return rows_on_disk() >= 512

    await run_sampler(tmp_path, events, fake, every=0.01, until=until)
    assert rows_on_disk() % 8 == 0 and rows_on_disk() >= 512
    assert max(pending) <= 256 + 8  # memory is bounded: rows leave in batches as they come


@pytest.mark.asyncio
async def test_gpu_dmon_log_round_trips_through_the_dmon_parser(tmp_path: Path, events: Events) -> None:
    from supervisor.gpu._dmon import parse_dmon

    gpus = eight_gpus({3: {"unsupported": ["power"]}})
    await run_sampler(tmp_path, events, FakeNvml(gpus), dmon_log=True, until=lambda s: s.samples >= 2)
    rows = list(parse_dmon((tmp_path / "gpu-dmon.log").read_text().splitlines()))
    assert len(rows) >= 16
    assert {r["gpu"] for r in rows} == {str(i) for i in range(8)}
    r3 = next(r for r in rows if r["gpu"] == "3")
    r0 = next(r for r in rows if r["gpu"] == "0")
    assert (r0["pwr"], r0["sm"], r0["mem"], r0["pclk"], r0["fb"]) == ("300", "90", "40", "1410", "30720")
    assert r3["pwr"] == "-"


@pytest.mark.asyncio
async def test_nvml_gpus_we_may_not_open_are_not_ours(tmp_path: Path, events: Events) -> None:
    refused = {"errors": {"handle": NVML_ERROR_NO_PERMISSION}}
    fake = FakeNvml(eight_gpus({i: refused for i in range(2, 8)}))
    await run_sampler(tmp_path, events, fake, until=lambda s: s.samples >= 2)
    assert [d["index"] for d in events.of("gpu-start")[0]["devices"]] == [0, 1]
    assert not events.of("gpu-error") and not events.of("gpu-unsupported")
    assert {r["gpu"] for r in read_csv(tmp_path / "gpu.csv")} == {"0", "1"}


@pytest.mark.asyncio
async def test_nvml_no_gpu_we_may_open_journals_gpu_none(tmp_path: Path, events: Events) -> None:
    fake = FakeNvml(eight_gpus({i: {"errors": {"handle": NVML_ERROR_NO_PERMISSION}} for i in range(8)}))
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=1.0, env={}, _backend_override=NvmlBackend(fake))
    with anyio.fail_after(10):
        await sampler.run(tree_pids=set)
    (none,) = events.of("gpu-none")
    assert none["reason"].startswith("NVML could open none of the GPUs (GPU 0: Insufficient Permissions;")


@pytest.mark.asyncio
async def test_gpu_backend_crashing_on_open_or_tick_is_journaled_not_raised(tmp_path: Path, events: Events) -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("binding bug")

    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=1.0, env={}, _backend_override=NvmlBackend(Broken([])))
    with anyio.fail_after(10):
        await sampler.run(tree_pids=set)
    assert [e["reason"] for e in events.of("gpu-none")] == ["opening the GPU backend failed: RuntimeError: binding bug"]

    ticks: list[float] = []

    class TickBug(NvmlBackend):
        def sample(self, tree: set[int]):  # type: ignore[override]
            ticks.append(time.monotonic())
            raise ValueError("tick bug")

    events2 = Events()
    backend = TickBug(FakeNvml(eight_gpus()))
    sampler = GpuSampler(run_dir=tmp_path, emit=events2, every=0.02, env={}, _backend_override=backend)
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: sampler.run(tree_pids=set, task_status=task_status))
        await wait_for_async(lambda: len(ticks) >= 5)  # the error is journaled once, then backed off
        tg.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert gaps[-1] > gaps[0] * 1.5  # backing off
    assert [e["error"] for e in events2.of("gpu-error")] == ["ValueError: tick bug"]
    assert events2.of("gpu-end")[0]["samples"] == 0
