"""HF transformers ``Trainer`` with its default checkpointing (``checkpoint-N/`` every
``save_steps``), resumed with ``resume_from_checkpoint=get_last_checkpoint(output_dir)``."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import parse, progress  # noqa: E402

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402

args = parse({"save-model-at-end": 0, "die-in-save": 0, "save-total-limit": 0})


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.arange(i, i + 16) % 64
        return {"input_ids": ids, "labels": ids}


class Progress(TrainerCallback):
    def on_train_begin(self, a, state, control, **kw):  # noqa: ANN001, ANN201
        progress(args.progress, "start", step=state.global_step, restored=os.environ.get("SUPERVISE_RESTORED_FROM"))

    def on_step_end(self, a, state, control, **kw):  # noqa: ANN001, ANN201
        progress(args.progress, "step", step=state.global_step)
        time.sleep(args.step_sleep)

    def on_save(self, a, state, control, **kw):  # noqa: ANN001, ANN201
        progress(args.progress, "saved", step=state.global_step)


class PausingTrainer(Trainer):
    """A slow optimizer-state gather: the model files are on disk, ``trainer_state.json`` is not yet."""

    def _save_optimizer_and_scheduler(self, output_dir):  # noqa: ANN001, ANN202
        super()._save_optimizer_and_scheduler(output_dir)
        time.sleep(args.save_pause)
        if self.state.global_step == args.die_in_save:
            os._exit(3)  # the node's OOM killer, mid-save


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32))
targs = TrainingArguments(
    output_dir=args.out, max_steps=args.steps, save_steps=args.save_every, per_device_train_batch_size=4,
    learning_rate=1e-3, use_cpu=True, report_to="none", logging_strategy="no", disable_tqdm=True,
    dataloader_num_workers=0, seed=0, save_total_limit=args.save_total_limit or None,
)
trainer = PausingTrainer(model=model, args=targs, train_dataset=Data(), callbacks=[Progress()])
trainer.train(resume_from_checkpoint=get_last_checkpoint(args.out))
if args.save_model_at_end:
    trainer.save_model(args.out)  # model files and training_args.bin beside the checkpoints
    trainer.save_state()  # and trainer_state.json: the marker's name, at the top level
progress(args.progress, "done", step=trainer.state.global_step)
