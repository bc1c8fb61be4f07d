"""What the GPU tests read back: the sampler's CSV."""

from __future__ import annotations

from pathlib import Path


def read_csv(path: Path) -> list[dict[str, str]]:
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","))) for line in lines[1:] if line]
