"""Small read-only helpers for the demo and the tests (standard library + torch only).

    python examples/inspect_run.py digest CKPT_DIR/step_N [...]   sha256 of the model weights
    python examples/inspect_run.py attempts RUN_DIR                 one line per attempt, from events.jsonl

``digest`` hashes every tensor of the checkpoint's model state_dict in order, exactly like
the ``final weights sha256`` line of examples/ddp_train.py, so a checkpoint and a live run can
be compared. ``attempts`` is a plain-words view of the journal (docs/journal.md) that needs
nothing but the run directory; ``supervise report RUN_DIR`` is the full review.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def digest(step_dir: Path) -> str:
    import warnings
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch

    state = torch.load(step_dir / "model.pt", map_location="cpu", weights_only=False)["model"]
    h = hashlib.sha256()
    for name, t in state.items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def attempts(run_dir: Path) -> list[dict]:
    """Per attempt: restored checkpoint, checkpoints published, stop reason, exit status."""
    out: dict[int, dict] = {}
    with open(run_dir / "events.jsonl", "rb") as f:
        for raw in f:
            try:
                e = json.loads(raw)
            except ValueError:
                continue  # a torn last line
            a = out.setdefault(e.get("attempt", 0), {"attempt": e.get("attempt", 0), "restored": None,
                                                     "published": [], "reason": None, "exit_status": None,
                                                     "seconds": None, "stop_steps": []})
            kind = e.get("kind")
            if kind == "restore" and e.get("checkpoint"):
                a["restored"] = e["checkpoint"]
            elif kind == "publish" and e.get("checkpoint") not in (None, "latest"):
                a["published"].append(e["checkpoint"])
            elif kind == "stop-step":
                a["stop_steps"].append(e.get("step"))
            elif kind == "end":
                a["reason"], a["exit_status"], a["seconds"] = e.get("reason"), e.get("exit_status"), e.get("seconds")
    return [out[k] for k in sorted(out)]


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "digest":
        for p in argv[1:]:
            print(f"{digest(Path(p))}  {p}")
        return 0
    if len(argv) == 2 and argv[0] == "attempts":
        for a in attempts(Path(argv[1])):
            restored = f"resumed from {a['restored']}" if a["restored"] else "started from scratch"
            pub = ", ".join(a["published"]) or "none"
            secs = f" after {a['seconds']:.0f} s" if isinstance(a["seconds"], (int, float)) else ""
            print(f"attempt {a['attempt']}: {restored}; published {pub}; "
                  f"ended: {a['reason']} (exit status {a['exit_status']}){secs}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
