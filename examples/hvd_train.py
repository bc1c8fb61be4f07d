"""The seed job script's training, with Horovod (``horovod.torch``, CPU, Gloo or MPI), for `supervise`.

    horovodrun -np 2 -H localhost:2 --gloo python examples/hvd_train.py \\
        --read-checkpoints-from $PERSISTENT_DIR/checkpoints \\
        --write-checkpoints-to $LOCAL_DIR/checkpoints --tensorboard-logging-dir $LOCAL_DIR/tensorboard

It takes the seed script's arguments (``--data-dir``, ``--read-checkpoints-from``,
``--write-checkpoints-to``, ``--tensorboard-logging-dir``) and keeps its workflow: checkpoints
and logs are written to node-local disk, and `supervise` mirrors them to persistent storage
(complete checkpoints only). The model, the data, the checkpoint layout and the printed lines
are those of ``examples/ddp_train.py`` (imported from it), so everything said there holds here:

* **checkpoints** every ``--ckpt-every`` steps and whenever the supervisor asks; every rank
  agrees on the step through Horovod's own collective, one ``hvd.allreduce`` of the request
  and stop flags per step, so a request that reached one rank (a signal to one process, the
  request file seen half a second later elsewhere) is answered by all of them at once and no
  rank is left alone in a collective;
* **stops cleanly** on SIGTERM (horovodrun sends it to the ranks when it is itself stopped):
  one last checkpoint, exit 0;
* **resumes** from ``$SUPERVISE_RESTORED_FROM`` (what supervise copied back), else the newest
  complete checkpoint in ``--read-checkpoints-from`` (the seed read persistent storage), else in
  ``--write-checkpoints-to``; rank 0 reads it and broadcasts it;
* is **deterministic**: a stopped-and-resumed run ends with the weights of an uninterrupted one
  (the last line rank 0 prints is ``final weights sha256 <hex>``).

``--data-dir`` is accepted for the seed's command line; the data are synthetic (a pure
function of seed, step and rank), so nothing is read from it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*NumPy.*")

import torch  # noqa: E402
import horovod.torch as hvd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_train import (MARKER, POINTER, Model, ScalarLog, _write_atomic, batch, is_complete,  # noqa: E402
                       newest_local, training, weights_digest)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=None, help="accepted, not read: the data are synthetic")
    p.add_argument("--write-checkpoints-to", type=Path, default=Path("checkpoints"),
                   help="node-local checkpoint directory (default ./checkpoints)")
    p.add_argument("--read-checkpoints-from", type=Path, default=None,
                   help="where to look for a checkpoint to resume from (default: --write-checkpoints-to)")
    p.add_argument("--tensorboard-logging-dir", type=Path, default=Path("logs"),
                   help="where rank 0 appends scalars.csv (default ./logs)")
    p.add_argument("--steps", type=int, default=200, help="train until this step (default 200)")
    p.add_argument("--ckpt-every", type=int, default=50, help="checkpoint every N steps (0: only on request)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep after each step, to pace a demo (no effect on the result)")
    p.add_argument("--stop-at-step", type=int, default=0,
                   help="for tests: behave as if SIGTERM arrived right after this step")
    return p.parse_args(argv)


def save_checkpoint(ckpt_dir: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    seed: int) -> Path:
    """The ddp_train.py layout, written by rank 0 alone: every rank's RNG state (gathered),
    model and optimizer, the ``.metadata`` marker last, then ``latest``."""
    rngs = hvd.allgather_object(torch.get_rng_state(), name="rng")
    d = ckpt_dir / f"step_{step}"
    if hvd.rank() == 0:
        if d.exists():  # a leftover of an attempt that died mid-write
            shutil.rmtree(d)
        d.mkdir(parents=True)
        for r, rng in enumerate(rngs):
            torch.save({"rank": r, "step": step, "rng": rng}, d / f"__{r}_0.pt")
        torch.save({"step": step, "model": model.state_dict(), "optim": opt.state_dict()}, d / "model.pt")
        meta = {"step": step, "world_size": hvd.size(), "seed": seed, "time": time.time(),
                "files": ["model.pt"] + [f"__{r}_0.pt" for r in range(hvd.size())]}
        _write_atomic(d / MARKER, json.dumps(meta).encode())
        _write_atomic(ckpt_dir / POINTER, d.name.encode())
    hvd.barrier()
    return d


def find_resume(args: argparse.Namespace) -> tuple[Path | None, str]:
    restored = training.restored_from()
    if restored and is_complete(Path(restored)):
        return Path(restored), "restored by supervise"
    for where, why in ((args.read_checkpoints_from, "--read-checkpoints-from"),
                       (args.write_checkpoints_to, "--write-checkpoints-to")):
        found = newest_local(where) if where is not None else None
        if found is not None:
            return found, f"newest complete checkpoint in {why}"
    return None, ""


def resume(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, str | None]:
    """Rank 0 reads the checkpoint and broadcasts it; every rank restores its own RNG state."""
    found = None
    if hvd.rank() == 0:
        path, why = find_resume(args)
        if path is not None:
            state = torch.load(path / "model.pt", map_location="cpu", weights_only=False)
            rngs = [torch.load(s, weights_only=False)["rng"] if (s := path / f"__{r}_0.pt").is_file() else None
                    for r in range(hvd.size())]
            found = {"state": state, "rngs": rngs, "what": f"{path}, {why}"}
    found = hvd.broadcast_object(found, root_rank=0, name="resume")  # same name on every rank
    if found is None:
        return 0, None
    model.load_state_dict(found["state"]["model"])
    opt.load_state_dict(found["state"]["optim"])
    rng = found["rngs"][hvd.rank()]
    if rng is not None:
        torch.set_rng_state(rng)
    return int(found["state"]["step"]), found["what"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    training.install_stop_handler()          # TERM/INT become a flag: we save, then exit 0
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)

    torch.manual_seed(args.seed)             # the same initial weights on every rank
    model = Model()
    # Wrapped before the resume: DistributedOptimizer builds a new optimizer with empty state.
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=args.lr),
                                   named_parameters=model.named_parameters())
    torch.manual_seed(args.seed + 7919 * (rank + 1))   # then a per-rank stream (dropout)
    ckpt_dir = args.write_checkpoints_to
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    done, what = resume(args, model, opt)
    start = done + 1
    say(f"resumed from step {done} ({what})" if what is not None
        else f"starting from scratch (no complete checkpoint in {args.read_checkpoints_from or ckpt_dir})")
    say(f"training steps {start}..{args.steps} on {world} rank(s) (horovod), checkpoint every {args.ckpt_every}")

    log = ScalarLog(args.tensorboard_logging_dir) if rank == 0 else None
    last_saved = done if what is not None else None
    status, step = "finished", start - 1
    for step in range(start, args.steps + 1):
        x, y = batch(args.seed, step, rank, args.batch)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()                      # (Horovod's takes no set_to_none)
        loss.backward()
        opt.step()                           # allreduces the gradients (average)
        if log is not None:
            log.add(step, loss.item())

        # One tiny collective per step: any rank asked → every rank agrees (docs/training.md).
        stop = training.stop_requested() or step == args.stop_at_step
        flags = torch.tensor([float(training.checkpoint_requested()), float(stop)])
        flags = hvd.allreduce(flags, op=hvd.Max, name="supervise.flags")
        want_ckpt, want_stop = flags[0].item() > 0, flags[1].item() > 0
        periodic = args.ckpt_every > 0 and step % args.ckpt_every == 0
        if (periodic or want_ckpt or want_stop or step == args.steps) and last_saved != step:
            d = save_checkpoint(ckpt_dir, step, model, opt, args.seed)
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
    say(f"{status} at step {step}; final weights sha256 {weights_digest(model)}")
    hvd.barrier()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
