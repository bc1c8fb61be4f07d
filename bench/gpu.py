"""CPU cost of GPU sampling: the NVML sampler on 8 fake GPUs vs. starting nvidia-smi per sample.

    .venv/bin/python bench/gpu.py [--seconds 60] [--every 1] [--call-cost 0.00036]

Three loops, each for ``--seconds`` at one sample per ``--every`` seconds, measured as CPU
seconds used (user + system, this process and its children) per wall second, in % of one core:

1. ``nvml-sleep``: ``GpuSampler`` + ``NvmlBackend`` on ``FakeNvml`` with 8 GPUs whose every
   call takes ``--call-cost`` seconds of latency (default 0.36 ms: gpustat#76 measured
   ~2743 nvmlDeviceGetPowerUsage calls/s on a K40m, NVML's most expensive scalar). The
   latency is slept: the driver's share of the time is not charged to us.
2. ``nvml-spin``: the same, but every call burns its latency on the CPU: the worst case,
   as if all of NVML's time were our CPU time.
3. ``smi-per-sample``: the seed's way, one ``nvidia-smi --query-gpu`` process per sample,
   played by a stand-in script that costs what nvidia-smi costs (~15 ms of CPU per call,
   It4innovations/hyperqueue#564: 10-20 ms) and prints 8 GPUs' CSV, parsed by the loop.

``--only nvml-real`` runs the real NVML backend on this node's GPUs instead (the job's
GPUs by CUDA_VISIBLE_DEVICES etc.), to check the model against real hardware.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.gpu import GpuSampler  # noqa: E402
from supervisor.gpu._nvml import NvmlBackend  # noqa: E402
from supervisor.gpu.fake import FakeNvml, eight_gpus  # noqa: E402

STAND_IN = """
import resource, sys
# Spend what nvidia-smi spends (CPU of the whole process, interpreter start included).
target = float(sys.argv[1])
def used():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
while used() < target:
    pass
for i in range(8):
    print(f"{i}, GPU-{i:08x}-1111-2222-3333-{i:012x}, 90, 40, 30720, 81920, 300.00, 65, 1410, 1593")
"""


def cpu_self_children() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


async def nvml_loop(seconds: float, every: float, call_cost: float, spin: bool, real: bool = False) -> dict[str, float]:
    fake = FakeNvml(eight_gpus(), call_cost=call_cost, spin=spin)
    none: list[str] = []

    def emit(kind: str, durable: bool = False, **f: object) -> dict[str, object]:
        if kind == "gpu-none":
            none.append(str(f.get("reason")))
        return f

    with tempfile.TemporaryDirectory() as tmp:
        sampler = GpuSampler(run_dir=Path(tmp), emit=emit, every=every, backend="nvml", env=dict(os.environ) if real else {},
                             _backend_override=None if real else NvmlBackend(fake))
        async with anyio.create_task_group() as tg:
            await tg.start(lambda task_status: sampler.run(tree_pids=lambda: {os.getpid()}, task_status=task_status))
            c0, w0, calls0 = cpu_self_children(), time.monotonic(), fake.calls
            await anyio.sleep(seconds)
            c1, w1, calls1 = cpu_self_children(), time.monotonic(), fake.calls
            tg.cancel_scope.cancel()
    if none:
        raise SystemExit(f"no GPU to sample: {none[0]}")
    return {"cpu_s": c1 - c0, "wall_s": w1 - w0, "samples": sampler.samples,
            "calls": 0 if real else calls1 - calls0, "gpus": len(sampler.devices)}


def smi_loop(seconds: float, every: float, smi_cost: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "nvidia-smi-stand-in.py"
        script.write_text(STAND_IN)
        argv = [sys.executable, "-S", "-I", str(script), str(smi_cost)]
        c0, w0 = cpu_self_children(), time.monotonic()
        next_at, n, rows = w0, 0, 0
        while time.monotonic() - w0 < seconds:
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            rows += sum(1 for line in out.splitlines() if line.count(",") == 9)
            n += 1
            next_at += every
            time.sleep(max(0.0, next_at - time.monotonic()))
        c1, w1 = cpu_self_children(), time.monotonic()
    return {"cpu_s": c1 - c0, "wall_s": w1 - w0, "samples": n, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--call-cost", type=float, default=0.00036, help="seconds per NVML call (default 0.36 ms)")
    ap.add_argument("--smi-cost", type=float, default=0.015, help="CPU seconds per nvidia-smi run (default 15 ms)")
    ap.add_argument("--only", choices=["nvml-sleep", "nvml-spin", "smi-per-sample", "nvml-real"], action="append",
                    help="nvml-real: the real NVML backend on this node's GPUs (not in the default set)")
    a = ap.parse_args()
    modes = a.only or ["nvml-sleep", "nvml-spin", "smi-per-sample"]
    print(f"# 8 GPUs, one sample every {a.every:g}s for {a.seconds:g}s; NVML call {a.call_cost * 1e3:g} ms; "
          f"nvidia-smi {a.smi_cost * 1e3:g} ms CPU; {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    print("| loop | samples | NVML calls | CPU s | wall s | % of one core | CPU ms per sample |")
    print("|---|---|---|---|---|---|---|")
    for mode in modes:
        if mode == "smi-per-sample":
            r = smi_loop(a.seconds, a.every, a.smi_cost)
        else:
            r = anyio.run(nvml_loop, a.seconds, a.every, a.call_cost, mode == "nvml-spin", mode == "nvml-real")
        pct = 100 * r["cpu_s"] / r["wall_s"]
        per = 1000 * r["cpu_s"] / max(1, r["samples"])
        print(f"| {mode} | {r['samples']:.0f} | {r.get('calls', 0):.0f} | {r['cpu_s']:.3f} | {r['wall_s']:.1f} | "
              f"{pct:.2f} % | {per:.1f} |", flush=True)


if __name__ == "__main__":
    main()
