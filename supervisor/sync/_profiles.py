"""Framework profiles: what a checkpoint is, when it is complete, how versions are ordered.

Each profile is a small declarative description of one library's on-disk layout, detected
from what appears in a checkpoint pair's local directory (or set with ``profile = NAME``).
The completeness engine (``_complete.py``) reads it; nothing here does I/O except
``torn_file``, which reads a file's last bytes to ask the format whether it is whole.
The table in docs/sync.md is the user-facing copy of this module.
"""

from __future__ import annotations

import fnmatch
import os
import re
import struct
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Profile:
    name: str
    checkpoints: tuple[str, ...]   # globs for the top-level names that are checkpoints (restorable)
    is_dir: bool | None            # checkpoints are directories (True), files (False), or either
    markers: tuple[str, ...] = ()  # files inside a checkpoint directory that its writer writes last
    needs_marker: bool = False     # a directory without a marker is never complete (torn once the training is gone)
    step: str = r"(\d+)"           # the step in a checkpoint's name (the last match counts)
    links: tuple[str, ...] = ()    # top-level names that may be symlinks to a checkpoint (Lightning last.ckpt)
    after_marker: float = 0.0      # quiet seconds after the marker (files may follow it in the same save)
    pointer: str = ""              # the top-level file that names the newest complete one (written after it)
    resume: str = ""               # how the training resumes (docs, `supervise check`)
    shards: str = ""               # a file each data-parallel rank writes (group "rank"): all must be there
    world: tuple[str, str] = ("", "")  # (glob of a file inside, the key in its pickle) that holds the rank count
    save_calls: tuple[str, ...] = ()   # "file.py:function": a rank inside one is still saving (its stack)

    def is_checkpoint(self, name: str, is_dir: bool) -> bool:
        if self.is_dir is not None and self.is_dir != is_dir:
            return False
        return any(fnmatch.fnmatchcase(name, g) for g in self.checkpoints)

    def step_of(self, name: str) -> int | None:
        found = re.findall(self.step, name)
        return int(found[-1]) if found else None

    def pointer_text(self, name: str) -> bytes:
        """What the profile's pointer file holds when it names ``name`` (a restore that falls
        back to an older checkpoint rewrites it): DeepSpeed the tag, Megatron the number."""
        if self.name == "megatron":
            return str(self.step_of(name) or 0).encode()
        return name.encode()


GENERIC = Profile("generic", ("*",), None, resume="read SUPERVISE_RESTORED_FROM")
PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("dcp", ("*",), True, markers=(".metadata",), needs_marker=True,
            resume="dcp.load(state, checkpoint_id=os.environ['SUPERVISE_RESTORED_FROM'])"),
    Profile("hf-trainer", ("checkpoint-*",), True, markers=("trainer_state.json",), needs_marker=True,
            step=r"checkpoint-(\d+)$", resume="trainer.train(resume_from_checkpoint=True)"),
    # save_state writes random_states_<rank>.pkl, then one custom_checkpoint_<i>.pkl per registered object
    # ... and its first save has no earlier one to compare with: complete once no rank is inside save_state
    Profile("accelerate", ("checkpoint_*",), True, markers=("random_states_*.pkl",), needs_marker=True,
            after_marker=0.5, step=r"checkpoint_(\d+)$", save_calls=("accelerator.py:save_state",),
            resume="accelerator.load_state(os.environ['SUPERVISE_RESTORED_FROM'])"),
    Profile("lightning", ("*.ckpt",), False, step=r"step=(\d+)", links=("last*.ckpt",),
            resume='trainer.fit(model, ckpt_path="last")'),
    Profile("torch-save", ("*.pt", "*.pth", "*.bin", "*.tar", "*.safetensors", "*.pkl"), False,
            resume="torch.load(os.environ['SUPERVISE_RESTORED_FROM'])"),
    # Every rank writes its ZeRO shard in place, and rank 0 writes `latest` without waiting for
    # the others: complete once `latest` names it AND every rank's shard is there.
    Profile("deepspeed", ("global_step*",), True, step=r"global_step(\d+)$", needs_marker=True, pointer="latest",
            shards=r"^(?:bf16_)?zero_pp_rank_(?P<rank>\d+)_mp_rank_\d+_(?:optim|model)_states\.pt$",
            world=("*model_states.pt", "dp_world_size"),
            resume="engine.load_checkpoint(ckpt_dir)  # reads 'latest'"),
    Profile("megatron", ("iter_*",), True, step=r"iter_(\d+)$", needs_marker=True,
            pointer="latest_checkpointed_iteration.txt", resume="--load CKPT_DIR  # reads the tracker file"),
    Profile("orbax", ("[0-9]*",), True, markers=("commit_success.txt",),
            step=r"^(\d+)", resume="CheckpointManager(dir).latest_step()"),
    GENERIC,
)}
NAMES = tuple(PROFILES)


def detect(entries: Iterable[tuple[str, bool]], pointers: Iterable[str], inside: dict[str, list[str]]) -> tuple[Profile, str] | None:
    """The profile a listing shows, with the evidence; None while nothing tells.

    ``entries`` are top-level (name, is_dir); ``inside`` maps a directory to some of the
    names in it (its top level). Pointer files decide first: they are the framework's own.
    """
    entries = list(entries)
    pointers = set(pointers)
    if "latest_checkpointed_iteration.txt" in pointers:
        return PROFILES["megatron"], "latest_checkpointed_iteration.txt"
    if "latest" in pointers and any(d and n.startswith("global_step") for n, d in entries):
        return PROFILES["deepspeed"], "latest + global_step*"
    for name, is_dir in entries:
        names = set(inside.get(name, ()))
        if is_dir and re.fullmatch(r"checkpoint-\d+", name):
            return PROFILES["hf-trainer"], f"{name}/"
        if is_dir and re.fullmatch(r"checkpoint_\d+", name):
            return PROFILES["accelerate"], f"{name}/"
        if is_dir and re.fullmatch(r"global_step\d+", name):  # before its first `latest`
            return PROFILES["deepspeed"], f"{name}/"
        if is_dir and re.fullmatch(r"iter_\d{7}", name):  # before its first tracker file
            return PROFILES["megatron"], f"{name}/"
        if is_dir and (".metadata" in names or any(n.endswith(".distcp") for n in names)):
            return PROFILES["dcp"], f"{name}/.metadata" if ".metadata" in names else f"{name}/*.distcp"
        if is_dir and names & {"commit_success.txt", "_CHECKPOINT_METADATA"}:
            return PROFILES["orbax"], f"{name}/{sorted(names & {'commit_success.txt', '_CHECKPOINT_METADATA'})[0]}"
        if not is_dir and name.endswith(".ckpt"):
            return PROFILES["lightning"], name
    if any(d for _, d in entries):
        return None  # files beside directories (HF's training_args.bin): wait for the directories to tell
    for name, _is_dir in entries:
        if PROFILES["torch-save"].is_checkpoint(name, False):
            return PROFILES["torch-save"], name
    return None


def marker_examples(profile: str, user: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(profile, a path from the pair's root) for each file that says "complete": what an
    ``exclude`` must never hide. ``auto``: every profile's."""
    chosen = [PROFILES[profile]] if profile != "auto" else list(PROFILES.values())
    out: list[tuple[str, str]] = []
    for prof in chosen:
        name = {"hf-trainer": "checkpoint-1", "accelerate": "checkpoint_1", "orbax": "1"}.get(prof.name, "step_1")
        out += [(prof.name, f"{name}/{m.replace('*', '0')}") for m in prof.markers]
    if profile in ("auto", "deepspeed"):
        out.append(("deepspeed", "latest"))
    if profile in ("auto", "megatron"):
        out.append(("megatron", "latest_checkpointed_iteration.txt"))
    out += [("your markers", f"step_1/{m}") for m in user if not any(c in m for c in "*?[")]
    return out


_EOCD = b"PK\x05\x06"


def torn_file(path: str) -> str | None:
    """Why a single-file checkpoint is torn, if its format can tell: a zip (torch.save's
    format, Lightning's .ckpt) ends with an end-of-central-directory record; a safetensors
    file is exactly as long as its header says. None when whole or when the format cannot tell."""
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
            if head[:4] == b"PK\x03\x04":
                f.seek(max(0, size - 65557))  # EOCD (22 bytes) + the longest zip comment
                if _EOCD not in f.read():
                    return "zip without its end record (cut short while being written)"
            elif path.endswith(".safetensors") and len(head) == 8:
                return _torn_safetensors(f, struct.unpack("<Q", head)[0], size)
    except OSError:
        return None
    return None


def _torn_safetensors(f, header_len: int, size: int) -> str | None:
    import json

    if header_len > size - 8:
        return "safetensors header longer than the file"
    try:
        header = json.loads(f.read(header_len))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError):
        return "safetensors header unreadable"
    if 8 + header_len + end > size:
        return f"safetensors data cut short ({size} of {8 + header_len + end} bytes)"
    return None
