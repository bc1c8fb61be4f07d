"""A restore from the nearest copy that verifies, against today's path (issue 43).

N nodes of a per-node pair (default 4) are simulated in this process as
``tests/sync/test_peer_restore.py`` does: one ``Mirror(..., node_rank=K)`` each, its own local
directory, one persistent side, one run directory, every node's peer server up
(``serve_peers``). Each node writes its part of a DCP-like directory checkpoint ``step_000100/``
(``shard_K_i.bin``, ``--part-mib`` MiB per node; node 0 writes ``.metadata`` last); all the
mirrors run until the leader has published the version (every node's part, assembled).

The persistent side is a real S3 server (SeaweedFS, scripts/s3-up.sh) inside a network
namespace of its own, reached over a veth pair whose server side is shaped with
``tc qdisc add dev VETH root tbf rate 800mbit burst 1mb latency 50ms`` (about 100 MB/s from
the store to the nodes; uploads are not shaped). Where that cannot be set up (not root, no
``ip``/``tc``/``weed``), or with ``--store dir``, the persistent side is a plain directory on
this disk and the output says it is NOT throttled.

Scenarios, each restored by every node at once (the offers, the leader's choice, then every
node's restore concurrently, as ``conduct/fleet.py`` runs them):

1. same nodes, disks kept: each node holds its own shards (peers bring the others');
2. one replacement node: node 2's local directory wiped (node 1 with ``--nodes 2``);
3. all new nodes: every local directory wiped.

Each is run twice: **tiered** (live, set aside, other nodes, persistent) and **today**
(everything from persistent storage: ``_fill.local_candidates`` and ``_peers.remote`` patched
to give nothing). Per run: the restore's wall time (the leader's ``choose`` → every node
restored), bytes from persistent storage, from peers, from the node's own disk (summed over
the nodes' ``restore-verify`` events), and the hash's share: seconds inside sha256 updates
during that phase (every ``hashlib.sha256`` object timed, summed over threads and nodes) over
the sum of the nodes' restore wall times. ``offer s``: the node agents' offers before the
choice (they hash what they hold where no content manifest says it), not in the restore time.

    .venv/bin/python bench/tiers.py                  # 4 nodes x 256 MiB, S3 throttled to ~100 MB/s
    .venv/bin/python bench/tiers.py --quick          # 2 nodes x 32 MiB
    .venv/bin/python bench/tiers.py --part-mib 1024 --store dir

While the version is published, every node's peer server and ring run too (``peer_copies = 1``):
each node's part is copied to the next node's disk. Printed: the single-copy exposure of each
part (``peer-copy``'s ``exposure_s``: its save to the partner's whole copy), p50 and p99 over the
nodes, beside the lag to persistent storage (the leader's ``publish`` ``lag_s``) in the same run.
The scenarios then restore from fresh local directories (the ring's copies are not used there).
Before that, the same version is published once with the ring off (``peer_copies = 0``, a
prefix of its own): its lag to persistent storage is the baseline for the ring's cost to the
persistent copy (printed as a ratio).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402

from supervisor.config import StoreSpec, SyncPair  # noqa: E402
from supervisor.sync import Mirror  # noqa: E402

STEP = "step_000100"
FILES_PER_NODE = 4
RATE = "800mbit"  # ~100 MB/s

# ---- the hash's share: every sha256 object's updates, timed ---------------------------------

_SHA256 = hashlib.sha256
_hash_lock = threading.Lock()
_hashed = [0.0]


class _TimedSha256:
    """``hashlib.sha256`` whose ``update`` adds its duration to ``_hashed`` (every thread)."""

    def __init__(self, data: bytes = b"", **kw: Any) -> None:
        self._h = _SHA256(**kw)
        if data:
            self.update(data)

    def update(self, data: Any) -> None:
        t = time.perf_counter()
        self._h.update(data)
        dt = time.perf_counter() - t
        with _hash_lock:
            _hashed[0] += dt

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def digest(self) -> bytes:
        return self._h.digest()

    def copy(self) -> _TimedSha256:
        c = _TimedSha256.__new__(_TimedSha256)
        c._h = self._h.copy()
        return c

    name = "sha256"
    digest_size = 32
    block_size = 64


def _patched(today: bool) -> Callable[[], None]:
    """Hashing timed; for ``today``, no local candidate and no peer: every module that bound
    ``local_candidates`` or ``remote`` by name gets the empty one. Returns the undo."""
    from supervisor.sync import _fill, _peers

    undo: list[tuple[Any, str, Any]] = [(hashlib, "sha256", _SHA256)]
    hashlib.sha256 = _TimedSha256  # type: ignore[assignment,misc]
    if today:
        originals = (("local_candidates", _fill.local_candidates), ("remote", _peers.remote))
        for mod in [m for n, m in list(sys.modules.items()) if n.startswith("supervisor.sync") and m is not None]:
            for attr, orig in originals:
                if getattr(mod, attr, None) is orig:
                    undo.append((mod, attr, orig))
                    setattr(mod, attr, lambda *a, **k: [])

    def back() -> None:
        for mod, attr, orig in reversed(undo):
            setattr(mod, attr, orig)

    return back


# ---- the persistent side ---------------------------------------------------------------------

class Persistent:
    """An S3 server in a throttled namespace, or a plain directory (``why``: why not S3)."""

    def __init__(self, where: Path, kind: str) -> None:
        self.where = where
        self.url: str | None = None
        self.env: dict[str, str] = {}
        self.ns = f"tiers{os.getpid()}"
        self.veth = f"tbh{os.getpid()}"[:15]
        self.why = ""
        if kind == "s3":
            try:
                self._s3()
            except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired, RuntimeError) as e:
                err = getattr(e, "stderr", "") or ""
                self.why = f"{e} {err.strip()[-300:]}".strip()
                self.close()
        elif kind == "dir":
            self.why = "--store dir"

    @property
    def throttled(self) -> bool:
        return self.url is not None

    def _sh(self, *cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60)

    def _s3(self) -> None:
        for tool in ("ip", "tc", "curl"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"no {tool}")
        if os.geteuid() != 0:
            raise RuntimeError("not root: no network namespace")
        octet = 16 + os.getpid() % 200
        host, inside = f"10.250.{octet}.1", f"10.250.{octet}.2"
        ns, veth = self.ns, self.veth
        self._sh("ip", "netns", "add", ns)
        self._sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "tbn0", "netns", ns)
        self._sh("ip", "addr", "add", f"{host}/30", "dev", veth)
        self._sh("ip", "link", "set", veth, "up")
        self._sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{inside}/30", "dev", "tbn0")
        self._sh("ip", "netns", "exec", ns, "ip", "link", "set", "tbn0", "up")
        self._sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        # the store → the nodes: what a restore reads (the server's egress on its veth)
        self._sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "tbn0", "root", "tbf", "rate", RATE,
                 "burst", "1mb", "latency", "50ms")
        up = subprocess.run(["bash", str(ROOT / "scripts" / "s3-up.sh"), str(self.where / "s3"), "--netns", ns,
                             "--ip", inside, "--bucket", "bench"], capture_output=True, text=True, timeout=120)
        if up.returncode != 0:
            raise RuntimeError(f"s3-up.sh: {up.stderr.strip()[-300:]}")
        for word in up.stdout.split():
            k, _, v = word.partition("=")
            if k.startswith("AWS_"):
                self.env[k] = v
        self.url = "s3://bench/job/ckpt"

    def pair(self, node: int, local: Path, nodes: int, ring: bool = True) -> SyncPair:
        """Node ``node``'s pair; ``ring`` False: no peer copies, into a prefix of its own."""
        common: dict[str, Any] = dict(restore=True, nodes=nodes, settle=0.5, profile="dcp", peer_copies=int(ring))
        if self.url is not None:
            url = self.url if ring else self.url.replace("/job/", "/job-no-ring/")
            return SyncPair("ckpt", "checkpoint", local, Path(url), store=StoreSpec.parse(url), **common)
        return SyncPair("ckpt", "checkpoint", local, self.where / ("persist" if ring else "persist-no-ring"), **common)

    def describe(self) -> str:
        if self.url is not None:
            return f"S3 (SeaweedFS) in netns {self.ns}, its veth shaped: tbf rate {RATE} burst 1mb latency 50ms"
        return f"a plain directory on this disk, NOT throttled ({self.why})"

    def close(self) -> None:
        if (self.where / "s3").exists():
            subprocess.run(["bash", str(ROOT / "scripts" / "s3-down.sh"), str(self.where / "s3")], capture_output=True,
                           timeout=60)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=60)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True, timeout=60)


# ---- the nodes ----------------------------------------------------------------------------------

def write_parts(golden: Path, nodes: int, part: int) -> None:
    """Each node's shards (random bytes, ``part`` bytes in ``FILES_PER_NODE`` files); node 0's
    ``.metadata`` last, as DCP writes it."""
    each = part // FILES_PER_NODE
    for k in range(nodes):
        d = golden / f"n{k}" / STEP
        d.mkdir(parents=True)
        for i in range(FILES_PER_NODE):
            with open(d / f"shard_{k}_{i}.bin", "wb") as f:
                left = each
                while left:
                    n = min(left, 4 << 20)
                    f.write(os.urandom(n))
                    left -= n
    (golden / "n0" / STEP / ".metadata").write_bytes(os.urandom(4096))


def reset_local(golden: Path, local: Path, node: int, wiped: bool) -> None:
    """``local`` as the scenario wants it: empty (a new node), or the node's own shards only
    (hard links to the written ones: same bytes, same mtimes)."""
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    if wiped:
        return
    src = golden / f"n{node}" / STEP
    (local / STEP).mkdir()
    for f in sorted(src.iterdir()):
        os.link(f, local / STEP / f.name)


class Job:
    def __init__(self, work: Path, persistent: Persistent, nodes: int, ring: bool = True) -> None:
        self.work, self.persistent, self.nodes, self.ring = work, persistent, nodes, ring
        self.events: list[tuple[int, str, dict[str, Any]]] = []

    def local(self, k: int) -> Path:
        return self.work / "local" / f"n{k}"

    def _emitter(self, k: int) -> Callable[..., Any]:
        def emit(kind: str, durable: bool = False, **f: Any) -> Any:
            self.events.append((k, kind, f))
            return f

        return emit

    def mirrors(self) -> list[Mirror]:
        out = []
        for k in range(self.nodes):
            m = Mirror([self.persistent.pair(k, self.local(k), self.nodes, self.ring)], emit=self._emitter(k), sync_every=600,
                       node_rank=k, parts_poll=0.2, backend="python", nice=0, ionice="none")
            m.check()
            out.append(m)
        return out

    async def publish(self, run_dir: Path, timeout: float) -> float:
        """Every node's mirror, peer server and ring running until the leader published the
        version and every node's part is on its partner; its seconds."""
        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for m in self.mirrors():
                await tg.start(m.serve_peers, run_dir)
                await tg.start(m.run)
            with anyio.fail_after(timeout):
                while not (any(k == 0 and kind == "publish" and STEP in str(f) for k, kind, f in self.events)
                           and (not self.ring or len({k for k, kind, _f in self.events if kind == "peer-copy"}) == self.nodes)):
                    await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
        return time.monotonic() - t0

    def exposure(self) -> tuple[list[float], float | None]:
        """The parts' single-copy exposure (``peer-copy``), and the version's lag to persistent storage."""
        copies = sorted(float(f["exposure_s"]) for _k, kind, f in self.events if kind == "peer-copy")
        lag = next((float(f["lag_s"]) for k, kind, f in self.events if k == 0 and kind == "publish" and STEP in str(f)
                    and f.get("lag_s") is not None), None)
        return copies, lag

    async def restore(self, run_dir: Path, timeout: float) -> dict[str, Any]:
        """Offers, the leader's choice, every node's restore at once."""
        ms = self.mirrors()
        per_node: dict[int, float] = {}
        since = len(self.events)
        with anyio.fail_after(timeout):
            async with anyio.create_task_group() as tg:
                for m in ms:
                    await tg.start(m.serve_peers, run_dir)
                offers: dict[int, Any] = {}
                t_offer = time.monotonic()

                async def offer(k: int) -> None:
                    offers[k] = await ms[k].offer()

                async with anyio.create_task_group() as tg2:
                    for k in range(1, self.nodes):
                        tg2.start_soon(offer, k)
                offer_s = time.monotonic() - t_offer
                _hashed[0] = 0.0
                t0 = time.monotonic()
                choice = await ms[0].choose(offers)

                async def one(k: int) -> None:
                    t = time.monotonic()
                    got = await ms[k].restore(choice)
                    per_node[k] = time.monotonic() - t
                    if got is None or got.name != STEP:
                        raise RuntimeError(f"node {k} restored {got}")

                async with anyio.create_task_group() as tg2:
                    for k in range(self.nodes):
                        tg2.start_soon(one, k)
                wall = time.monotonic() - t0
                hashed = _hashed[0]
                tg.cancel_scope.cancel()
        came: dict[str, int] = {"persistent": 0, "peers": 0, "local": 0}
        verifies = [(k, f) for k, kind, f in self.events[since:] if kind == "restore-verify"]
        for k, f in verifies:
            if f.get("result") != "verified":
                raise RuntimeError(f"node {k}: restore-verify {f}")
            for src, n in f["from"].items():
                tier = "local" if src in ("live", "aside") else "peers" if src.startswith("node-") else "persistent"
                came[tier] += int(n)
        if sorted(k for k, _ in verifies) != list(range(self.nodes)):
            raise RuntimeError(f"restore-verify from nodes {[k for k, _ in verifies]}")
        failed: dict[str, int] = {}
        for _, f in verifies:
            for x in f.get("failed", []):
                why = f"{x['from']}: {str(x['why']).split(':')[0][:40]}"
                failed[why] = failed.get(why, 0) + 1
        return {"wall": wall, "offer": offer_s, "hash": hashed, "node_s": sum(per_node.values()), **came,
                "failed": failed}


# ---- main ------------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, -(-int(q * 100) * len(s) // 100) - 1))]


def scenarios(nodes: int) -> list[tuple[str, set[int]]]:
    new = min(2, nodes - 1)
    return [("same nodes, disks kept", set()), (f"node {new} replaced", {new}),
            ("all new nodes", set(range(nodes)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--part-mib", type=int, default=256, help="each node's part of the checkpoint")
    ap.add_argument("--quick", action="store_true", help="2 nodes x 32 MiB")
    ap.add_argument("--store", choices=("s3", "dir"), default="s3",
                    help="s3: throttled SeaweedFS in a namespace (falls back to dir where it cannot run)")
    ap.add_argument("--work", default=None, help="where the nodes' disks and the store go (default: a temp dir)")
    a = ap.parse_args()
    nodes, part_mib = (2, 32) if a.quick else (a.nodes, a.part_mib)
    if nodes < 2:
        ap.error("--nodes: at least 2")
    MiB = 1 << 20
    with tempfile.TemporaryDirectory(dir=a.work, prefix="bench-tiers-") as tmp:
        work = Path(tmp)
        persistent = Persistent(work, a.store)
        try:
            os.environ.update(persistent.env)
            print(f"{nodes} nodes x {part_mib} MiB ({FILES_PER_NODE} shards each; the version: "
                  f"{nodes * part_mib} MiB, every node restores all of it)", flush=True)
            print(f"persistent side: {persistent.describe()}", flush=True)
            golden = work / "written"
            t = time.monotonic()
            write_parts(golden, nodes, part_mib * MiB)
            # the baseline first: the same version published with the ring off (a prefix of its own)
            alone = Job(work, persistent, nodes, ring=False)
            for k in range(nodes):
                reset_local(golden, alone.local(k), k, wiped=False)
            print(f"written in {time.monotonic() - t:.1f} s; publishing with the ring off…", flush=True)
            took_alone = anyio.run(alone.publish, work / "run-no-ring", 1800.0)
            _none, lag_alone = alone.exposure()
            job = Job(work, persistent, nodes)
            for k in range(nodes):
                reset_local(golden, job.local(k), k, wiped=False)
            print(f"published by the {nodes} mirrors in {took_alone:.1f} s; again with the ring on…", flush=True)
            took = anyio.run(job.publish, work / "run0", 1800.0)
            copies, lag = job.exposure()
            exposure = (f"p50 {_pct(copies, 0.5):.2f} s, p99 {_pct(copies, 0.99):.2f} s over {len(copies)} parts"
                        if copies else "no copy")
            print(f"published by the {nodes} mirrors in {took:.1f} s", flush=True)
            rows = []
            runs = 0
            for name, wiped in scenarios(nodes):
                got = {}
                for path in ("tiered", "today"):
                    for k in range(nodes):
                        reset_local(golden, job.local(k), k, wiped=k in wiped)
                    runs += 1
                    back = _patched(today=path == "today")
                    try:
                        got[path] = anyio.run(job.restore, work / f"run{runs}", 1800.0)
                    finally:
                        back()
                    r = got[path]
                    print(f"  {name:<22} {path:<6} {r['wall']:7.2f} s  persistent {r['persistent'] / MiB:7.0f} MiB  "
                          f"peers {r['peers'] / MiB:7.0f} MiB  local {r['local'] / MiB:7.0f} MiB  "
                          f"hash {100 * r['hash'] / max(r['node_s'], 1e-9):4.1f} %  offer {r['offer']:.2f} s"
                          + (f"  (tries that failed: {r['failed']})" if r["failed"] else ""), flush=True)
                rows.append((name, got))
            shutil.rmtree(work / "local", ignore_errors=True)
        finally:
            persistent.close()
    print()
    print(f"Restore of {nodes} nodes x {part_mib} MiB; persistent side: {persistent.describe()}")
    head = (f"{'scenario':<22} | {'path':<6} | {'restore s':>9} | {'persistent MiB':>14} | {'peers MiB':>9} | "
            f"{'local MiB':>9} | {'hash %':>6} | {'offer s':>7}")
    print(head)
    print("-" * len(head))
    for name, got in rows:
        for path in ("tiered", "today"):
            r = got[path]
            print(f"{name if path == 'tiered' else '':<22} | {path:<6} | {r['wall']:9.2f} | "
                  f"{r['persistent'] / MiB:14.0f} | {r['peers'] / MiB:9.0f} | {r['local'] / MiB:9.0f} | "
                  f"{100 * r['hash'] / max(r['node_s'], 1e-9):6.1f} | {r['offer']:7.2f}")
        t, d = got["tiered"], got["today"]
        share = f"{t['persistent'] / d['persistent']:.2f}" if d["persistent"] else "-"
        print(f"{'':<22} | ratio: today / tiered time {d['wall'] / t['wall']:.2f}x; "
              f"tiered's persistent bytes = {share} of today's")
    print("hash %: seconds in sha256 updates (all threads, all nodes) / sum of the nodes' restore wall times; goal <= 10 %")
    print(f"peer-copy exposure (a part's save to its partner's whole copy): {exposure}; "
          f"lag to persistent storage of the version: {lag if lag is not None else '-'} s")
    ratio = f"{lag / lag_alone:.2f}x" if lag is not None and lag_alone else "-"
    print(f"lag to persistent storage, ring on {lag if lag is not None else '-'} s against ring off "
          f"{lag_alone if lag_alone is not None else '-'} s: {ratio} (whole publish {took:.1f} s against {took_alone:.1f} s)")


if __name__ == "__main__":
    main()
