"""``bench/s3.py --shapes frozen``: bytes moved against bytes changed (issue 45).

An HF ``Trainer`` fine-tunes a GPT-2-shaped model (built from its config: nothing is
downloaded) with the embeddings and every block but the last frozen (``requires_grad=False``),
saving 8 checkpoints (``save_steps``). HF saves the whole state dict every time, so the layout
decides what stays unchanged. Two layouts, one training each:

* ``sharded``: ``save_pretrained`` with ``max_shard_size`` (a large model's default layout,
  5 GB shards, scaled down to 16 MB): shards holding only frozen tensors are byte-identical
  from one checkpoint to the next, as are ``training_args.bin`` and the config;
* ``one-file``: one ``model.safetensors`` holding every tensor.

Each checkpoint, in order, goes up three times in this process against the same server: by
content (``_storepub.upload``, what supervise does now: a file under 8 MiB as one object, a
larger one as parts cut at its tensors (a safetensors file) or at fixed 8 MiB offsets
(``_cuts``), each addressed by its hash), by content with the cuts before (fixed 8 MiB offsets
for every file, under a space of its own), and whole under its own keys (``Store.put_file``
per file: the layout before issue 45). Printed per checkpoint: bytes changed (the file's 4 KiB
blocks that differ from the previous checkpoint's same path; all of the first), bytes sent by
content and their ratio to changed (goal <= 1.05), the objects its manifest names, the same for
fixed parts, the whole upload's bytes, the three times, and what one object per whole file
would send (the files whose sha256 changed). Then the last checkpoint is downloaded as a
restore does (8 files at once, each verified), from both layouts by content, twice in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from pathlib import Path
from typing import Any



def train(out: Path, layout: str, *, layers: int, width: int, vocab: int) -> list[Path]:
    """8 checkpoints of a frozen-base fine-tuning under ``out``; their directories in order."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=width, n_head=8, vocab_size=vocab, n_positions=64,
                                       bos_token_id=0, eos_token_id=0))
    for name, p in model.named_parameters():  # train only the last block and the final norm (the head is tied)
        p.requires_grad = name.startswith((f"transformer.h.{layers - 1}.", "transformer.ln_f"))
    if layout == "sharded":
        save = model.save_pretrained
        model.save_pretrained = lambda *a, **kw: save(*a, **{**kw, "max_shard_size": "16MB"})  # type: ignore[method-assign]
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, vocab, (64, 32))]
    args = TrainingArguments(output_dir=str(out), max_steps=8, save_steps=1, per_device_train_batch_size=4,
                             logging_steps=100, report_to=[], use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=data).train()
    return sorted(out.glob("checkpoint-*"), key=lambda d: int(d.name.split("-")[1]))


def _hashes(d: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(d))] = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def diff(before: Path | None, now: Path, block: int) -> int:
    """Bytes of ``now`` in blocks of ``block`` bytes that differ from the same path's in
    ``before`` (a file new or of another size: all of it). 4 KiB: the bytes that changed;
    a block larger than any file: what one object per whole file would send."""
    import numpy as np

    out = 0
    for p in sorted(now.rglob("*")):
        if not p.is_file():
            continue
        q = before / p.relative_to(now) if before is not None else None
        size = p.stat().st_size
        if q is None or not q.is_file() or q.stat().st_size != size:
            out += size
            continue
        a, b = np.fromfile(p, dtype=np.uint8), np.fromfile(q, dtype=np.uint8)
        for i in range(0, size, block):
            if not np.array_equal(a[i:i + block], b[i:i + block]):
                out += min(block, size - i)
    return out


async def _by_content(store: Any, d: Path, owner: str, *, fixed: bool = False) -> tuple[int, dict[str, Any], float]:
    """``d`` uploaded as supervise does (``fixed``: with the cuts before, at fixed 8 MiB
    offsets for every file): bytes sent, the manifest's files, seconds."""
    from unittest import mock

    from supervisor.sync import _cuts
    from supervisor.sync._complete import Entry, Snap
    from supervisor.sync._storepub import upload

    files = {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*") if p.is_file()}
    e = Entry(name=d.name, is_dir=True, snap=Snap(files, max(m for _s, m in files.values()), sum(s for s, _m in files.values())),
              complete=True, why="bench")
    pins: list[str] = []
    with mock.patch.object(_cuts, "_safetensors", lambda f, size: None) if fixed else contextlib.nullcontext():
        t0 = time.perf_counter()
        got, sent, _objects = await upload(store, d, e, owner, pins)
        seconds = time.perf_counter() - t0
    store.unpin(pins)
    return sent, got, seconds


def _objects(files: dict[str, Any]) -> int:
    """The objects a manifest's files name (shared ones once)."""
    from supervisor.sync._manifest import keys_of

    return len({k for f in files.values() for k in keys_of(f)})


async def _restore(store: Any, files: dict[str, Any], dest: Path) -> float:
    """A restore's downloads of ``files`` into ``dest`` (``FETCHES`` files at once, as
    ``_fill``; each verified against its size and sha256): seconds."""
    from supervisor.sync._fill import FETCHES
    from supervisor.sync._store import download_parts

    dest.mkdir(parents=True)
    limit = asyncio.Semaphore(FETCHES)

    async def one(rel: str, f: dict[str, Any]) -> None:
        target = dest / rel.replace("/", "_")
        async with limit:
            if "parts" in f:
                await download_parts(store, f["parts"], target, f["sha256"], int(f["size"]))
            else:
                await store.download(f["key"], target, f["sha256"], int(f["size"]))

    t0 = time.perf_counter()
    await asyncio.gather(*(one(rel, f) for rel, f in files.items()))
    return time.perf_counter() - t0


async def _whole(store: Any, d: Path, prefix: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    got = await asyncio.gather(*(store.put_file(p, store.key(f"{prefix}/{d.name}/{p.relative_to(d)}"))
                                 for p in sorted(d.rglob("*")) if p.is_file()))
    return sum(n for n, _h in got), time.perf_counter() - t0


def run(where: Path, env: dict[str, str], *, quick: bool) -> None:
    layers, width, vocab = (6, 256, 8000) if quick else (12, 512, 16000)
    for layout in ("sharded", "one-file"):
        ckpts = train(where / f"frozen-{layout}", layout, layers=layers, width=width, vocab=vocab)
        asyncio.run(_publish(ckpts, layout, env))


async def _publish(ckpts: list[Path], layout: str, env: dict[str, str]) -> None:
    from supervisor.config import StoreSpec
    from supervisor.sync._store import Store

    store = Store(StoreSpec(url=f"s3://bench/frozen-{layout}", bucket="bench", prefix=f"frozen-{layout}"), env)
    last = _hashes(ckpts[-1])
    print(f"frozen, {layout}: {len(ckpts)} checkpoints of {sum(s for s, _h in last.values()) / 2**20:.1f} MiB, "
          f"files {sorted(last)}", flush=True)
    before: Path | None = None
    tot = [0, 0, 0, 0, 0]
    times: list[tuple[float, float, float]] = []
    for d in ckpts:
        ch, files = diff(before, d, 4096), diff(before, d, 1 << 40)
        sent, got, t_new = await _by_content(store, d, f"bench-{layout}")
        fixed, got_fixed, t_fixed = await _by_content(store, d, f"bench-{layout}-fixed", fixed=True)
        whole, t_old = await _whole(store, d, "whole")
        times.append((t_new, t_fixed, t_old))
        print(f"  {d.name}: changed {ch / 2**20:6.2f} MiB | by content {sent / 2**20:6.2f} MiB ({sent / ch:.3f}x changed), "
              f"{_objects(got)} objects, {t_new:.2f} s | fixed 8 MiB parts (before) {fixed / 2**20:6.2f} MiB "
              f"({fixed / ch:.3f}x), {_objects(got_fixed)} objects, {t_fixed:.2f} s | whole {whole / 2**20:6.2f} MiB "
              f"({whole / ch:.2f}x) {t_old:.2f} s | per whole file would send {files / 2**20:6.2f} MiB ({files / ch:.3f}x)",
              flush=True)
        tot = [tot[0] + ch, tot[1] + sent, tot[2] + whole, tot[3] + files, tot[4] + fixed]
        before = d
    later = times[1:]
    print(f"  {layout} total: changed {tot[0] / 2**20:.1f} MiB, by content {tot[1] / 2**20:.1f} MiB ({tot[1] / tot[0]:.3f}x), "
          f"fixed 8 MiB parts {tot[4] / 2**20:.1f} MiB ({tot[4] / tot[0]:.3f}x), whole {tot[2] / 2**20:.1f} MiB "
          f"({tot[2] / tot[0]:.2f}x), per whole file {tot[3] / 2**20:.1f} MiB ({tot[3] / tot[0]:.3f}x); "
          f"checkpoints 2-{len(times)}: by content {sum(t[0] for t in later) / len(later):.2f} s, fixed parts "
          f"{sum(t[1] for t in later) / len(later):.2f} s, whole {sum(t[2] for t in later) / len(later):.2f} s each",
          flush=True)
    # the last checkpoint restored from the bucket, each way, twice in turn (the first pair warms the server)
    spent: dict[str, list[float]] = {"by content": [], "fixed parts": []}
    for i in range(2):
        for way, files_of in (("by content", got), ("fixed parts", got_fixed)):
            spent[way].append(await _restore(store, files_of, ckpts[-1].parent / f"restore-{way.replace(' ', '-')}-{i}"))
    print(f"  {layout} restore of {ckpts[-1].name}: by content {_objects(got)} objects "
          f"{' / '.join(f'{t:.2f}' for t in spent['by content'])} s; fixed 8 MiB parts {_objects(got_fixed)} objects "
          f"{' / '.join(f'{t:.2f}' for t in spent['fixed parts'])} s", flush=True)
