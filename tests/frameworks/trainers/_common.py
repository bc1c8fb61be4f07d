"""What every framework trainer here shares: its arguments and the progress lines the tests read.

Each trainer is a real training loop of one library with a tiny model built from a config (no
download), checkpointing and resuming that library's own way. It appends JSON lines to
``--progress``: ``start`` (the step it resumed at, 0 for a fresh start), ``saved`` (each step
whose checkpoint the library finished writing) and ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse(extra: dict[str, object] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="the local checkpoint directory (the pair's LOCAL)")
    p.add_argument("--progress", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds each training step takes on top")
    p.add_argument("--save-pause", type=float, default=0.0,
                   help="a pause inside each save, between the state files and the completion signal")
    for name, default in (extra or {}).items():
        p.add_argument(f"--{name}", default=default, type=type(default))
    return p.parse_args()


def progress(path: str, ev: str, **fields: object) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"ev": ev, "t": time.time(), "pid": os.getpid(), **fields}) + "\n")
