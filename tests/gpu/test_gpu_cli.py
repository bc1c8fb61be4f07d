"""End to end: ``supervise --gpu-every 1s -- sleep 2`` on a machine without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.journal import read_journal

ROOT = Path(__file__).resolve().parents[2]


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return shutil.which("nvidia-smi") is not None


AGENT = ROOT / "supervisor" / "conduct" / "agent.py"


@pytest.mark.skipif(not AGENT.exists(), reason="supervisor/conduct/agent.py is not written yet")
@pytest.mark.skipif(AGENT.exists() and "GpuSampler" not in AGENT.read_text(),
                    reason="supervisor/conduct/agent.py does not start GpuSampler yet")
@pytest.mark.skipif(_gpu_present(), reason="a GPU driver or nvidia-smi is present: this checks the no-GPU path")
def test_gpu_cli_without_gpu_exits_0_and_journals_why(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))}
    proc = subprocess.run([sys.executable, "-m", "supervisor", "--run-dir", str(run_dir), "--gpu-every", "1s",
                           "--", "sleep", "2"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    events = read_journal(run_dir / "events.jsonl").events
    none = [e for e in events if e["kind"] == "gpu-none"]
    assert len(none) == 1, [e["kind"] for e in events]
    assert "NVML Shared Library Not Found" in none[0]["reason"]
    assert not [e for e in events if e["kind"] in ("gpu-start", "gpu-error")]
    assert not (run_dir / "gpu.csv").exists()
