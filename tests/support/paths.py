"""Where the tests find the checkout and the child programs they run."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: supervisor/, docs/, scripts/, tests/
HELPERS = ROOT / "tests" / "helpers"  # child programs: the stand-in trainer, the signal recorder, …
RECORDER = HELPERS / "recorder.py"
