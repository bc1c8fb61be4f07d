"""A faithful TensorBoard event-file writer and reader without TensorBoard (not a dependency).

The bytes are TensorBoard's: TFRecord framing (length, masked CRC-32C of the length, data,
masked CRC-32C of the data) around ``Event`` protos encoded by hand (``wall_time`` 1,
``step`` 2, ``file_version`` 3, ``summary`` 5: a scalar ``simple_value``, or a histogram as
TensorBoard's histogram plugin writes it: a ``[k, 3]`` float tensor with its plugin name).
The data CRC of a histogram event is computed from a precomputed CRC of its fixed body and
the few bytes that change (wall time, step): pure Python, yet fast enough to write 200 MB
(``bench/s3_logs.py``). ``records`` reads a file back, checking every CRC.
"""

from __future__ import annotations

import struct
from typing import Iterator

from supervisor.sync._tfrecord import _TABLE, masked_crc32c


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, data: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def event_head(wall_time: float, step: int) -> bytes:
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)


def file_version(wall_time: float) -> bytes:
    return b"\x09" + struct.pack("<d", wall_time) + _field(3, b"brain.Event:2")


def scalar(wall_time: float, step: int, tag: str, value: float) -> bytes:
    v = _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value)
    return event_head(wall_time, step) + _field(5, _field(1, v))


def histogram_summary(tag: str, bins: int) -> bytes:
    """A ``Summary`` (field 5 of an Event, encoded) holding a histogram of ``bins`` buckets."""
    content = b"".join(struct.pack("<fff", i, i + 1, (i * 7919) % 101) for i in range(bins))
    shape = _field(2, b"\x08" + _varint(bins)) + _field(2, b"\x08\x03")  # dims [bins, 3]
    tensor = b"\x08\x01" + _field(2, shape) + _field(4, content)
    meta = _field(1, _field(1, b"histograms"))
    return _field(5, _field(1, _field(1, tag.encode()) + _field(9, meta) + _field(8, tensor)))


def frame(data: bytes, data_crc: int | None = None) -> bytes:
    length = struct.pack("<Q", len(data))
    crc = masked_crc32c(data) if data_crc is None else data_crc
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", crc)


def _zeros_op(n: int) -> list[int]:
    """The linear map of CRC-32C's register over ``n`` zero bytes, as 32 column images."""
    one = [_TABLE[(1 << i) & 0xFF] ^ ((1 << i) >> 8) for i in range(32)]
    out = [1 << i for i in range(32)]  # the identity
    sq = one
    while n:
        if n & 1:
            out = [_apply(sq, c) for c in out]
        n >>= 1
        if n:
            sq = [_apply(sq, c) for c in sq]
    return out


def _apply(op: list[int], v: int) -> int:
    r, i = 0, 0
    while v:
        if v & 1:
            r ^= op[i]
        v >>= 1
        i += 1
    return r


class FixedBody:
    """Events that are ``head + body`` with ``body`` the same every time: the data CRC from
    the register after ``head``, moved over ``len(body)`` zero bytes, xor the body's own."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self._op = _zeros_op(len(body))
        c = 0
        for b in body:
            c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
        self._body_crc = c

    def record(self, head: bytes) -> bytes:
        c = 0xFFFFFFFF
        for b in head:
            c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
        crc = (_apply(self._op, c) ^ self._body_crc) ^ 0xFFFFFFFF
        return frame(head + self.body, (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def records(data: bytes) -> Iterator[bytes]:
    """Each record's data, every CRC checked (AssertionError on a bad or torn record)."""
    at = 0
    while at < len(data):
        assert at + 12 <= len(data), f"a torn header at {at}"
        length = struct.unpack_from("<Q", data, at)[0]
        assert struct.unpack_from("<I", data, at + 8)[0] == masked_crc32c(data[at:at + 8]), f"bad length CRC at {at}"
        end = at + 12 + length + 4
        assert end <= len(data), f"a torn record at {at}"
        body = data[at + 12:end - 4]
        assert struct.unpack_from("<I", data, end - 4)[0] == masked_crc32c(body), f"bad data CRC at {at}"
        yield body
        at = end


def steps(data: bytes) -> list[int]:
    """The step of every event that has one (field 2), in order."""
    out = []
    for body in records(data):
        if body[:1] == b"\x09" and body[9:10] == b"\x10":
            n, shift, i = 0, 0, 10
            while True:
                b = body[i]
                n |= (b & 0x7F) << shift
                i += 1
                shift += 7
                if not b & 0x80:
                    break
            out.append(n)
    return out
