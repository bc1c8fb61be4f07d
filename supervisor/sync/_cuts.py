"""Where a large file's parts are cut (issue 45): at its content's structure, not at fixed offsets.

A file of ``PART`` bytes or more goes to an object store as parts, each an object by its own
hash (``_store.put_parts``), so a part whose bytes did not change is not sent again. Cut at
fixed offsets, a changed tensor that straddles two parts sends both: ``bench/s3.py --shapes
frozen`` measured one ``model.safetensors`` at 1.55x the changed bytes. Cut at the tensors,
a part holds bytes that change together:

* a ``.safetensors`` file (recognised by its content: 8 bytes little-endian header length,
  then a JSON object whose ``data_offsets`` lie inside the file) is cut at every tensor's
  start and end, and at the header's end. A piece of ``GROUP`` bytes or more is its own part,
  cut into ``PART`` pieces from its own start when it is larger; smaller neighbours (the
  header, norms, biases) are grouped up to ``GROUP`` bytes, so a model's many small tensors
  do not make many small objects;
* any other file: fixed ``PART`` parts from its start (the layout before).

The cuts depend only on the file's header, so an unchanged tensor is the same object in every
version. Nothing else reads them: a manifest lists each part's ``size`` in order, and a
restore joins the parts, whatever their sizes (a bucket written with the fixed cuts restores
the same way).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

PART = 8 << 20          # bytes: the largest part (a part is one PUT, held whole in memory)
GROUP = 1 << 20         # bytes: small neighbours grouped up to this (what one changed norm can cost)
HEADER_MAX = 8 << 20     # bytes: a longer header (safetensors allows 100 MB) is not read: fixed cuts (memory: a part's)


def cuts(f: Any, size: int, part: int = PART, group: int = GROUP) -> list[int]:
    """The sizes of the parts, in order, of the open file ``f`` of ``size`` bytes (they sum
    to ``size``); ``f`` is left at its start. Blocking: it may read the header."""
    bounds = _safetensors(f, size) or [0, size]
    out: list[int] = []
    run = 0  # bytes of small pieces grouped so far
    for a, b in zip(bounds, bounds[1:]):
        n = b - a
        if n <= 0:
            continue
        if n < group and run + n <= group:
            run += n
            continue
        if run:
            out.append(run)
            run = 0
        if n < group:
            run = n
            continue
        out.extend([part] * (n // part))
        if n % part:
            out.append(n % part)
    if run:
        out.append(run)
    return out


def sizes(plan: list[int], part: int = PART) -> Iterator[int]:
    """The plan's sizes, then ``part`` for ever: a file that grew under the upload is read to
    its end (the re-check before the manifest finds it changed)."""
    yield from plan
    while True:
        yield part


def _safetensors(f: Any, size: int) -> list[int] | None:
    """A safetensors file's cut points, sorted (0 and ``size`` included), or None when ``f``
    is not one."""
    try:
        f.seek(0)
        head = f.read(9)
        if len(head) < 9 or head[8:9] != b"{":
            return None
        n = int.from_bytes(head[:8], "little")
        if n > HEADER_MAX or 8 + n > size:
            return None
        f.seek(8)
        text = f.read(n)
    finally:
        f.seek(0)
    try:
        doc = json.loads(text)
    except ValueError:  # JSON's and UTF-8's
        return None
    if not isinstance(doc, dict):
        return None
    data = 8 + n
    bounds = {0, data, size}
    for name, t in doc.items():
        if name == "__metadata__":
            continue
        offsets = t.get("data_offsets") if isinstance(t, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= size - data):
            return None
        bounds.update(data + o for o in offsets)
    return sorted(bounds)
