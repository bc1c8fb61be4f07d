"""Smoke test of the NVML backend on a real GPU; skipped where no driver answers."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from supervisor.gpu import GPU_COLUMNS, GpuSampler
from tests.support.emit import Events
from tests.support.wait import wait_for_async

from ._util import read_csv

pynvml = pytest.importorskip("pynvml")


def _driver() -> str | None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return str(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()


pytestmark = pytest.mark.skipif(_driver() is None, reason="pynvml.nvmlInit() failed: no NVIDIA driver here")


@pytest.mark.asyncio
async def test_nvml_real_gpu_end_to_end(tmp_path: Path) -> None:
    events = Events()
    sampler = GpuSampler(run_dir=tmp_path, emit=events, every=0.5, backend="nvml",
                         env={k: v for k, v in os.environ.items() if k in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")})
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: sampler.run(tree_pids=lambda: {os.getpid()}, task_status=task_status))
        await wait_for_async(lambda: sampler.samples >= 3, timeout=60)
        tg.cancel_scope.cancel()
    start = events.of("gpu-start")[0]
    assert start["backend"] == "nvml" and start["devices"]
    assert all(d["uuid"].startswith(("GPU-", "MIG-")) for d in start["devices"])
    rows = read_csv(tmp_path / "gpu.csv")
    assert list(rows[0]) == list(GPU_COLUMNS)
    assert all(r["mem_total_mib"] for r in rows)
    end = events.of("gpu-end")[0]
    assert end["complete"] is True and len(end["devices"]) == len(start["devices"])
    assert not events.of("gpu-lost") and not events.of("gpu-error")
