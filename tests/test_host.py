"""Host sampling of a real process tree: CPU time and RSS, and the node's memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.host import HOST_COLUMNS, HostSampler, TreeCpu, read_proc
from supervisor.proctree import descendants

BURN = """
import sys, time
block = bytearray(200 * 2**20)  # touch 200 MiB so it is resident
for i in range(0, len(block), 4096):
    block[i] = 1
print("ready", flush=True)
end = time.monotonic() + 30
while time.monotonic() < end:
    pass
"""


class Events:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, kind: str, /, *, durable: bool = False, **fields: Any) -> dict[str, Any]:
        self.events.append({"kind": kind, **fields})
        return self.events[-1]


@pytest.mark.asyncio
async def test_host_samples_cpu_and_rss_of_a_real_child_tree(tmp_path: Path) -> None:
    # A shell (the launcher) whose child burns CPU and holds 200 MiB: both are the tree.
    shell = subprocess.Popen(["/bin/sh", "-c", f'"{sys.executable}" -c \'{BURN}\'; exit 0'], stdout=subprocess.PIPE)
    try:
        assert shell.stdout is not None and shell.stdout.readline() == b"ready\n"
        events = Events()
        sampler = HostSampler(run_dir=tmp_path, emit=events, every=0.2)
        rows: list[dict[str, Any]] = []
        async with anyio.create_task_group() as tg:
            await tg.start(lambda task_status: sampler.run(
                tree_pids=lambda: {shell.pid} | descendants(shell.pid), task_status=task_status))
            with anyio.fail_after(20):
                while len(rows) < 5:
                    await anyio.sleep(0.05)
                    if sampler.last and (not rows or rows[-1] is not sampler.last):
                        rows.append(sampler.last)
            tg.cancel_scope.cancel()
    finally:
        for pid in descendants(shell.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        shell.kill()
        shell.wait()
    lines = (tmp_path / "host.csv").read_text().splitlines()
    assert lines[0] == ",".join(HOST_COLUMNS)
    assert len(lines) - 1 >= 5
    last = dict(zip(HOST_COLUMNS, lines[-1].split(",")))
    assert int(last["nprocs"]) == 2
    assert float(last["rss_mib"]) > 200
    assert float(last["node_mem_total_mib"]) >= float(last["node_mem_available_mib"]) > 0
    # The busy loop shows: at least a third of a core in most samples (a shared CI box may steal some).
    cpu = [float(r) for r in (dict(zip(HOST_COLUMNS, l.split(",")))["cpu_pct"] for l in lines[2:]) if r]
    assert cpu and max(cpu) > 33, cpu
    assert not events.events


def test_host_tree_cpu_does_not_go_backwards_when_a_rank_exits() -> None:
    cpu = TreeCpu()
    tck = __import__("os").sysconf("SC_CLK_TCK")
    assert cpu.update(0.0, {10: 100, 11: 500}) is None
    # pid 11 exited (its ticks vanish); pid 10 used one second; pid 12 appeared with half a second.
    pct = cpu.update(1.0, {10: 100 + tck, 12: tck // 2})
    assert pct == pytest.approx(150, abs=1)


def test_host_read_proc_of_a_gone_process_is_none() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    assert read_proc(p.pid) is None
    ticks, rss = read_proc(__import__("os").getpid())  # type: ignore[misc]
    assert ticks >= 0 and rss > 0
