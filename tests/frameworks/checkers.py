"""Does a checkpoint load with its library's own loader? One checker per profile.

Used by the poller (every visible checkpoint on the persistent side, every 50 ms) and by the
tests' final assertions. Each ``check_*`` takes one top-level entry and returns the step it
holds, or raises: a raise on the persistent side is a torn sighting. ``entries`` says which
top-level names of a directory are that profile's checkpoints; everything else (hidden
staging names, strays such as HF's ``training_args.bin``) is not looked at.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HF_DIR = re.compile(r"checkpoint-(\d+)")
ACCEL_DIR = re.compile(r"checkpoint_(\d+)")


def _torch():  # noqa: ANN202
    import torch

    return torch


def check_hf(path: Path) -> int:
    """What ``Trainer.train(resume_from_checkpoint=path)`` reads, read the way it reads it."""
    from safetensors.torch import load_file
    from transformers.trainer_callback import TrainerState

    torch = _torch()
    state = TrainerState.load_from_json(str(path / "trainer_state.json"))
    load_file(str(path / "model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt"):
        torch.load(path / name, weights_only=True)
    torch.load(path / "rng_state.pth", weights_only=False)
    step = int(HF_DIR.fullmatch(path.name).group(1))
    if state.global_step != step:
        raise ValueError(f"trainer_state.json says step {state.global_step}, the name says {step}")
    return step


def check_lightning(path: Path) -> int:
    """What ``trainer.fit(ckpt_path=…)`` reads: Lightning's own loader; a link must stay inside."""
    from lightning.fabric.utilities.cloud_io import _load as pl_load

    if path.is_symlink():
        target = os.readlink(path)
        if os.path.isabs(target) or not (path.parent / target).resolve().is_relative_to(path.parent.resolve()):
            raise ValueError(f"link out of the directory: {target}")
        if not (path.parent / target).exists():
            raise FileNotFoundError(f"dangling link to {target}")
    ckpt = pl_load(str(path), map_location="cpu", weights_only=False)
    if "state_dict" not in ckpt or "optimizer_states" not in ckpt:
        raise ValueError(f"not a Lightning checkpoint: {sorted(ckpt)}")
    return int(ckpt["global_step"])


def check_torch_save(path: Path) -> int:
    state = _torch().load(path, weights_only=True)
    return int(state["step"])


def check_dcp(path: Path) -> int:
    """``dcp.load`` into a state dict of the trainer's shape (tests/frameworks/trainers/dcp_train.py)."""
    torch = _torch()
    import torch.distributed.checkpoint as dcp

    width = 64
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    state = {"model": model.state_dict(), "step": torch.zeros((), dtype=torch.int64)}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(path))
    return int(state["step"])


def check_accelerate(path: Path) -> int:
    """The files ``Accelerator.load_state(path)`` opens for one model, one optimizer, one custom object."""
    from safetensors.torch import load_file

    torch = _torch()
    load_file(str(path / "model.safetensors"))
    torch.load(path / "optimizer.bin", weights_only=True)
    torch.load(path / "random_states_0.pkl", weights_only=False)
    return int(torch.load(path / "custom_checkpoint_0.pkl", weights_only=False)["n"])


def check_deepspeed(path: Path) -> int:
    """What ``engine.load_checkpoint(dir, tag)`` needs, read with DeepSpeed's own offline loader:
    the model states, and with ZeRO every rank's optimizer shard (``zero_to_fp32``'s
    ``get_fp32_state_dict_from_zero_checkpoint`` raises unless all ``dp_world_size`` are there)."""
    torch = _torch()
    import logging

    from deepspeed.utils import logger
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    logger.setLevel(logging.ERROR)
    model = torch.load(path / "mp_rank_00_model_states.pt", weights_only=False, map_location="cpu")
    if model.get("param_shapes") is not None:  # ZeRO: the optimizer is in the ranks' shards
        get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
    elif not model.get("optimizer"):
        raise ValueError("ZeRO 0 model states without the optimizer")
    step = int(model["step"])
    if path.name != f"global_step{step}":
        raise ValueError(f"{path.name} holds step {step}")
    return step


def check_orbax(path: Path) -> int:
    """What ``CheckpointManager.restore(step)`` reads: Orbax's own ``StandardCheckpointer``."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        state = ckptr.restore(path.resolve() / "default")
    step = int(state["step"])
    if path.name != str(step):
        raise ValueError(f"{path.name} holds step {step}")
    return step


def check_deepspeed_layout(path: Path) -> int:
    """The fake DeepSpeed layout (trainers/layout_train.py): ``global_stepN/`` of torch.save files."""
    torch = _torch()
    model = torch.load(path / "mp_rank_00_model_states.pt", weights_only=True)
    torch.load(path / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=True)
    return int(model["step"])


def check_megatron(path: Path) -> int:
    return int(_torch().load(path / "mp_rank_00" / "model_optim_rng.pt", weights_only=True)["step"])


def check_orbax_layout(path: Path) -> int:
    """The fake Orbax layout: ``N/`` holds ``_CHECKPOINT_METADATA`` and its item."""
    (path / "_CHECKPOINT_METADATA").read_text()
    return int(_torch().load(path / "default" / "state.pt", weights_only=True)["step"])


def check_generic(path: Path) -> int:
    """The user's own layout (trainers/layout_train.py --layout generic): ``DONE`` written last."""
    if not (path / "DONE").exists():
        raise FileNotFoundError(f"{path.name}/DONE")
    _torch().load(path / "optim.pt", weights_only=True)
    return int(_torch().load(path / "weights.pt", weights_only=True)["step"])


CHECKERS: dict[str, Callable[[Path], int]] = {
    "hf-trainer": check_hf,
    "lightning": check_lightning,
    "torch-save": check_torch_save,
    "dcp": check_dcp,
    "accelerate": check_accelerate,
    "deepspeed": check_deepspeed,
    "deepspeed-layout": check_deepspeed_layout,
    "megatron": check_megatron,
    "orbax": check_orbax,
    "orbax-layout": check_orbax_layout,
    "generic": check_generic,
}
PROFILE_OF = {"deepspeed-layout": "deepspeed", "orbax-layout": "orbax"}  # checker → the profile whose entries it reads


def is_entry(checker: str, name: str) -> bool:
    """Is the top-level name ``name`` one of the checker's profile's checkpoints (what a user would load)?"""
    profile = PROFILE_OF.get(checker, checker)
    keep = {
        "hf-trainer": lambda n: HF_DIR.fullmatch(n),
        "accelerate": lambda n: ACCEL_DIR.fullmatch(n),
        "lightning": lambda n: n.endswith(".ckpt"),
        "torch-save": lambda n: n.endswith(".pt"),
        "dcp": lambda n: n.startswith("step_"),
        "deepspeed": lambda n: n.startswith("global_step"),
        "megatron": lambda n: n.startswith("iter_"),
        "orbax": lambda n: n.isdigit(),
        "generic": lambda n: n.startswith("ckpt_"),
    }[profile]
    return not name.startswith(".") and bool(keep(name))


def entries(checker: str, root: Path) -> list[Path]:
    """The top-level names of ``root`` that are the checker's profile's checkpoints."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    return [root / n for n in names if is_entry(checker, n)]


def _tensors_hf(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _tensors_lightning(path: Path) -> dict:
    from lightning.fabric.utilities.cloud_io import _load as pl_load

    return pl_load(str(path), map_location="cpu", weights_only=False)["state_dict"]


def _tensors_deepspeed(path: Path) -> dict:
    """The module's weights as rank 0 saved them (ZeRO 0 and 1 keep the whole model there)."""
    return _torch().load(path / "mp_rank_00_model_states.pt", weights_only=False, map_location="cpu")["module"]


def _tensors_orbax(path: Path) -> dict:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        state = ckptr.restore(path.resolve() / "default")
    return dict(state["params"])


TENSORS: dict[str, Callable[[Path], dict]] = {
    "hf-trainer": _tensors_hf,
    "lightning": _tensors_lightning,
    "accelerate": _tensors_hf,  # model.safetensors too
    "deepspeed": _tensors_deepspeed,
    "orbax": _tensors_orbax,
}


def weights(checker: str, path: Path) -> str:
    """A digest of the model weights in the checkpoint at ``path``, read with its library's loader:
    names, dtypes, shapes and every byte (two checkpoints with equal digests hold equal weights)."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    tensors = TENSORS[checker](path)
    for name in sorted(tensors):
        t = tensors[name]
        arr = np.ascontiguousarray(t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t))
        h.update(f"{name}|{arr.dtype}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:32]


def load_all(checker: str, root: Path) -> dict[str, int | str]:
    """Every checkpoint of ``root``: name → step, or name → the error that loading it raised."""
    out: dict[str, int | str] = {}
    for p in entries(checker, root):
        try:
            out[p.name] = CHECKERS[checker](p)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            out[p.name] = f"{type(e).__name__}: {e}"
    return out


def durable_steps(checker: str, root: Path) -> list[int]:
    return sorted({v for v in load_all(checker, root).values() if isinstance(v, int)})
