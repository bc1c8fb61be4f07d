"""Real checkpoint files, as several producers write them, and a checker that says what is
wrong with a destination (the sync tests, the chaos trials and their trainer)."""

from __future__ import annotations

import os
import time
from pathlib import Path

SHARD = "shard_{}.bin"


def pattern(name: str, shard: int, size: int) -> bytes:
    b = f"{name}/{shard};".encode()
    return (b * (size // len(b) + 1))[:size]


def write_shard(path: Path, data: bytes, *, chunk: int = 1 << 16, delay: float = 0.0) -> None:
    with open(path, "wb") as f:
        for i in range(0, len(data), chunk):
            f.write(data[i:i + chunk])
            f.flush()
            if delay:
                time.sleep(delay)


def write_checkpoint(root: Path, name: str, *, style: str, shards: int = 3, size: int = 256 << 10,
                     delay: float = 0.0, pause: float = 0.0) -> None:
    """Write one checkpoint the way ``style``'s producer does; the completion signal last.

    dcp: ``.metadata.tmp`` renamed to ``.metadata`` · user: ``.complete`` · deepspeed: ``latest``
    rewritten in place · megatron: ``latest_checkpointed_iteration.txt`` · quiet: nothing.
    """
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        write_shard(d / SHARD.format(i), pattern(name, i, size), delay=delay)
        if pause:
            time.sleep(pause)
    if style == "dcp":
        (d / ".metadata.tmp").write_bytes(b"meta:" + name.encode())
        os.replace(d / ".metadata.tmp", d / ".metadata")
    elif style == "user":
        (d / ".complete").write_bytes(b"ok")
    elif style == "deepspeed":
        (root / "latest").write_text(name)
    elif style == "megatron":
        (root / "latest_checkpointed_iteration.txt").write_text(str(int(name.split("_")[1])))


def ckpt_name(style: str, k: int) -> str:
    return f"iter_{k:07d}" if style == "megatron" else f"global_step{k}" if style == "deepspeed" else f"step_{k:03d}"


def problems(dst: Path, *, style: str, shards: int = 3, size: int = 256 << 10) -> list[str]:
    """Everything visible on ``dst`` that is not a complete checkpoint (hidden names are staging)."""
    out: list[str] = []
    try:
        names = os.listdir(dst)
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith("."):
            continue
        p = dst / name
        if name in ("latest", "latest_checkpointed_iteration.txt"):
            try:
                text = p.read_text().strip()
            except FileNotFoundError:
                continue
            target = f"iter_{int(text):07d}" if name != "latest" and text.isdigit() else text
            out += [f"pointer {name} -> {target}: {x}" for x in _incomplete(dst / target, style, shards, size)]
            continue
        out += [f"{name}: {x}" for x in _incomplete(p, style, shards, size)]
    return out


def _incomplete(d: Path, style: str, shards: int, size: int) -> list[str]:
    bad = []
    try:
        inside = set(os.listdir(d))
    except FileNotFoundError:
        return ["missing"]
    for i in range(shards):
        f = d / SHARD.format(i)
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            bad.append(f"{f.name} missing")
            continue
        if data != pattern(d.name, i, size):
            bad.append(f"{f.name} torn ({len(data)} of {size} bytes)")
    if style == "dcp" and ".metadata" not in inside:
        bad.append("no .metadata")
    if style == "user" and ".complete" not in inside:
        bad.append("no .complete")
    if ".supervise-partial" in inside or any(n.endswith(".supervise-tmp") for n in inside):
        bad.append("staging debris inside")
    return bad


def hung_checkpoint(local: Path) -> None:
    """``local/step_000001``, complete by its marker, one of whose shards is a FIFO: a copier that
    opens it blocks for good (the hung-copier cases)."""
    d = local / "step_000001"
    d.mkdir(parents=True)
    (d / "shard_0.bin").write_bytes(b"x" * 100)
    os.mkfifo(d / "shard_1.bin")
    (d / ".metadata").write_text("1")
