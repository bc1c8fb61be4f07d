"""A small file read whole with one ``open`` and its ``read``\\ s.

A buffered open (``Path.read_text``, ``open``) also asks what the file is (``fstat``, twice) and
whether it is a terminal: each a call on the metadata server of a parallel filesystem. The
leader reads every node's offer at each start and every node's manifest at each checkpoint,
so at 1,024 nodes those calls are thousands (issue 44)."""

from __future__ import annotations

import os
from pathlib import Path


def read_once(path: Path, *, nofollow: bool = False) -> bytes:
    """The file's bytes (OSError as ``open`` raises it; ``nofollow``: a symlink is refused)."""
    fd = os.open(path, os.O_RDONLY | (os.O_NOFOLLOW if nofollow else 0))
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
