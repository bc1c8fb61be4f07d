"""Publishing one checkpoint to an object store, beside obstore's own concurrent put of the same files.

Two shapes (issue 34): a few large files (8 × 128 MiB = 1 GiB) and many small ones
(10 000 × 4 KiB). A real S3 server (SeaweedFS, scripts/s3-up.sh) runs on this machine for the
whole benchmark. Each run, in turn:

1. the client's limit: obstore's own ``put_async`` of every file at once (a ``Path``, which
   obstore reads in Rust: concurrent multipart for the large files; as many files in flight as
   supervise puts small files, ``SMALL_AT_ONCE``), in a fresh Python process (timed inside it;
   its peak RSS);
2. the real ``supervise --checkpoints LOCAL s3://…``, started with the checkpoint already on
   disk and no marker (``--settle 1h``: quiet time never completes it), then DCP's marker
   ``.metadata`` is written and the time until the checkpoint's manifest is in the bucket is
   measured (marker → manifest: the listing, the upload with its hashing, the re-check, the
   conditional put). Peak RSS is ``VmHWM`` of the supervise process, polled every 10 ms;
3. obstore's put again.

The baseline is the mean of the two puts that bracket the run; ``ratio`` = baseline time /
supervise time, i.e. supervise's throughput as a share of the client's (goal ≥ 0.8), and
supervise's peak RSS (goal < 200 MB). Each run uploads under its own prefix, removed after.

    .venv/bin/python bench/s3.py                 # both shapes, 3 runs
    .venv/bin/python bench/s3.py --quick         # 8 × 16 MiB and 1 000 files, 1 run
    .venv/bin/python bench/s3.py --shapes large --runs 5
    .venv/bin/python bench/s3.py --shapes frozen  # HF Trainer, frozen base, 8 checkpoints: sent vs changed (_s3_frozen.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _s3_server import s3_up  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _put_all(directory: str, bucket: str, prefix: str) -> None:
    """The baseline, in its own process: obstore's concurrent put of every file under ``directory``."""
    import obstore
    from obstore.store import S3Store

    env = os.environ
    store = S3Store(bucket, endpoint=env["AWS_ENDPOINT_URL"], access_key_id=env["AWS_ACCESS_KEY_ID"],
                    secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region=env["AWS_REGION"],
                    client_options={"allow_http": True})
    files = sorted(p for p in Path(directory).rglob("*") if p.is_file())

    async def main() -> float:
        from supervisor.sync._store import SMALL_AT_ONCE

        gate = asyncio.Semaphore(SMALL_AT_ONCE)  # as many files in flight as supervise puts small files

        async def one(p: Path) -> None:
            async with gate:
                await obstore.put_async(store, f"{prefix}/{p.relative_to(directory)}", p)

        t0 = time.monotonic()
        await asyncio.gather(*(one(p) for p in files))
        return time.monotonic() - t0

    seconds = asyncio.run(main())
    print(json.dumps({"seconds": seconds, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def baseline(directory: Path, bucket: str, prefix: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--put-all", str(directory), bucket, prefix], env=env,
                         capture_output=True, text=True, check=True, timeout=1800).stdout
    return json.loads(out.strip().splitlines()[-1])


def make_shape(where: Path, shape: str, quick: bool) -> tuple[Path, int]:
    """The checkpoint's directory (no marker yet) and its bytes."""
    ckpt = where / "local" / "step_000001"
    ckpt.mkdir(parents=True)
    if shape == "large":
        size = (16 if quick else 128) << 20
        for i in range(8):
            with open(ckpt / f"__{i}_0.distcp", "wb") as f:
                for _ in range(size >> 20):
                    f.write(os.urandom(1 << 20))
        return ckpt, 8 * size
    n = 1000 if quick else 10_000
    for i in range(n):
        (ckpt / f"t{i // 1000:02d}").mkdir(exist_ok=True)
        (ckpt / f"t{i // 1000:02d}" / f"tensor_{i:05d}.bin").write_bytes(os.urandom(4096))
    return ckpt, n * 4096


def vm_hwm(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def supervised(where: Path, ckpt: Path, bucket: object, url: str, prefix: str, env: dict[str, str]) -> dict[str, float]:
    """The real supervise: marker written → the checkpoint's manifest in the bucket."""
    import obstore

    run = where / f"run-{time.time_ns()}"
    p = subprocess.Popen([sys.executable, "-m", "supervisor", "--run-dir", str(run), "--settle", "1h",
                          "--checkpoints", str(ckpt.parent), url, "--", "sleep", "3600"],
                         env={**env, "SUPERVISE_SYNC_NICE": "0", "SUPERVISE_SYNC_IONICE": "none"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        journal = run / "events.jsonl"
        deadline = time.monotonic() + 120
        while not (journal.exists() and any(json.loads(line).get("trigger") == "start"
                                            for line in journal.read_text().splitlines() if line.startswith("{"))):
            assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() is not None else "no start"
            time.sleep(0.05)
        key = f"{prefix}/.supervise/manifests/{ckpt.name}.json"
        peak = vm_hwm(p.pid)
        (ckpt / ".metadata").write_bytes(b"dcp")
        t0 = time.monotonic()
        while True:
            peak = max(peak, vm_hwm(p.pid))
            try:
                obstore.head(bucket, key)
                break
            except FileNotFoundError:
                time.sleep(0.01)
            assert time.monotonic() - t0 < 1800, "no manifest after 30 min"
        seconds = time.monotonic() - t0
        return {"seconds": seconds, "rss_mb": max(peak, vm_hwm(p.pid))}
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
        (ckpt / ".metadata").unlink(missing_ok=True)


def remove_prefix(store: object, prefix: str) -> None:
    import obstore

    keys = [m["path"] for batch in obstore.list(store, prefix=prefix) for m in batch]
    for i in range(0, len(keys), 1000):
        obstore.delete(store, keys[i:i + 1000])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="large,many")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--work", default=None, help="where the checkpoints and the server's data go (default: a temp dir)")
    ap.add_argument("--put-all", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.put_all:
        _put_all(*a.put_all)
        return
    runs = 1 if a.quick and a.runs == 3 else a.runs
    with tempfile.TemporaryDirectory(dir=a.work, prefix="bench-s3-") as tmp:
        where = Path(tmp)
        env, store = s3_up(where / "s3")
        try:
            for shape in a.shapes.split(","):
                if shape == "frozen":  # bytes sent against bytes changed, 8 checkpoints (issue 45)
                    from _s3_frozen import run as frozen

                    frozen(where, env, quick=a.quick)
                    continue
                shape_dir = where / shape
                ckpt, total = make_shape(shape_dir, shape, a.quick)
                files = sum(1 for p in ckpt.rglob("*") if p.is_file())
                print(f"{shape}: {files} files, {total / 2**20:.0f} MiB", flush=True)
                ratios = []
                for r in range(runs):
                    before = baseline(ckpt, "bench", f"b{r}a-{shape}", env)
                    remove_prefix(store, f"b{r}a-{shape}")
                    sup = supervised(shape_dir, ckpt, store, f"s3://bench/s{r}-{shape}", f"s{r}-{shape}", env)
                    remove_prefix(store, f"s{r}-{shape}")
                    after = baseline(ckpt, "bench", f"b{r}b-{shape}", env)
                    remove_prefix(store, f"b{r}b-{shape}")
                    base = (before["seconds"] + after["seconds"]) / 2
                    ratio = base / sup["seconds"]
                    ratios.append(ratio)
                    print(f"  run {r + 1}: obstore {before['seconds']:.2f}/{after['seconds']:.2f} s "
                          f"({total / 2**20 / base:.0f} MiB/s, peak {max(before['rss_mb'], after['rss_mb']):.0f} MiB) | "
                          f"supervise {sup['seconds']:.2f} s ({total / 2**20 / sup['seconds']:.0f} MiB/s, "
                          f"peak RSS {sup['rss_mb']:.0f} MiB) | ratio {ratio:.2f}", flush=True)
                print(f"  {shape}: ratio median {statistics.median(ratios):.2f} (supervise / obstore throughput; goal >= 0.8)",
                      flush=True)
        finally:
            subprocess.run(["bash", str(ROOT / "scripts" / "s3-down.sh"), str(where / "s3")], capture_output=True)


if __name__ == "__main__":
    main()
