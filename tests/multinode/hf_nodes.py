"""An HF ``Trainer`` training across nodes, written the way its documentation has users write it.

Started by ``torchrun`` on every node (``torchrun --nnodes 2 --nproc-per-node 2 …``), the
``Trainer`` saves ``checkpoint-N/`` every ``save_steps`` into ``out/`` under the working
directory (each node's own local disk) and resumes from the newest one on its own disk,
``get_last_checkpoint(output_dir)``, the pattern of HF's example scripts. With
``save_on_each_node`` false (the default) the model, optimizer, scheduler and
``trainer_state.json`` are written on global rank 0's node only, but every rank writes its
own ``rng_state_R.pth`` into the checkpoint directory on its own node; with it true, each
node's local rank 0 writes the whole checkpoint on its node. Each rank prints the step it
starts at and the checkpoint it resumed from.

    torchrun ... hf_nodes.py MAX_STEPS SAVE_STEPS SAVE_ON_EACH_NODE(0|1)
"""

from __future__ import annotations

import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.arange(i, i + 16) % 64
        return {"input_ids": ids, "labels": ids}


class Slow(TrainerCallback):
    """A real step takes a while (``STEP_SLEEP`` seconds); each rank says where it starts."""

    def __init__(self, resumed: str | None) -> None:
        self.resumed = resumed

    def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        # one write: the ranks of a node share srun's stdout
        print(f"rank {args.process_index} starts at step {state.global_step} from "
              f"{os.path.basename(self.resumed) if self.resumed else 'nothing'}\n", end="", flush=True)

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        time.sleep(float(os.environ.get("STEP_SLEEP", "0")))

    def on_save(self, args, state, control, **kw):  # noqa: ANN001, ANN201
        if args.process_index == 0:
            print(f"saved checkpoint-{state.global_step}", flush=True)


def main(max_steps: int, save_steps: int, save_on_each_node: bool) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32))
    args = TrainingArguments(
        output_dir="out", max_steps=max_steps, save_steps=save_steps, save_on_each_node=save_on_each_node,
        per_device_train_batch_size=4, learning_rate=1e-3, use_cpu=True, ddp_backend="gloo", report_to="none",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[Slow(last)])
    trainer.train(resume_from_checkpoint=last)
    if torch.distributed.is_initialized():
        # as PyTorch asks at exit: without it rank 0 here once aborted at exit ("terminate
        # called without an active exception") after its last save, and the job FAILED
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
