"""gpu.csv across attempts: appended, a torn last line ended, another header set aside."""

from __future__ import annotations

from pathlib import Path

from supervisor._csv import CsvWriter


def test_gpu_csv_appends_after_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "gpu.csv"
    path.write_text("time,gpu\n1.5,0\n2.5,")  # the last attempt was SIGKILLed mid-row
    w = CsvWriter(path, ["time", "gpu"])
    w.add_row({"time": 3.25, "gpu": 1})
    w.add_row({"time": 4.0, "gpu": None})
    w.flush()
    assert path.read_text() == "time,gpu\n1.5,0\n2.5,\n3.25,1\n4,\n"
    assert w.rows_written == 2


def test_gpu_csv_with_another_header_is_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "gpu.csv"
    path.write_text("t,idx\n1,0\n")
    w = CsvWriter(path, ["time", "gpu"])
    w.add_row({"time": 2, "gpu": 0})
    w.flush()
    assert path.read_text() == "time,gpu\n2,0\n"
    assert (tmp_path / "gpu.csv.1").read_text() == "t,idx\n1,0\n"  # nothing is deleted


def test_gpu_csv_batches_are_due_by_size_or_age(tmp_path: Path) -> None:
    w = CsvWriter(tmp_path / "gpu.csv", ["a"], max_rows=3, max_age=3600)
    w.add_row({"a": 1})
    w.add_row({"a": 2})
    assert not w.due()
    w.add_row({"a": "x,y"})  # a comma in a value cannot break the row
    assert w.due()
    w.flush()
    assert (tmp_path / "gpu.csv").read_text() == "a\n1\n2\nx;y\n" and w.pending() == 0
    aged = CsvWriter(tmp_path / "h.csv", ["a"], max_rows=100, max_age=0.0)
    aged.add_row({"a": 1})
    assert aged.due()
