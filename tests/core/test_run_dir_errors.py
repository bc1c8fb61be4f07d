"""Issue 22, item 3: every OSError creating or opening the run directory is exit 2 with one
line naming the path (a long one shortened in the middle), and nothing is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.supervise import run_supervise


def _cases(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "journal-is-a-dir" / "events.jsonl").mkdir(parents=True)
    return {
        "5000 characters": tmp_path / (("d" * 200 + "/") * 24 + "run"),
        "a component over NAME_MAX": tmp_path / ("n" * 300) / "run",
        "a file on the way": tmp_path / "a-file" / "run",
        "its journal a directory": tmp_path / "journal-is-a-dir",
    }


@pytest.mark.parametrize("case", ["5000 characters", "a component over NAME_MAX", "a file on the way",
                                  "its journal a directory"])
def test_a_run_directory_that_cannot_be_made_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    run = _cases(tmp_path)[case]
    marker = tmp_path / "started"
    r = run_supervise("--run-dir", str(run), "--gpu-every", "0", "--", "touch", str(marker))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[0].startswith("supervise: run_dir = ") and len(lines[0]) < 400, lines[0]
    assert str(run)[:40] in lines[0] and str(run)[-40:] in lines[0], "both ends of the path are named"
    assert not marker.exists(), "nothing may start"
