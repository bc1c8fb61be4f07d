"""A small, real, deterministic PyTorch DDP training (CPU, gloo) that `supervise` can look after.

Runs under any launcher that sets the usual variables:

    torchrun --nproc-per-node 2 examples/ddp_train.py --steps 200 --ckpt-dir /tmp/ckpt
    mpiexec -n 2 python examples/ddp_train.py --steps 200 --ckpt-dir /tmp/ckpt
    srun -n 2 python examples/ddp_train.py …             (SLURM_PROCID / SLURM_NTASKS)
    python examples/ddp_train.py …                         (one process, world size 1)

What it shows (docs/examples.md):

* **checkpoints** every ``--ckpt-every`` steps, and whenever the supervisor asks
  (``supervisor.training.checkpoint_requested()``); all ranks agree on the step with one
  ``all_reduce(MAX)`` of the request and stop flags, so no rank is left in a collective alone;
* each checkpoint is a torch.distributed.checkpoint-style directory ``step_<N>/``: one shard
  per rank (``__<rank>_0.pt``: that rank's RNG state), the model and optimizer (``model.pt``),
  and **last** the ``.metadata`` marker, then the top-level ``latest`` pointer. Rank 0 writes
  it all (the RNG states are gathered) and reads it back on resume (and broadcasts it), so a
  node-local ``--ckpt-dir`` works on any number of nodes: supervise runs on the first node. supervise
  publishes a directory on persistent storage only once ``.metadata`` is there
  (a built-in marker, docs/sync.md), so a half-written checkpoint is never mirrored;
* **stops cleanly** on SIGTERM (``install_stop_handler()``): every rank agrees, one last
  checkpoint is saved, and the process exits 0;
* **resumes** from ``$SUPERVISE_RESTORED_FROM`` (the checkpoint supervise copied back from
  persistent storage), else from the newest complete local checkpoint;
* is **bit-for-bit deterministic**: the batch of step N on rank R is drawn from a generator
  seeded with (seed, N, R), ``torch.use_deterministic_algorithms(True)``, one intra-op
  thread, and a resume restores model, optimizer and every rank's RNG state. An interrupted
  and resumed run ends with exactly the weights of an uninterrupted one
  (tests/examples/test_ddp_determinism.py);
* logs scalars as it goes: ``<log-dir>/scalars.csv`` (rank 0, append-only, flushed every
  step; supervise's ``--logs`` mirror grows it in place). TensorBoard itself is not needed.

The last line rank 0 prints is ``final weights sha256 <hex>`` over every tensor of the
model's state_dict, in order: two runs are bit-identical when these match.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*NumPy.*")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

try:
    from supervisor import training
except ImportError:  # not installed where the training runs: TERM still stops it cleanly
    class _Fallback:
        _stop = False

        def install_stop_handler(self) -> bool:
            def on_term(signum, frame):  # noqa: ANN001
                _Fallback._stop = True
            signal.signal(signal.SIGTERM, on_term)
            signal.signal(signal.SIGINT, on_term)
            return True

        def stop_requested(self) -> bool:
            return _Fallback._stop

        def checkpoint_requested(self) -> bool:
            return False

        def acknowledge(self) -> None:
            pass

        def restored_from(self) -> str | None:
            return os.environ.get("SUPERVISE_RESTORED_FROM") or None

    training = _Fallback()  # type: ignore[assignment]

MARKER = ".metadata"      # written last inside step_<N>/: the directory is complete
POINTER = "latest"        # top-level file naming the newest complete step_<N>
STEP_DIR = re.compile(r"^step_(\d+)$")
IN_DIM = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="train until this step (default 200)")
    p.add_argument("--ckpt-dir", type=Path, default=Path(os.environ.get("CKPT_DIR", "checkpoints")),
                   help="node-local checkpoint directory (default $CKPT_DIR or ./checkpoints)")
    p.add_argument("--log-dir", type=Path, default=Path(os.environ.get("LOG_DIR", "logs")),
                   help="where rank 0 appends scalars.csv (default $LOG_DIR or ./logs)")
    p.add_argument("--ckpt-every", type=int, default=50, help="checkpoint every N steps (0: only on request)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep after each step, to pace a demo (no effect on the result)")
    p.add_argument("--stop-at-step", type=int, default=0,
                   help="for tests: behave as if SIGTERM arrived right after this step")
    p.add_argument("--ignore-requests", action="store_true",
                   help="behave like a script that knows nothing of supervise (pytorch/examples): save only "
                        "every --ckpt-every steps, and die on SIGTERM without saving")
    return p.parse_args(argv)


def setup_distributed() -> tuple[int, int, int]:
    """Rank, world size, local rank from torchrun, OpenMPI, Slurm or PMI; then init gloo."""
    env = os.environ
    sources = (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
               ("PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK"),
               ("PALS_RANKID", "PALS_SIZE", "PALS_LOCAL_RANKID"),
               ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"))
    rank, world, local = 0, 1, 0
    for r, w, lr in sources:
        if r in env and w in env:
            rank, world, local = int(env[r]), int(env[w]), int(env.get(lr, env[r]))
            break
    # mpiexec and srun do not set the rendezvous address: rank 0's host, a fixed port.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return rank, world, local


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(IN_DIM, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1),  # dropout: RNG matters
            torch.nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of (step, rank): a pure function of its seed, so the position is just the step."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(size, IN_DIM, generator=g)
    w = torch.linspace(-1.0, 1.0, IN_DIM).unsqueeze(1)
    y = torch.sin(x @ w) + 0.05 * torch.randn(size, 1, generator=g)
    return x, y


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(ckpt_dir: Path, step: int, model: DDP, opt: torch.optim.Optimizer,
                    rank: int, world: int, seed: int) -> Path:
    """Rank 0 writes the whole checkpoint: one shard per rank (its RNG state, gathered), the
    model and optimizer, then the marker, then `latest`. Only rank 0's disk is written, so a
    node-local checkpoint directory works on any number of nodes: supervise runs on the first
    node, where rank 0 is, and mirrors it."""
    rngs: list = [None] * world
    dist.all_gather_object(rngs, torch.get_rng_state())
    d = ckpt_dir / f"step_{step}"
    if rank == 0:
        if d.exists():  # a leftover of an attempt that died mid-write: start it over
            shutil.rmtree(d)
        d.mkdir(parents=True)
        for r, rng in enumerate(rngs):
            torch.save({"rank": r, "step": step, "rng": rng}, d / f"__{r}_0.pt")
        torch.save({"step": step, "model": model.module.state_dict(), "optim": opt.state_dict()}, d / "model.pt")
        meta = {"step": step, "world_size": world, "seed": seed, "time": time.time(),
                "files": ["model.pt"] + [f"__{r}_0.pt" for r in range(world)]}
        _write_atomic(d / MARKER, json.dumps(meta).encode())   # last inside the directory
        _write_atomic(ckpt_dir / POINTER, d.name.encode())     # then the pointer
    dist.barrier()
    return d


def is_complete(d: Path) -> bool:
    return (d / MARKER).is_file() and (d / "model.pt").is_file()


def newest_local(ckpt_dir: Path) -> Path | None:
    best: tuple[int, Path] | None = None
    if ckpt_dir.is_dir():
        for e in ckpt_dir.iterdir():
            m = STEP_DIR.match(e.name)
            if m and is_complete(e) and (best is None or int(m.group(1)) > best[0]):
                best = (int(m.group(1)), e)
    return best[1] if best else None


def find_resume(ckpt_dir: Path) -> tuple[Path | None, str]:
    restored = training.restored_from()
    if restored and is_complete(Path(restored)):
        return Path(restored), "restored by supervise"
    local = newest_local(ckpt_dir)
    return local, "newest complete local checkpoint"


def resume(ckpt_dir: Path, model: DDP, opt: torch.optim.Optimizer, rank: int, world: int) -> tuple[int, str | None]:
    """Rank 0 finds and reads the checkpoint and broadcasts it (the other ranks may be on nodes
    whose local disk has none); every rank restores model, optimizer and its own RNG state.
    Returns (last step done, a description) or (0, None)."""
    found: list = [None]
    if rank == 0:
        path, why = find_resume(ckpt_dir)
        if path is not None:
            state = torch.load(path / "model.pt", map_location="cpu", weights_only=False)
            rngs = []
            for r in range(world):
                shard = path / f"__{r}_0.pt"
                rngs.append(torch.load(shard, weights_only=False)["rng"] if shard.is_file() else None)
            found[0] = {"state": state, "rngs": rngs, "what": f"{path}, {why}"}
    dist.broadcast_object_list(found, src=0)
    if found[0] is None:
        return 0, None
    state, rng = found[0]["state"], found[0]["rngs"][rank]
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    if rng is not None:
        torch.set_rng_state(rng)
    elif rank == 0:
        print("warning: no RNG shard for this rank (another world size?); RNG state not restored", flush=True)
    return int(state["step"]), found[0]["what"]


class ScalarLog:
    """Append-only ``scalars.csv`` (step,loss,wall_time), flushed every row; rank 0 only."""

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / "scalars.csv"
        new = not path.exists() or path.stat().st_size == 0
        self.f = open(path, "a", buffering=1)
        if new:
            self.f.write("step,loss,wall_time\n")

    def add(self, step: int, loss: float) -> None:
        self.f.write(f"{step},{loss:.6g},{time.time():.3f}\n")

    def close(self) -> None:
        self.f.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.ignore_requests:
        training.install_stop_handler()      # TERM/INT become a flag: we save, then exit 0
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)                 # reductions in one fixed order
    rank, world, _ = setup_distributed()
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)

    torch.manual_seed(args.seed)             # the same initial weights on every rank
    model = DDP(Model())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    torch.manual_seed(args.seed + 7919 * (rank + 1))   # then a per-rank stream (dropout)

    ckpt_dir = args.ckpt_dir
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    done, what = resume(ckpt_dir, model, opt, rank, world)
    start = done + 1
    if what is not None:
        say(f"resumed from step {done} ({what})")
    else:
        say(f"starting from scratch (no complete checkpoint in {ckpt_dir})")
    say(f"training steps {start}..{args.steps} on {world} rank(s), checkpoint every {args.ckpt_every}")

    log = ScalarLog(args.log_dir) if rank == 0 else None
    last_saved = done if what is not None else None
    status = "finished"
    step = start - 1
    for step in range(start, args.steps + 1):
        x, y = batch(args.seed, step, rank, args.batch)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if log is not None:
            log.add(step, loss.item())

        # One tiny collective per step: any rank asked → every rank agrees (docs/training.md).
        stop = training.stop_requested() or step == args.stop_at_step
        asked = training.checkpoint_requested() and not args.ignore_requests
        flags = torch.tensor([float(asked), float(stop)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        want_ckpt, want_stop = flags[0].item() > 0, flags[1].item() > 0
        periodic = args.ckpt_every > 0 and step % args.ckpt_every == 0
        if (periodic or want_ckpt or want_stop or step == args.steps) and last_saved != step:
            d = save_checkpoint(ckpt_dir, step, model, opt, rank, world, args.seed)
            last_saved = step
            reason = "requested" if want_ckpt else "stop" if want_stop else "final" if step == args.steps else "periodic"
            say(f"step {step}: loss {loss.item():.4f}; checkpoint {d.name} ({reason})")
        if want_ckpt:
            training.acknowledge()
        if want_stop:
            status = "stopped"
            say(f"stop requested: saved step {step}, exiting 0")
            break
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)

    if log is not None:
        log.close()
    say(f"{status} at step {step}; final weights sha256 {weights_digest(model.module)}")
    dist.barrier()
    # Every rank has saved and passed the barrier: leave without tearing gloo down. Freeing the
    # DDP reducer can deadlock (~ProcessGroupGloo joins a worker thread that waits for the GIL
    # the joiner holds; seen here in 1 run of 6, a rank hung at exit; pytorch#75097).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
