"""The health gate's GPU input (GpuSampler.memory_held) against the fake NVML."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from supervisor.gpu import GpuSampler
from supervisor.gpu._nvml import NvmlBackend
from supervisor.gpu.fake import FakeGpu, FakeNvml, fake_uuid

pytestmark = pytest.mark.anyio
GIB = 2**30


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_memory_held_is_what_the_training_left_beyond_the_first_sample(tmp_path: Path) -> None:
    """1 GiB in use before the training, 9 GiB while it runs, 1 GiB again once it is gone."""
    phase = {"used": 1 * GIB}
    fake = FakeNvml([FakeGpu(uuid=fake_uuid(0), mem_used=lambda t: phase["used"])])
    sampler = GpuSampler(run_dir=tmp_path, emit=lambda kind, **f: f, every=0.05, env={},
                         _backend_override=NvmlBackend(fake))

    async def fresh(since: float) -> int:
        with anyio.fail_after(10):
            while (held := sampler.memory_held(since)) is None:
                await anyio.sleep(0.02)
        return held

    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: sampler.run(tree_pids=lambda: set(), task_status=task_status))
        assert await fresh(time.monotonic()) == 0
        phase["used"] = 9 * GIB
        assert await fresh(time.monotonic()) == 8 * GIB
        phase["used"] = 1 * GIB
        assert await fresh(time.monotonic()) == 0
        assert sampler.memory_held(time.monotonic() + 60) is None  # no sample after that moment yet
        tg.cancel_scope.cancel()
