"""The peer transport (issue 43, ``supervisor/sync/_peer.py``): files between node agents over
TCP, real sockets on 127.0.0.1 and real files. A fetched file appears whole and verified or not
at all; a push lands under the inbox only, verified, within the quota; nothing escapes a root;
a peer without the token is served nothing; a peer that stops mid-transfer leaves nothing."""

from __future__ import annotations

import hashlib
import json
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from supervisor.sync import _peer
from supervisor.sync._peer import PeerError, PeerServer, fetch, new_token, push
from tests.support.wait import wait_for_async

MB = 1 << 20
TOKEN = new_token()
MTIME = 1_600_000_000_123_456_789
Addr = tuple[str, int]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def temps(d: Path) -> list[str]:
    return [p.name for p in d.rglob(".tmp-*")] if d.exists() else []


def files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() or p.is_symlink())


def write(path: Path, data: bytes, mtime_ns: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


@asynccontextmanager
async def serving(tmp_path: Path, quota: int = 1 << 30) -> AsyncIterator[tuple[Addr, dict[str, Path]]]:
    """A real server over a node's local disk: the live checkpoints, the set-aside ones, the inbox."""
    local = tmp_path / "local"
    roots = {"live": local, "aside": local / ".supervise-set-aside", "peer": local / ".supervise-peer"}
    for p in roots.values():
        p.mkdir(parents=True, exist_ok=True)
    async with anyio.create_task_group() as tg:
        addr = await tg.start(PeerServer(roots, TOKEN, "peer", quota, host="127.0.0.1").serve)
        yield addr, roots
        tg.cancel_scope.cancel()


@asynccontextmanager
async def fake(handler: Callable[[SocketStream], Awaitable[None]]) -> AsyncIterator[Addr]:
    """A peer that misbehaves as ``handler`` says."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handler)
        yield "127.0.0.1", listener.extra(SocketAttribute.local_port)
        tg.cancel_scope.cancel()


def answers_get(data: bytes, then: Callable[[SocketStream], Awaitable[None]]) -> Callable[[SocketStream], Awaitable[None]]:
    """A fake server that answers a get for ``data``, sends its first half, then does ``then``."""
    async def handler(stream: SocketStream) -> None:
        async with stream:
            req = json.loads(await BufferedByteReceiveStream(stream).receive_until(b"\n", 4096))
            await stream.send(json.dumps({"ok": True, "size": req["size"]}).encode() + b"\n")
            await stream.send(data[: len(data) // 2])
            await then(stream)
    return handler


async def raw(addr: Addr, *chunks: bytes, eof: bool = False) -> bytes:
    """Speak the protocol by hand; everything the server says until it closes."""
    out = b""
    async with await anyio.connect_tcp(*addr) as s:
        for c in chunks:
            await s.send(c)
        if eof:
            await s.send_eof()
        with anyio.fail_after(10):
            try:
                while True:
                    out += await s.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    return out


def line(**fields: object) -> bytes:
    return json.dumps(fields).encode() + b"\n"


@pytest.mark.asyncio
async def test_get_round_trip_lands_whole_with_its_mtime(tmp_path: Path) -> None:
    data = os.urandom(3 * MB + 17)
    async with serving(tmp_path) as (addr, roots):
        write(roots["live"] / "step_1" / "model.pt", data, MTIME)
        dest = tmp_path / "restore" / "step_1" / "model.pt"
        n = await fetch(addr, TOKEN, "live", "step_1/model.pt", size=len(data), sha256=sha(data), dest=dest, timeout=10)
    assert n == len(data) and dest.read_bytes() == data
    assert dest.stat().st_mtime_ns == MTIME
    assert os.listdir(dest.parent) == ["model.pt"], "the temp name renamed, nothing else beside it"


@pytest.mark.asyncio
async def test_get_dest_appears_only_once_the_whole_file_is_there(tmp_path: Path) -> None:
    data = os.urandom(3 * MB)
    go = anyio.Event()

    async def rest(stream: SocketStream) -> None:
        await go.wait()
        await stream.send(data[len(data) // 2:])

    dest = tmp_path / "restore" / "model.pt"
    got: list[int] = []
    async with fake(answers_get(data, rest)) as addr, anyio.create_task_group() as tg:
        async def client() -> None:
            got.append(await fetch(addr, TOKEN, "live", "model.pt", size=len(data), sha256=sha(data), dest=dest, timeout=10))
        tg.start_soon(client)
        # half is here (a chunk already written to the temp): the temp beside dest, dest not yet
        await wait_for_async(lambda: any(p.stat().st_size >= MB for p in dest.parent.glob(".tmp-*")), 10,
                             what="the first half in the temp file")
        assert not dest.exists()
        go.set()
    assert got == [len(data)] and dest.read_bytes() == data and temps(dest.parent) == []


@pytest.mark.asyncio
async def test_a_file_that_does_not_match_its_sha256_is_not_kept(tmp_path: Path) -> None:
    data = os.urandom(2 * MB)
    async with serving(tmp_path) as (addr, roots):
        flipped = bytearray(data)
        flipped[MB + 3] ^= 0x01
        write(roots["aside"] / "step_1" / "model.pt", bytes(flipped))
        dest = tmp_path / "restore" / "model.pt"
        with pytest.raises(PeerError) as e:
            await fetch(addr, TOKEN, "aside", "step_1/model.pt", size=len(data), sha256=sha(data), dest=dest, timeout=10)
    assert e.value.why == "sha256" and isinstance(e.value, OSError)
    assert not dest.exists() and temps(dest.parent) == []


@pytest.mark.asyncio
async def test_get_of_another_size_than_asked_is_refused(tmp_path: Path) -> None:
    async with serving(tmp_path) as (addr, roots):
        write(roots["live"] / "a.bin", b"x" * 100)
        dest = tmp_path / "restore" / "a.bin"
        with pytest.raises(PeerError) as e:
            await fetch(addr, TOKEN, "live", "a.bin", size=99, sha256=sha(b"x" * 99), dest=dest, timeout=10)
        with pytest.raises(PeerError) as missing:
            await fetch(addr, TOKEN, "live", "b.bin", size=1, sha256=sha(b"x"), dest=dest, timeout=10)
        with pytest.raises(PeerError) as root:
            await fetch(addr, TOKEN, "nope", "a.bin", size=100, sha256=sha(b"x" * 100), dest=dest, timeout=10)
    assert (e.value.why, missing.value.why, root.value.why) == ("size", "missing", "root")
    assert not dest.exists() and temps(dest.parent) == []


@pytest.mark.asyncio
async def test_a_wrong_token_is_served_nothing(tmp_path: Path) -> None:
    data = b"secret weights" * 1000
    async with serving(tmp_path) as (addr, roots):
        write(roots["live"] / "model.pt", data)
        src = write(tmp_path / "src.bin", b"pushed")
        dest = tmp_path / "restore" / "model.pt"
        with pytest.raises(PeerError) as got:
            await fetch(addr, "0" * 32, "live", "model.pt", size=len(data), sha256=sha(data), dest=dest, timeout=10)
        with pytest.raises(PeerError) as put:
            await push(addr, TOKEN + "x", src, "node-1/src.bin", timeout=10)
        said = await raw(addr, line(token="wrong", op="get", root="live", rel="model.pt", size=len(data)))
        untokened = await raw(addr, line(op="get", root="live", rel="model.pt", size=len(data)))
    assert got.value.why == put.value.why == "token"
    assert said == untokened == b'{"ok": false, "why": "token"}\n', "the refusal and then the end, not one byte of the file"
    assert not dest.exists() and files(roots["peer"]) == []


@pytest.mark.asyncio
async def test_a_request_line_over_4_kib_is_dropped_unanswered(tmp_path: Path) -> None:
    async with serving(tmp_path) as (addr, roots):
        write(roots["live"] / "a.bin", b"a")
        long = line(token=TOKEN, op="get", root="live", rel="a.bin", size=1, pad="p" * 5000)
        assert await raw(addr, long) == b""
        assert (await raw(addr, line(token=TOKEN, op="get", root="live", rel="a.bin", size=1))).endswith(b"\na")


@pytest.mark.asyncio
@pytest.mark.parametrize("rel", ["../outside.bin", "ABSOLUTE", "/etc/passwd", "link.bin", "linkdir/f.bin",
                                 "step/../../outside.bin", "./model.pt", "step//model.pt", ""])
async def test_nothing_outside_a_root_is_served(tmp_path: Path, rel: str) -> None:
    outside = write(tmp_path / "outside.bin", b"o" * 1000)
    write(tmp_path / "outsidedir" / "f.bin", b"o" * 1000)
    if rel == "ABSOLUTE":
        rel = str(outside)
    size = os.path.getsize("/etc/passwd") if rel == "/etc/passwd" else 1000
    async with serving(tmp_path) as (addr, roots):
        live = roots["live"]
        write(live / "model.pt", b"o" * 1000)
        write(live / "step" / "model.pt", b"o" * 1000)
        (live / "link.bin").symlink_to(outside)
        (live / "linkdir").symlink_to(tmp_path / "outsidedir")
        dest = tmp_path / "restore" / "got.bin"
        with pytest.raises(PeerError) as e:
            await fetch(addr, TOKEN, "live", rel, size=size, sha256="0" * 64, dest=dest, timeout=10)
        said = await raw(addr, line(token=TOKEN, op="get", root="live", rel=rel, size=size))
    assert e.value.why == "path", e.value
    assert said == b'{"ok": false, "why": "path"}\n'
    assert not dest.exists() and temps(dest.parent) == []


@pytest.mark.asyncio
async def test_a_push_never_lands_outside_the_inbox(tmp_path: Path) -> None:
    src = write(tmp_path / "src.bin", b"p" * 1000)
    async with serving(tmp_path) as (addr, roots):
        (tmp_path / "outsidedir").mkdir()
        (roots["peer"] / "node-1").symlink_to(tmp_path / "outsidedir")
        whys = []
        for rel in ["../evil.bin", "../../evil.bin", str(tmp_path / "evil.bin"), "node-1/evil.bin", ".tmp-abc"]:
            with pytest.raises(PeerError) as e:
                await push(addr, TOKEN, src, rel, timeout=10)
            whys.append(e.value.why)
    assert whys == ["path"] * 5
    assert os.listdir(tmp_path / "outsidedir") == [] and not (tmp_path / "evil.bin").exists()
    assert files(roots["live"]) == [".supervise-peer/node-1"], "only the link planted in the inbox"


@pytest.mark.asyncio
async def test_put_round_trip_lands_under_the_inbox_with_its_mtime(tmp_path: Path) -> None:
    data = os.urandom(2 * MB + 5)
    src = write(tmp_path / "node1" / "model.pt", data, MTIME)
    async with serving(tmp_path) as (addr, roots):
        n = await push(addr, TOKEN, src, "node-1/step_1/model.pt", timeout=10)
        landed = roots["peer"] / "node-1" / "step_1" / "model.pt"
        assert n == (len(data), sha(data)) and sha(landed.read_bytes()) == sha(data), "the hash of what was sent"
        assert landed.stat().st_mtime_ns == MTIME
        assert files(roots["peer"]) == ["node-1/step_1/model.pt"], "no temp left beside it"
        assert await push(addr, TOKEN, write(src, b"new"), "node-1/step_1/model.pt", timeout=10) == (3, sha(b"new"))
        assert landed.read_bytes() == b"new", "a second push of the same name replaces it"


@pytest.mark.asyncio
async def test_a_put_whose_trailing_sha256_is_wrong_or_short_leaves_nothing(tmp_path: Path) -> None:
    body = os.urandom(3 * MB)
    head = line(token=TOKEN, op="put", rel="node-1/model.pt", size=len(body), mtime_ns=MTIME)
    async with serving(tmp_path) as (addr, roots):
        wrong = await raw(addr, head, body, line(sha256=sha(body + b"x")))
        short = await raw(addr, head, body[: 2 * MB], eof=True)
        trailerless = await raw(addr, head, body, eof=True)
        inbox = files(roots["peer"])
        right = await raw(addr, head, body, line(sha256=sha(body)))
    assert wrong == b'{"ok": true}\n{"ok": false, "why": "sha256"}\n'
    assert short == b'{"ok": true}\n{"ok": false, "why": "short"}\n'
    assert trailerless == b'{"ok": true}\n'
    assert inbox == [], "neither the file nor its temp"
    assert right == b'{"ok": true}\n{"ok": true}\n' and files(roots["peer"]) == ["node-1/model.pt"]


@pytest.mark.asyncio
async def test_a_push_over_the_quota_is_refused_before_its_body(tmp_path: Path) -> None:
    async with serving(tmp_path, quota=1000 * 1024) as (addr, roots):
        write(roots["peer"] / "node-2" / "old.pt", b"o" * 600 * 1024)
        big = write(tmp_path / "big.pt", b"b" * 500 * 1024)
        with pytest.raises(PeerError) as e:
            await push(addr, TOKEN, big, "node-1/big.pt", timeout=10)
        said = await raw(addr, line(token=TOKEN, op="put", rel="node-1/big.pt", size=500 * 1024, mtime_ns=MTIME))
        assert e.value.why == "quota" and said == b'{"ok": false, "why": "quota"}\n'
        assert files(roots["peer"]) == ["node-2/old.pt"]
        fits = write(tmp_path / "fits.pt", b"f" * 400 * 1024)
        assert (await push(addr, TOKEN, fits, "node-1/fits.pt", timeout=10)).size == 400 * 1024, "600 + 400 KiB is within"
        assert files(roots["peer"]) == ["node-1/fits.pt", "node-2/old.pt"]


@pytest.mark.asyncio
async def test_drop_removes_under_the_inbox_only(tmp_path: Path) -> None:
    async with serving(tmp_path) as (addr, roots):
        peer, live = roots["peer"], roots["live"]
        for rel in ["node-1/v1/model.pt", "node-1/v1/optim/0.pt", "node-1/v2/model.pt"]:
            write(peer / rel, b"x")
        write(live / "node-1" / "v1" / "model.pt", b"live")
        write(tmp_path / "outsidedir" / "keep.pt", b"keep")
        (peer / "node-1" / "link").symlink_to(tmp_path / "outsidedir")

        async def drop(rel: str) -> bytes:
            return await raw(addr, line(token=TOKEN, op="drop", rel=rel))

        assert await drop("node-1/link/keep.pt") == b'{"ok": false, "why": "path"}\n'
        assert await drop("node-1/v1") == b'{"ok": true}\n'
        assert await drop("node-1/link") == b'{"ok": true}\n'
        assert await drop("node-1/gone") == b'{"ok": true}\n', "already gone"
        assert await drop("../node-1") == b'{"ok": false, "why": "path"}\n'
        assert await raw(addr, line(token="no", op="drop", rel="node-1")) == b'{"ok": false, "why": "token"}\n'
    assert files(peer) == ["node-1/v2/model.pt"]
    assert (live / "node-1" / "v1" / "model.pt").read_bytes() == b"live", "the live root is never dropped from"
    assert (tmp_path / "outsidedir" / "keep.pt").read_bytes() == b"keep", "a link is removed, never followed"


@pytest.mark.asyncio
async def test_64_mib_fetched_and_pushed(tmp_path: Path) -> None:
    data = os.urandom(64 * MB)
    src = write(tmp_path / "node1" / "shard.pt", data, MTIME)
    async with serving(tmp_path) as (addr, roots):
        write(roots["live"] / "shard.pt", data)
        dest = tmp_path / "restore" / "shard.pt"
        t0 = time.perf_counter()
        got = await fetch(addr, TOKEN, "live", "shard.pt", size=len(data), sha256=sha(data), dest=dest, timeout=30)
        t1 = time.perf_counter()
        sent = await push(addr, TOKEN, src, "node-1/shard.pt", timeout=30)
        t2 = time.perf_counter()
    print(f"\n64 MiB on 127.0.0.1: fetch {64 / (t1 - t0):.0f} MB/s, push {64 / (t2 - t1):.0f} MB/s")
    assert got == sent.size == len(data)
    assert sha(dest.read_bytes()) == sha((roots["peer"] / "node-1" / "shard.pt").read_bytes()) == sha(data)


@pytest.mark.asyncio
async def test_push_keeps_to_its_rate(tmp_path: Path) -> None:
    src = write(tmp_path / "src.bin", os.urandom(2 * MB))
    async with serving(tmp_path) as (addr, roots):
        t0 = time.perf_counter()
        await push(addr, TOKEN, src, "node-1/src.bin", timeout=10, rate=4 * MB)
        took = time.perf_counter() - t0
    assert took >= 0.45, f"2 MiB at 4 MiB/s took {took:.2f}s"
    assert (roots["peer"] / "node-1" / "src.bin").read_bytes() == src.read_bytes()


@pytest.mark.asyncio
async def test_a_silent_connection_does_not_hold_up_the_others(tmp_path: Path) -> None:
    data = os.urandom(MB)
    async with serving(tmp_path) as (addr, roots):
        write(roots["live"] / "a.bin", data)
        async with await anyio.connect_tcp(*addr), anyio.create_task_group() as tg:  # says nothing
            for i in range(3):
                tg.start_soon(lambda i=i: fetch(addr, TOKEN, "live", "a.bin", size=len(data), sha256=sha(data),
                                                dest=tmp_path / f"r{i}" / "a.bin", timeout=10))
    assert all((tmp_path / f"r{i}" / "a.bin").read_bytes() == data for i in range(3))


@pytest.mark.asyncio
async def test_a_server_that_sends_half_and_closes_leaves_nothing(tmp_path: Path) -> None:
    data = os.urandom(3 * MB)

    async def close(stream: SocketStream) -> None:
        pass

    dest = tmp_path / "restore" / "model.pt"
    async with fake(answers_get(data, close)) as addr:
        with pytest.raises(PeerError) as e:
            await fetch(addr, TOKEN, "live", "model.pt", size=len(data), sha256=sha(data), dest=dest, timeout=10)
    assert e.value.why == "short" and not dest.exists() and temps(dest.parent) == []


@pytest.mark.asyncio
async def test_a_server_that_stalls_mid_transfer_times_out_and_leaves_nothing(tmp_path: Path) -> None:
    data = os.urandom(3 * MB)

    async def stall(stream: SocketStream) -> None:
        await anyio.sleep_forever()

    dest = tmp_path / "restore" / "model.pt"
    async with fake(answers_get(data, stall)) as addr:
        with pytest.raises(PeerError) as e:
            await fetch(addr, TOKEN, "live", "model.pt", size=len(data), sha256=sha(data), dest=dest, timeout=0.5)
    assert e.value.why == "timeout" and not dest.exists() and temps(dest.parent) == []


@pytest.mark.asyncio
async def test_a_server_stopped_mid_transfer_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's task group cancelled while a 32 MiB fetch runs (the client's disk slowed so
    that it cannot finish first): the client sees the stream end short and keeps nothing."""
    data = os.urandom(32 * MB)
    slow = _peer._Landing.write

    def write_slowly(self: _peer._Landing, chunk: bytes) -> None:
        time.sleep(0.02)
        slow(self, chunk)

    monkeypatch.setattr(_peer._Landing, "write", write_slowly)
    local = tmp_path / "local"
    write(local / "shard.pt", data)
    server = PeerServer({"live": local, "peer": local / ".supervise-peer"}, TOKEN, "peer", 1 << 30, host="127.0.0.1")
    stop = anyio.CancelScope()
    failed: list[PeerError] = []
    dest = tmp_path / "restore" / "shard.pt"

    async def serve(*, task_status: anyio.abc.TaskStatus[Addr]) -> None:
        with stop:
            await server.serve(task_status=task_status)

    async def client(addr: Addr) -> None:
        try:
            await fetch(addr, TOKEN, "live", "shard.pt", size=len(data), sha256=sha(data), dest=dest, timeout=10)
        except PeerError as e:
            failed.append(e)

    async with anyio.create_task_group() as tg:
        addr = await tg.start(serve)
        tg.start_soon(client, addr)
        await wait_for_async(lambda: any(p.stat().st_size >= MB for p in dest.parent.glob(".tmp-*")), 10,
                             what="the fetch under way")
        stop.cancel()
    assert [e.why for e in failed] == ["short"], failed
    assert not dest.exists() and temps(dest.parent) == []


@pytest.mark.asyncio
async def test_each_pair_has_its_inbox_a_push_names_it_and_drop_removes_there_only(tmp_path: Path) -> None:
    """Two per-node pairs on one node: each pair's copies land in its own inbox (the ring's
    ``root``); a root that is not an inbox is refused before any byte, and ``drop`` removes under
    the inbox it names only."""
    a, b = tmp_path / "a" / ".supervise-peer", tmp_path / "b" / ".supervise-peer"
    roots = {"a": tmp_path / "a", "a.peer": a, "b.peer": b}
    src = write(tmp_path / "x.pt", b"x" * 1000, MTIME)
    async with anyio.create_task_group() as tg:
        addr = await tg.start(PeerServer(roots, TOKEN, ["a.peer", "b.peer"], 1 << 30, host="127.0.0.1").serve)
        assert await push(addr, TOKEN, src, "node-1/x.pt", timeout=10, root="b.peer") == (1000, sha(b"x" * 1000))
        assert await push(addr, TOKEN, src, "node-1/x.pt", timeout=10) == (1000, sha(b"x" * 1000))  # the first inbox
        with pytest.raises(PeerError) as e:
            await push(addr, TOKEN, src, "node-1/x.pt", timeout=10, root="a")
        assert e.value.why == "root"
        assert files(a) == files(b) == ["node-1/x.pt"], (files(a), files(b))
        await _peer.drop(addr, TOKEN, "node-1", timeout=10, root="b.peer")
        tg.cancel_scope.cancel()
    assert files(b) == [] and files(a) == ["node-1/x.pt"], (files(a), files(b))
    assert (tmp_path / "a" / "node-1").exists() is False, "nothing landed in a root that is not an inbox"
