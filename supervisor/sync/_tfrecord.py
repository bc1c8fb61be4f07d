"""TFRecord framing, as far as a log pair needs it: where the last whole record ends.

A TensorBoard event file is a sequence of records, each ``length`` (8 bytes, little-endian),
``masked_crc32c(length)`` (4), ``data`` (``length`` bytes), ``masked_crc32c(data)`` (4), and
nothing else: no file header, no index. So the bytes of an event file cut at a record boundary
are an event file by themselves, and TensorBoard reads several event files of one directory
as one run, in the order of their names (``directory_watcher.DirectoryWatcher`` and
``directory_loader.DirectoryLoader`` sort the names containing ``tfevents``; so does the Rust
data server's ``RunLoader``). ``_storelogs.py`` cuts each upload of such a file at the last
whole record, so that every object it writes is a valid event file of its own.

A record's length is checked against its CRC before it is believed: a file whose name says
``tfevents`` and whose bytes are not TFRecord (or are torn in the middle) is cut where its
bytes end, as any other log.
"""

from __future__ import annotations

import os
import struct

EVENT_INFIX = "tfevents"  # TensorBoard's own test for an event file (io_wrapper.IsTensorFlowEventsFile)
HEADER = 12               # length (8) + its masked CRC (4)
FOOTER = 4                # the data's masked CRC
READ = 1 << 20            # bytes read at once while walking the headers


def _table() -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return out


_TABLE = _table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses; pure Python, so for a few bytes at a time."""
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_LENGTH_CRCS: dict[bytes, int] = {}  # a length's 8 bytes → their masked CRC: a file's records repeat a few lengths


def _length_crc(length: bytes) -> int:
    crc = _LENGTH_CRCS.get(length)
    if crc is None:
        if len(_LENGTH_CRCS) >= 1 << 16:
            _LENGTH_CRCS.clear()
        crc = _LENGTH_CRCS[length] = masked_crc32c(length)
    return crc


def is_event_file(rel: str) -> bool:
    return EVENT_INFIX in os.path.basename(rel)


def whole_records(path: os.PathLike[str], start: int, end: int) -> int | None:
    """The offset at which the last whole record within ``[start, end)`` ends (``start`` when
    none is whole yet), walking the record headers from ``start`` (a record boundary). None
    when the bytes there are not TFRecord (a length whose CRC is wrong): the caller cuts
    anywhere. Blocking: reads only the headers' bytes, a megabyte at a time."""
    at = start
    with open(path, "rb") as f:
        while at + HEADER <= end:
            f.seek(at)
            buf = f.read(min(READ, end - at))
            pos = 0
            while pos + HEADER <= len(buf):
                length = struct.unpack_from("<Q", buf, pos)[0]
                if struct.unpack_from("<I", buf, pos + 8)[0] != _length_crc(buf[pos:pos + 8]):
                    return None
                nxt = pos + HEADER + length + FOOTER
                if at + nxt > end:
                    return at + pos
                pos = nxt
            if pos == 0:
                break
            at += pos
    return at
