"""The tutorial's lines as two ranks of one node print them into one pipe (CI, 6a90716..45a3e49:
test_ddp_tutorial found 3 of 4 ranks' "Resuming" lines): under PYTHONUNBUFFERED ``print`` is
two writes, the text then the newline (strace: ``write(1, "Resuming at 20", 14)``, then
``write(1, "\\n", 1)``), so the second rank's text can land between them."""

from __future__ import annotations

from tests.support.tutorial_job import TRAINING, resumed_epochs, saved_epochs

TWO_RANKS = ("Loading snapshot\nLoading snapshot\n"
             "Resuming training from snapshot at Epoch 20Resuming training from snapshot at Epoch 20\n\n"
             "[GPU1] Epoch 20 | Batchsize: 32 | Steps: 4Epoch 20 | Training snapshot saved at snapshot.pt\n\n")


def test_every_rank_is_found_when_two_ranks_interleave() -> None:
    assert resumed_epochs(TWO_RANKS) == [20, 20]
    assert saved_epochs(TWO_RANKS) == [20]
    assert TRAINING.search(TWO_RANKS)
