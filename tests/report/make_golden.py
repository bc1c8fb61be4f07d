"""Make the golden run directories under tests/report/golden/ by running the real agent.

    .venv/bin/python tests/report/make_golden.py            # runs, then expected outputs
    .venv/bin/python tests/report/make_golden.py --expected # only re-render expected.*

Each case runs ``python -m supervisor`` (the real CLI, the real sync, the real stop
sequence) around ``tests/helpers/trainer.py``. The machines this is made on have no GPU,
and the CLI cannot be handed a fake backend, so for the cases with GPU data this script
runs the real ``GpuSampler`` driven by ``supervisor.gpu.fake.FakeNvml`` in this process,
beside the agent, for the same attempt: it appends to the same ``events.jsonl`` (its own
``Journal`` with the agent's attempt number; O_APPEND lines) and writes ``gpu.csv``. The
agent's own ``gpu-none`` stays in the journal; the report prefers ``gpu-start``.

Cases: ``finished`` (four fake GPUs, one idle, one slow, one power-capped; finishes),
``attempts`` (three attempts into one run directory: time limit with a warning too short
for the checkpoint, SIGTERM preemption with an XID, then finished), ``failed`` (no GPU
data: the training crashes), ``torn`` (``finished`` with its last journal line cut).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.gpu import GpuSampler  # noqa: E402
from supervisor.gpu._nvml import NvmlBackend  # noqa: E402
from supervisor.gpu.fake import FakeGpu, FakeNvml, fake_uuid  # noqa: E402
from supervisor.journal import Journal  # noqa: E402
from tests.support.journal import events  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden"
TRAINER = [sys.executable, str(ROOT / "tests" / "helpers" / "trainer.py")]
KEEP = ("events.jsonl", "gpu.csv", "host.csv", "supervise.log")
GIB = 2**30


def four_gpus(xid_at: float | None = None) -> list[FakeGpu]:
    """GPU 0 busy; 1 busy but power-capped; 2 idle; 3 starved (low utilisation)."""
    xids = [(xid_at, 79)] if xid_at is not None else []
    return [
        FakeGpu(uuid=fake_uuid(0), util_gpu=lambda t: 85 + 10 * (int(t * 5) % 2), mem_used=31 * GIB,
                power_w=lambda t: 280 + 20 * (int(t * 5) % 2)),
        FakeGpu(uuid=fake_uuid(1), util_gpu=80.0, mem_used=29 * GIB, power_w=400.0, clock_events=0x4, xids=xids),
        FakeGpu(uuid=fake_uuid(2), util_gpu=0.0, mem_used=1 * GIB, power_w=60.0, clock_events=0x1),
        FakeGpu(uuid=fake_uuid(3), util_gpu=lambda t: 40.0 if int(t * 5) % 4 == 0 else 5.0, mem_used=20 * GIB,
                power_w=150.0),
    ]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))}
    e["PYTHONPATH"] = str(ROOT)
    return e


async def _attempt(run: Path, args: list[str], gpus: list[FakeGpu] | None, *, term_after: float | None,
                   every: float) -> int:
    """One attempt: the agent as a subprocess, the fake-GPU sampler beside it until the child exits."""
    before = max((e["attempt"] for e in events(run)), default=0)
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "--run-dir", str(run), *args], env=env(),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not any(e["kind"] == "spawn" and e["attempt"] > before for e in events(run)):
        if proc.poll() is not None:
            raise SystemExit(f"supervise exited early: {proc.returncode}")
        await anyio.sleep(0.02)
    attempt = max(e["attempt"] for e in events(run))
    t0 = time.monotonic()

    def child_gone() -> bool:
        return proc.poll() is not None or any(e["kind"] == "child-exit" and e["attempt"] == attempt for e in events(run))

    async with anyio.create_task_group() as tg:
        if gpus is not None:
            journal = Journal(run, attempt)
            sampler = GpuSampler(run_dir=run, emit=journal.emit, every=every, env={},
                                 _backend_override=NvmlBackend(FakeNvml(gpus)))
            tg.start_soon(lambda: sampler.run(tree_pids=lambda: set()))
        while not child_gone():
            if term_after is not None and time.monotonic() - t0 > term_after:
                proc.send_signal(signal.SIGTERM)
                term_after = None
            await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    if gpus is not None:
        journal.close()
    return await anyio.to_thread.run_sync(proc.wait)


HF_LIKE = [sys.executable, str(ROOT / "tests" / "report" / "hf_like.py")]


def config(work: Path, name: str, local: Path, persist: Path, **sync: Any) -> str:
    """A TOML config with one checkpoint pair (``restore``, ``settle``, …) for the HF-like cases."""
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"').replace("True", "true").replace("False", "false")
                    for k, v in sync.items())
    path = work / f"{name}.toml"
    path.write_text(f'checkpoint_timeout = "2s"\ngrace = "5s"\n[[sync]]\nname = "ckpt"\nkind = "checkpoint"\n'
                    f'from = "{local}"\nto = "{persist}"\n{extra}')
    return str(path)


def make_truth_cases(work: Path) -> dict[str, Path]:
    """The cases of issue 16: what the report used to say wrongly, each run by the real agent."""
    runs: dict[str, Path] = {}
    # local-only: HF-style checkpoints (no marker), the last written just before a clean exit:
    # it is still settling when the training ends, so it never reaches persistent storage. The
    # names carry control characters (ESC, BEL), which the text report must not pass to a terminal.
    run, local, persist = work / "local-only", work / "l-local", work / "l-persist"
    cfg = config(work, "l", local, persist, settle="3s")
    anyio.run(lambda: _attempt(run, ["--config", cfg, "--gpu-every", "0", "--",
                                     *HF_LIKE, str(local), "--steps", "60", "--every", "20", "--step-time", "0.1",
                                     "--prefix", "ckpt\x1b[31m\x07-"],
                               None, term_after=None, every=0.25))
    runs["local-only"] = run

    # from-scratch: attempt 1 checkpoints to checkpoint-40 and is stopped; attempt 2 (a rerun,
    # restore on) is handed checkpoint-40 but starts over: its next checkpoint is checkpoint-10.
    run, local, persist = work / "from-scratch", work / "s-local", work / "s-persist"
    cfg = config(work, "s", local, persist, settle="0.5s", restore=True)
    train = [*HF_LIKE, str(local), "--steps", "100", "--every", "10", "--step-time", "0.1"]
    anyio.run(lambda: _attempt(run, ["--config", cfg, "--gpu-every", "0", "--", *train],
                               None, term_after=5.0, every=0.25))
    anyio.run(lambda: _attempt(run, ["--config", cfg, "--gpu-every", "0", "--", *train, "--from-scratch",
                                     "--steps", "20"], None, term_after=None, every=0.25))
    runs["from-scratch"] = run

    # rewritten: one file, model.pt, saved by rename 20 times: 20 versions of one checkpoint.
    run, local, persist = work / "rewritten", work / "r-local", work / "r-persist"
    cfg = config(work, "r", local, persist, settle="0.3s")
    anyio.run(lambda: _attempt(run, ["--config", cfg, "--gpu-every", "0", "--", *HF_LIKE, str(local), "--rewrite",
                                     "--steps", "20", "--every", "1", "--step-time", "0.8", "--linger", "2"],
                               None, term_after=None, every=0.25))
    runs["rewritten"] = run
    return runs


def make_five_minutes(work: Path) -> dict[str, Path]:
    """A 5-minute run sampled every 10 s (the default): every plot must draw marks."""
    run, local, persist = work / "five-minutes", work / "m-local", work / "m-persist"
    anyio.run(lambda: _attempt(run, ["--checkpoints", str(local), str(persist), "--gpu-every", "10s", "--",
                                     *TRAINER, str(local), "--steps", "3000", "--step-time", "0.1", "--every", "300"],
                               four_gpus(), term_after=None, every=10.0))
    return {"five-minutes": run}


def make(work: Path) -> dict[str, Path]:
    runs: dict[str, Path] = {}
    every = "0.25s"

    # finished: four GPUs, checkpoints every 15 steps, a 10-minute limit it barely uses.
    run, local, persist = work / "finished", work / "f-local", work / "f-persist"
    anyio.run(lambda: _attempt(run, ["--checkpoints", str(local), str(persist), "--time-limit", "10m",
                                     "--warn-before", "1m", "--gpu-every", every, "--",
                                     *TRAINER, str(local), "--steps", "80", "--every", "15", "--write-time", "0.1"],
                               four_gpus(), term_after=None, every=0.25))
    runs["finished"] = run

    # attempts: 1) time limit with a 1 s warning for a 2 s checkpoint, 2) preempted by SIGTERM with an
    # XID on GPU 1, 3) finished. Each run into the same --run-dir is the next attempt.
    run, local, persist = work / "attempts", work / "a-local", work / "a-persist"
    train = [*TRAINER, str(local), "--steps", "170", "--every", "20", "--write-time", "0.1"]
    anyio.run(lambda: _attempt(run, ["--checkpoints", str(local), str(persist), "--time-limit", "6s",
                                     "--warn-before", "1s", "--gpu-every", every, "--",
                                     *TRAINER, str(local), "--steps", "170", "--every", "20", "--write-time", "2"],
                               four_gpus(), term_after=None, every=0.25))
    anyio.run(lambda: _attempt(run, ["--checkpoints", str(local), str(persist), "--time-limit", "1h",
                                     "--warn-before", "1m", "--gpu-every", every, "--", *train],
                               four_gpus(xid_at=1.0), term_after=3.0, every=0.25))
    anyio.run(lambda: _attempt(run, ["--checkpoints", str(local), str(persist), "--time-limit", "1h",
                                     "--warn-before", "1m", "--gpu-every", every, "--", *train],
                               four_gpus(), term_after=None, every=0.25))
    runs["attempts"] = run

    # failed: no GPU data (this machine has none), the training crashes at step 35.
    run, local, persist = work / "failed", work / "x-local", work / "x-persist"
    anyio.run(lambda: _attempt(run, ["--checkpoints", str(local), str(persist), "--gpu-every", every, "--",
                                     *TRAINER, str(local), "--every", "10", "--fail-at", "35"],
                               None, term_after=None, every=0.25))
    runs["failed"] = run
    return runs


def tear(src: Path, dst: Path) -> None:
    """A copy of ``src`` whose journal ends mid-line, as a SIGKILL during a write leaves it."""
    shutil.copytree(src, dst)
    data = (dst / "events.jsonl").read_bytes()
    end = data.rfind(b'"kind":"end"')
    line = data.rfind(b"\n", 0, end) + 1  # cut the `end` line in its middle: killed while writing it
    (dst / "events.jsonl").write_bytes(data[: end + 20])
    assert line < end + 20


def report(name: str, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "supervisor", "report", f"tests/report/golden/{name}", *args],
                       cwd=ROOT, env={**env(), "NO_COLOR": "1"}, capture_output=True, text=True, check=True)
    return r.stdout


def expected() -> None:
    for d in sorted(p for p in GOLDEN.iterdir() if p.is_dir()):
        (d / "expected.txt").write_text(report(d.name))
        (d / "expected.json").write_text(report(d.name, "--json"))


MAKERS = {"base": make, "truth": make_truth_cases, "five-minutes": make_five_minutes}


def main() -> None:
    """``--only base|truth|five-minutes`` re-makes one group of cases (the five-minute one takes 5 min)."""
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    if "--expected" not in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            runs: dict[str, Path] = {}
            for group, maker in MAKERS.items():
                if only in (None, group):
                    runs.update(maker(Path(tmp)))
            if only in (None, "base"):
                shutil.rmtree(GOLDEN / "torn", ignore_errors=True)
            GOLDEN.mkdir(parents=True, exist_ok=True)
            for name, run in runs.items():
                shutil.rmtree(GOLDEN / name, ignore_errors=True)
                (GOLDEN / name).mkdir()
                for f in KEEP:
                    if (run / f).exists():
                        shutil.copy2(run / f, GOLDEN / name / f)
            if only in (None, "base"):
                tear(GOLDEN / "finished", GOLDEN / "torn")
    expected()
    size = sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file())
    print(f"golden run directories in {GOLDEN}: {size // 1024} KiB")


if __name__ == "__main__":
    main()
