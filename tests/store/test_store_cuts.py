"""Where a large file's parts are cut (``supervisor/sync/_cuts.py``, issue 45): a safetensors
file at its tensors (small neighbours grouped, a large tensor in part-size pieces from its own
start), any other file, or a header that does not hold, at fixed offsets. No server: the cuts
alone; tests/store/test_store_content.py sends and restores them through a real bucket."""

from __future__ import annotations

import io
import itertools
import json

from supervisor.sync._cuts import cuts

PART, GROUP = 64 << 10, 8 << 10


def _safetensors(tensors: dict[str, int], header: bytes | None = None) -> tuple[bytes, int, dict[str, tuple[int, int]]]:
    """A safetensors file by hand (uint8 tensors of the given sizes, in order): its bytes, where
    its data starts, and each tensor's [start, end) in the file."""
    doc, at = {"__metadata__": {"format": "pt"}}, 0
    for name, n in tensors.items():
        doc[name] = {"dtype": "U8", "shape": [n], "data_offsets": [at, at + n]}
        at += n
    text = header if header is not None else json.dumps(doc).encode()
    text += b" " * (-len(text) % 8)
    data = len(text).to_bytes(8, "little") + text + bytes(i % 251 for i in range(at))
    start = 8 + len(text)
    return data, start, {k: (start + v["data_offsets"][0], start + v["data_offsets"][1]) for k, v in doc.items()
                         if k != "__metadata__"}


def _points(sizes: list[int]) -> set[int]:
    return set(itertools.accumulate(sizes, initial=0))


def test_any_other_file_is_cut_at_fixed_offsets() -> None:
    assert cuts(io.BytesIO(b"\1" * (2 * PART + 5)), 2 * PART + 5, PART, GROUP) == [PART, PART, 5]
    assert cuts(io.BytesIO(b"\0" * PART), PART, PART, GROUP) == [PART]  # a length of 0, then not a header


def test_a_safetensors_file_is_cut_at_its_tensors_and_small_neighbours_are_grouped() -> None:
    tensors = {"a.embed": PART + 3000, "a.norm": 512, "b.bias": 512, "b.weight": 20 << 10, "c.norm": 512,
               "c.weight": 2 * PART + 100, "d.tiny": 100, "e.head": GROUP + 1}
    data, start, where = _safetensors(tensors)
    got = cuts(io.BytesIO(data), len(data), PART, GROUP)
    assert sum(got) == len(data) and max(got) <= PART, got
    points = _points(got)
    for name, (a, b) in where.items():  # every tensor of GROUP bytes or more: a part of its own, or pieces from its start
        if b - a >= GROUP:
            assert a in points and b in points, (name, a, b, got)
            assert set(range(a, b, PART)) <= points, (name, got)
    # the header and a.embed's first piece apart; a.norm and b.bias one group; c.norm alone
    # between two large ones; c.weight's tail and d.tiny apart (a large one's tail is its own)
    a, b = where["a.norm"][0], where["b.bias"][1]
    assert start in points and a in points and b in points and not {a + 512} & points, got
    assert len(got) == 1 + 2 + 1 + 1 + 1 + 3 + 1 + 1, got


def test_a_header_that_does_not_hold_falls_back_to_fixed_offsets() -> None:
    size = 2 * PART + 5
    fixed = [PART, PART, 5]
    data, _start, _where = _safetensors({"w": size})
    for bad in (b'{"w": {"data_offsets": [0, 999999999]}}',   # past the file's end
                b'{"w": {"data_offsets": [10, 5]}}',          # backwards
                b'{"w": {"data_offsets": [0, "5"]}}',         # not a number
                b'{"w": [0, 5]}', b"[1, 2]", b"{not json", b"{\xff\xfe}"):
        d, _s, _w = _safetensors({"w": size}, header=bad)
        assert cuts(io.BytesIO(d), len(d), PART, GROUP) == [PART, PART, len(d) - 2 * PART], bad
    long = (10 ** 9).to_bytes(8, "little") + b"{" + b"\0" * size  # past the file's end
    assert cuts(io.BytesIO(long), len(long), PART, GROUP) == fixed[:2] + [len(long) - 2 * PART]
    valid = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    d, _s, _w = _safetensors({"w": size}, header=valid + b" " * (8 << 20))  # a valid header, over the 8 MiB read
    assert cuts(io.BytesIO(d), len(d), PART, GROUP) == [PART] * (len(d) // PART) + [len(d) % PART]


def test_an_unchanged_tensor_is_the_same_part_whatever_changed_beside_it() -> None:
    tensors = {"a": PART + 10, "b": 300, "c": 3 * GROUP, "d": PART // 2}
    data, _start, where = _safetensors(tensors)
    other = bytearray(data)
    a, b = where["c"]
    other[a:b] = b"\xee" * (b - a)
    one, two = (cuts(io.BytesIO(bytes(d)), len(d), PART, GROUP) for d in (data, other))
    assert one == two
    parts = [(p, q) for p, q in zip(sorted(_points(one)), sorted(_points(one))[1:])]
    changed = [(p, q) for p, q in parts if data[p:q] != other[p:q]]
    assert changed == [(a, b)], (changed, parts)


def test_a_restore_fetches_parts_in_windows_of_three_full_parts_bytes() -> None:
    """``download_parts``' windows: 3 parts of 8 MiB (as before), or as many smaller parts as
    fit in their 24 MiB, one MiB of room each at least; a part over the rest starts the next."""
    from supervisor.sync._store import CHUNK, _windows

    def sizes(parts: list[int]) -> list[list[int]]:
        return [[p["size"] for p in w] for w in _windows([{"key": str(i), "size": n} for i, n in enumerate(parts)])]

    assert sizes([CHUNK] * 5 + [5]) == [[CHUNK] * 3, [CHUNK, CHUNK, 5]]
    assert sizes([3 << 20] * 9) == [[3 << 20] * 8, [3 << 20]]
    assert sizes([4096] * 30) == [[4096] * 24, [4096] * 6]
    assert sizes([]) == []
