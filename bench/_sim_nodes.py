"""The load generator of bench/scale_sim.py: N-1 node agents in one process, as the leader hears them.

``srun`` (a stub first on the leader's PATH) execs ``_sim_nodes.py srun ARGS``: the leader's one
``srun --overlap --nodes=N … python -m supervisor node-agent --run-dir RUN … --leader-config
JSON``. For every node K in 1 … N-1 it does what a real agent (conduct/node.py) says and
writes, in that order, without a Python process per node:

- connects to the leader's line (``RUN/nodes/link.json``: ``hello TOKEN K``, ``ok``) and keeps
  the connection; writes its offer (``RUN/nodes/node-K/offer.json``, an empty node's: nothing held)
  and prints ``supervise-node-agent offered K HOST`` on stdout (srun merges the tasks' stdout);
  node 0's task prints ``… leader 0 HOST`` as a real agent there does;
- on the leader's choice (``choice`` word, or the file ``SUPERVISE_NODE_CHOICE`` names): ``…
  restored K HOST {"round":R,"holds":…}`` for a round that does not stand, ``… ready K HOST
  HOLDS`` once it stands (an empty node holds ``{"ckpt":null}``, as node 0 does);
- on ``go`` (node 0's part complete: the go file ``complete-on-node-0``): after a random delay
  in ``[0, SIM_JITTER]`` s, stages node K's part on the shared directory as
  sync/_parts.py does: ``.supervise-parts/<ckpt>/node-K/__K_0.distcp`` (``SIM_SIZE`` bytes),
  then its manifest ``node-K.json`` (the same fields, sha256 included), written last, temp +
  rename, fsynced; says ``part`` on its connection;
- on ``taken``: removes the part directories whose manifest the leader removed (``_parts.tidy``);
- on ``journal``: answers a ``nodes-flush`` in ``RUN/nodes/node-K/events.jsonl`` (``node-flush``
  with its ``request``) and says ``journal``; ends once the leader's ``end`` is journaled.

A safety look every ``LOOK_S`` stands in for a word lost (as an agent's rare look does); the
words heard are counted, so a word the leader never said shows. With ``SIM_KILL`` (a file), the
node named in it dies when the file appears, as Slurm reports a node failure: ``SIM_DOWN`` (the
stub scontrol's list of nodes it calls DOWN) gets its host, its connection drops, and the step
on it, every agent's, is killed: srun's error lines on stderr, every connection closed, srun
exits 1. With ``SIM_DEATH=task`` only node K's agent dies: its connection drops, srun says
``task K: Killed`` and goes on, the node stays up.
What happened is appended to ``SIM_OUT`` (JSON lines: ``part`` times, ``ready``, ``death``,
``words``).

The training on node 0 is ``_sim_nodes.py train OUT``: every ``--every`` s node 0's shard and
the DCP marker ``.metadata`` last, ``--saves`` times (after the newest step in OUT: a restart
goes on from what it restored), then idle ``--idle`` s and exit. At a restart (the run
directory's second attempt) a node that restored the leader's choice says the version's
identity (``version_of``) as a real agent does; its download is not simulated.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

READY = "supervise-node-agent"
PARTS = ".supervise-parts"
GO = "complete-on-node-0"
LOOK_S = 1.0


def host(k: int) -> str:
    return f"sim{k:04d}"


class Sim:
    def __init__(self, argv: list[str]) -> None:
        opts: dict[str, str] = {}
        while argv and argv[0].startswith("--"):
            key, _, value = argv.pop(0)[2:].partition("=")
            opts[key] = value
        self.n = int(opts["nodes"])
        cmd = argv
        self.run_dir = Path(cmd[cmd.index("--run-dir") + 1])
        cfg = json.loads(cmd[cmd.index("--leader-config") + 1])
        pair = next(p for p in cfg["sync"] if p.get("kind", "checkpoint") == "checkpoint" and p.get("nodes") not in (None, 1))
        self.pair, self.dst = str(pair["name"]), Path(pair["to"])
        self.choice_path = Path(os.environ["SUPERVISE_NODE_CHOICE"])
        self.size = int(os.environ.get("SIM_SIZE", str(64 << 10)))
        self.jitter = float(os.environ.get("SIM_JITTER", "0.5"))
        self.out = Path(os.environ["SIM_OUT"])
        self.kill = Path(os.environ["SIM_KILL"]) if os.environ.get("SIM_KILL") else None
        self.down = Path(os.environ["SIM_DOWN"]) if os.environ.get("SIM_DOWN") else None
        self.whole_node = os.environ.get("SIM_DEATH", "node") == "node"  # else only the agent (task) dies
        self.nodes = range(1, self.n)
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.dead: set[int] = set()
        self.words: dict[str, int] = {}
        self.wake = {w: asyncio.Event() for w in ("choice", "go", "taken", "journal")}
        self.round = 0
        self.staged: set[str] = set()                 # checkpoints whose go was seen (every node stages them)
        self.parted: dict[int, set[str]] = {k: set() for k in self.nodes}  # node → its parts not yet taken
        try:  # from here: an earlier attempt's lines (its ``end``) are not this leader's words
            self.leader_at = (self.run_dir / "events.jsonl").stat().st_size
        except OSError:
            self.leader_at = 0
        self.versions: dict[str, Any] = {}           # a chosen version → what a node that restored it holds
        self.ended = asyncio.Event()
        self.status = 0
        self.log = open(self.out, "a", encoding="utf-8")  # noqa: SIM115 - for the process's life

    def note(self, **fields: Any) -> None:
        self.log.write(json.dumps(fields) + "\n")
        self.log.flush()

    def say(self, lines: list[str]) -> None:
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        sys.stdout.flush()

    def tell(self, k: int, word: str) -> None:
        w = self.writers.get(k)
        if w is not None and not w.is_closing():
            w.write(f"{word}\n".encode())

    async def main(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * self.n + 512)), hard))
        t0 = time.time()
        link = await self.link_file()
        # as real agents: the line is tried at once, the offer written, "offered" said
        await asyncio.gather(*(self.connect(k, link) for k in self.nodes))
        for k in self.nodes:
            where = self.run_dir / "nodes" / f"node-{k}"
            where.mkdir(parents=True, exist_ok=True)
            tmp = where / ".offer.json.tmp"
            tmp.write_text(json.dumps({"choice": str(self.choice_path), "pairs": {self.pair: {".copies": {}}}},
                                      separators=(",", ":")))
            os.replace(tmp, where / "offer.json")
        self.say([f"{READY} leader 0 {host(0)}"] + [f"{READY} offered {k} {host(k)}" for k in self.nodes])
        self.note(kind="offered", t=time.time(), since_start=round(time.time() - t0, 3),
                  linked=len(self.writers))
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.ended.set)  # the leader's end, or scancel
        tasks = [asyncio.create_task(f()) for f in (self.choices, self.gos, self.takens, self.journals, self.looks,
                                                   self.deaths)]
        await self.ended.wait()
        for t in tasks:
            t.cancel()
        self.note(kind="words", words=self.words, t=time.time())
        for w in self.writers.values():
            w.close()

    async def link_file(self) -> dict[str, Any]:
        path = self.run_dir / "nodes" / "link.json"
        while True:
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError):
                await asyncio.sleep(0.1)

    async def connect(self, k: int, link: dict[str, Any]) -> None:
        for h in link["hosts"]:
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(h, link["port"]), 2.0)
                w.write(f"hello {link['token']} {k}\n".encode())
                if await asyncio.wait_for(r.readline(), 5.0) == b"ok\n":
                    self.writers[k] = w
                    asyncio.create_task(self.hear(k, r))
                    return
                w.close()
            except (OSError, asyncio.TimeoutError):
                continue
        self.note(kind="unlinked", node=k, t=time.time())

    async def hear(self, k: int, r: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await r.readline()
            except OSError:
                break
            if not line:
                break
            word = line.decode(errors="replace").strip()
            self.words[word] = self.words.get(word, 0) + 1
            if word in self.wake:
                self.wake[word].set()
            elif word.split(" ", 1)[0] == "nodes-flush":  # the request itself (issue 46): read as the journal's
                self.wake["journal"].set()
        if k not in self.dead and not self.ended.is_set():
            self.note(kind="line-lost", node=k, t=time.time())

    async def looks(self) -> None:
        """The rare look an agent makes anyway: a word lost costs a look, never an answer."""
        while True:
            await asyncio.sleep(LOOK_S)
            for e in self.wake.values():
                e.set()

    async def waiting(self, word: str) -> None:
        await self.wake[word].wait()
        self.wake[word].clear()

    async def choices(self) -> None:
        while True:
            await self.waiting("choice")
            try:
                body = json.loads(self.choice_path.read_text())
            except (OSError, ValueError):
                continue
            turn, final = int(body.get("round") or 0), bool(body.get("final"))
            if turn > self.round and not final:
                self.round = turn
                said = json.dumps({"round": turn, "holds": self.holds(body)}, separators=(",", ":"))
                self.say([f"{READY} restored {k} {host(k)} {said}" for k in self.nodes if k not in self.dead])
            elif final:
                self.round = turn
                holds = json.dumps(self.holds(body), separators=(",", ":"))
                self.say([f"{READY} ready {k} {host(k)} {holds}" for k in self.nodes if k not in self.dead])
                self.note(kind="ready", t=time.time())
                return

    def holds(self, body: dict[str, Any]) -> dict[str, Any]:
        """What a node that restored the leader's choice says it holds: the version's identity
        as a real agent computes it of its restored copy (``version_of``, of the published one
        here: the same names, sizes and mtimes), or None where nothing was chosen. The
        restore itself (each node's download) is not simulated."""
        v = (body.get("choice") or {}).get(self.pair)
        name = v.get("checkpoint") if isinstance(v, dict) else v
        if not name:
            return {self.pair: None}
        if name not in self.versions:
            from supervisor.sync._versions import version_of  # the leader's own identity of a version

            self.versions[name] = version_of(self.dst / name)
        return {self.pair: self.versions[name]}

    async def gos(self) -> None:
        root = self.dst / PARTS
        while True:
            await self.waiting("go")
            try:
                names = [n for n in os.listdir(root) if n not in self.staged and (root / n / GO).exists()]
            except OSError:
                continue
            for name in names:
                self.staged.add(name)
                seen = time.time()
                digest = hashlib.sha256(self.content(name)).hexdigest()
                for k in self.nodes:
                    asyncio.get_running_loop().call_later(random.uniform(0, self.jitter), self.stage, name, k, seen,
                                                          digest)

    def content(self, name: str) -> bytes:
        step = int(name.rsplit("_", 1)[1]) if name.rsplit("_", 1)[-1].isdigit() else 0
        return bytes([step % 256]) * self.size

    def stage(self, name: str, k: int, seen: float, digest: str) -> None:
        """Node K's part of ``name``, as sync/_parts.py writes one: files, then the manifest last."""
        if k in self.dead or self.ended.is_set():
            return
        pdir = self.dst / PARTS / name / f"node-{k}"
        pdir.mkdir(parents=True, exist_ok=True)
        rel = f"__{k}_0.distcp"
        with open(pdir / rel, "wb") as f:
            f.write(self.content(name))
        st = os.stat(pdir / rel)
        body = {"v": 1, "checkpoint": name, "node": k, "nodes": self.n, "host": host(k), "pid": os.getpid(),
                "is_dir": True, "files": {rel: [st.st_size, st.st_mtime_ns, digest]}, "markers": [],
                "bytes": st.st_size, "why": "go from node 0", "done_at": seen, "written_at": round(time.time(), 6)}
        path = pdir.parent / f"node-{k}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self.parted[k].add(name)
        self.tell(k, "part")
        self.note(kind="part", checkpoint=name, node=k, t=time.time())

    async def takens(self) -> None:
        while True:
            await self.waiting("taken")
            for k in self.nodes:
                gone = [n for n in self.parted[k] if not os.path.lexists(self.dst / PARTS / n / f"node-{k}.json")]
                for name in gone:
                    self.parted[k].discard(name)
                    shutil.rmtree(self.dst / PARTS / name / f"node-{k}", ignore_errors=True)
                    try:
                        os.rmdir(self.dst / PARTS / name)
                    except OSError:
                        pass

    async def journals(self) -> None:
        path = self.run_dir / "events.jsonl"
        while True:
            await self.waiting("journal")
            try:
                with open(path, "rb") as f:
                    f.seek(self.leader_at)
                    data = f.read()
            except OSError:
                self.ended.set()  # the run directory is gone: so is the leader
                continue
            data = data[:data.rfind(b"\n") + 1]
            self.leader_at += len(data)
            for raw in data.splitlines():
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                if ev.get("kind") == "nodes-flush":
                    self.answer(ev)
                elif ev.get("kind") == "end":
                    self.ended.set()

    def answer(self, ev: dict[str, Any]) -> None:
        for k in ev.get("nodes") or []:
            if k in self.dead or k not in self.parted:
                continue
            with open(self.run_dir / "nodes" / f"node-{k}" / "events.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"t": time.time(), "kind": "node-flush", "node": k, "request": ev.get("request"),
                                    "ok": True, "seconds": 0.0, "pairs": {}, "not_durable": []}) + "\n")
            self.tell(k, "journal")

    async def deaths(self) -> None:
        if self.kill is None:
            return
        while not self.kill.exists():
            await asyncio.sleep(0.1)
        k = int(self.kill.read_text().split()[0])
        self.dead.add(k)
        w = self.writers.pop(k, None)
        if w is not None:
            w.transport.abort()
        if not self.whole_node:  # srun goes on with the other tasks (--kill-on-bad-exit=0); the node stays up
            print(f"srun: error: {host(k)}: task {k}: Killed", file=sys.stderr, flush=True)
            self.note(kind="death", node=k, host=host(k), t=time.time(), task_only=True)
            return
        if self.down is not None:
            with open(self.down, "a") as f:
                f.write(host(k) + "\n")
        self.note(kind="death", node=k, host=host(k), t=time.time())
        # Slurm calls the node DOWN and kills the step on it, which is every agent's (srun ends)
        print(f"srun: error: Node failure on {host(k)}\nsrun: error: {host(k)}: task {k}: Killed\n"
              "srun: Job step aborted", file=sys.stderr, flush=True)
        self.status = 1
        self.ended.set()


def train(argv: list[str]) -> None:
    """Node 0's training: its shard, then ``.metadata`` last, every ``--every`` s."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--every", type=float, default=5.0)
    p.add_argument("--saves", type=int, default=8)
    p.add_argument("--size", type=int, default=64 << 10)
    p.add_argument("--idle", type=float, default=10.0)
    p.add_argument("--marks", type=Path)
    a = p.parse_args(argv)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    t0 = time.time()
    try:  # a restart goes on after the step it restored
        first = max((int(p.name[5:]) for p in a.out.iterdir() if p.name.startswith("step_")), default=0)
    except OSError:
        first = 0
    for i in range(1, a.saves + 1):
        while not stop and time.time() < t0 + i * a.every:
            time.sleep(0.05)
        if stop:
            return
        n = first + i
        step = a.out / f"step_{n:06d}"
        step.mkdir(parents=True, exist_ok=True)
        (step / "__0_0.distcp").write_bytes(bytes([n % 256]) * a.size)
        (step / ".metadata").write_text(f"{n}")
        if a.marks:
            with open(a.marks, "a") as f:
                f.write(json.dumps({"step": n, "marker_at": time.time()}) + "\n")
    end = time.time() + a.idle
    while not stop and time.time() < end:
        time.sleep(0.2)


def main() -> None:
    what, argv = sys.argv[1], sys.argv[2:]
    if what == "train":
        train(argv)
    elif what == "srun":
        sim = Sim(argv)
        asyncio.run(sim.main())
        sys.exit(sim.status)
    else:
        raise SystemExit(f"usage: {sys.argv[0]} srun SRUN-ARGS… | train OUT …")


if __name__ == "__main__":
    main()
