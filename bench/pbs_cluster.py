"""The PBS test cluster's cost (issue 31): start, a tiny job, stop, memory, beside the Slurm
multi-node test cluster of the same size in the same invocation.

For N moms (``--nodes``, default 1 and 3): ``scripts/pbs-up.sh ROOT --nodes N`` (copied
PBS_HOMEs after the first start), a job of the job user (``qsub`` → finished, ``hostname``),
the resident memory of every process in the cluster's namespaces, ``scripts/pbs-down.sh``.
Beside it ``scripts/slurm-up.sh ROOT --nodes max(N, 2)`` (the Slurm one needs 2 nodes), its
``sbatch`` → COMPLETED of the same job, and ``slurm-down.sh``. Ratios are PBS / Slurm.

    .venv/bin/python bench/pbs_cluster.py            # N = 1 and 3, 3 rounds each
    .venv/bin/python bench/pbs_cluster.py --rounds 1 --nodes 3

Needs root, OpenPBS in /opt/pbs (scripts/build-openpbs.sh) and Slurm; clusters live under
/var/tmp and are torn down after each round.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"


def timed(argv: list[str], **kw) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, text=True, **kw)
    return time.monotonic() - t0


def rss_mib(prefixes: list[str]) -> float:
    """Resident memory of every process in the namespaces whose names start with a prefix."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    total = 0
    for ns in {n for n in names if any(n.startswith(p) for p in prefixes)}:
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                pass
    return total / 1024


def wait(cond, timeout: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.05)


def pbs_round(n: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="bench-pbs-", dir="/var/tmp"))
    try:
        up = timed(["bash", str(SCRIPTS / "pbs-up.sh"), str(root), "--nodes", str(n)])
        pfx = dict(line.split("=", 1) for line in (root / "pbs.env").read_text().splitlines())["PFX"]
        mem = rss_mib([pfx])
        work = root / "shared" / "alice"
        t0 = time.monotonic()
        jobid = subprocess.run([str(root / "as-user"), "qsub", "-j", "oe", "--", "/bin/hostname"], cwd=work,
                               check=True, capture_output=True, text=True).stdout.strip()

        def finished() -> bool:
            out = subprocess.run([str(root / "in-cluster"), "qstat", "-x", "-f", "-F", "json", jobid],
                                 capture_output=True, text=True).stdout
            jobs = json.loads(out or "{}").get("Jobs", {})
            return any(j.get("job_state") == "F" for j in jobs.values())

        wait(finished)
        job = time.monotonic() - t0
        down = timed(["bash", str(SCRIPTS / "pbs-down.sh"), str(root)])
        return {"up": up, "job": job, "down": down, "rss": mem}
    finally:
        subprocess.run(["bash", str(SCRIPTS / "pbs-down.sh"), str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def slurm_round(n: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="bench-slurm-", dir="/var/tmp"))
    try:
        up = timed(["bash", str(SCRIPTS / "slurm-up.sh"), str(root), "--nodes", str(n)])
        pfx = dict(line.split("=", 1) for line in (root / "multinode.env").read_text().split())["PFX"]
        mem = rss_mib([pfx])
        t0 = time.monotonic()
        jobid = subprocess.run([str(root / "in-cluster"), "sbatch", "--parsable", "-o", "/dev/null",
                                "--wrap", "hostname"], cwd=root / "shared", check=True, capture_output=True,
                               text=True).stdout.strip().split(";")[0]

        def finished() -> bool:
            out = subprocess.run([str(root / "in-cluster"), "scontrol", "show", "job", "-o", jobid],
                                 capture_output=True, text=True).stdout
            return "JobState=COMPLETED" in out

        wait(finished)
        job = time.monotonic() - t0
        down = timed(["bash", str(SCRIPTS / "slurm-down.sh"), str(root)])
        return {"up": up, "job": job, "down": down, "rss": mem}
    finally:
        subprocess.run(["bash", str(SCRIPTS / "slurm-down.sh"), str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = {}
    for n in args.nodes:
        pbs = [pbs_round(n) for _ in range(args.rounds)]
        slurm = [slurm_round(max(n, 2)) for _ in range(args.rounds)]
        row = {}
        for key in ("up", "job", "down", "rss"):
            p, s = statistics.median(r[key] for r in pbs), statistics.median(r[key] for r in slurm)
            row[key] = {"pbs": round(p, 2), "slurm": round(s, 2), "ratio": round(p / s, 2) if s else None}
        results[n] = row
        print(f"N={n} (Slurm {max(n, 2)}), median of {args.rounds}: " + "; ".join(
            f"{k} PBS {v['pbs']} vs Slurm {v['slurm']} (×{v['ratio']})" for k, v in row.items())
            + "  [s; rss MiB]", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
