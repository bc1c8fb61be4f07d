"""An object store as a pair's persistent side (``to = "s3://bucket/prefix"``): the client.

A small async surface over obstore (Rust ``object_store``; the ``supervise-hpc[s3]`` extra),
imported only when a pair names a store: keys under the pair's prefix, uploads addressed by
content that hash before they send and skip an object the bucket holds (issue 45; the layout:
``_storepub``), a log's byte ranges (``put_range``: only what grew), their memory bounded:
small files in batches (``BATCHES_HELD`` × ``BATCH_BYTES``), mid-size ones whole
(``MID_AT_ONCE`` × ``CHUNK``), large ones as parts of at most ``CHUNK`` cut at their
content's structure (``_cuts``), each its own object (``put_parts``: ``PARTS_AT_ONCE`` per
file, ``BIG_AT_ONCE`` files), conditional puts (``create``: refused when the key exists;
``if_match``: refused when it changed), streaming downloads that verify (``download``,
``download_parts``), and deletions that spare what an upload of this process pins
(``drop_objects``).
Every failure is a ``StoreError``, an ``OSError`` whose ``code`` names what happened, so the
pair engine journals and retries it as any copy failure (docs/sync.md, "Object stores").

Credentials, endpoint and region: the pair's own keys, else ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else the profile
(``aws_profile``, ``AWS_PROFILE``, ``default``) of ``~/.aws/credentials`` and ``~/.aws/config``.
No message this module makes holds the secret.
"""

from __future__ import annotations

import configparser
import datetime
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from functools import partial
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence

import anyio

from supervisor.config import StoreSpec, SyncPair
from supervisor.sync import _cuts, _stall
from supervisor.sync._backend import first_failure

CHUNK = 8 << 20          # bytes: a multipart part, and what one read hands the uploader
PARTS_AT_ONCE = 3        # parts of one file in flight: CHUNK parts; smaller ones as many as fit in PARTS_AT_ONCE × CHUNK
UNIT = 1 << 20           # bytes: what a part's room in flight is counted in (a part of 4 KiB takes one)
BIG_AT_ONCE = 2          # files of CHUNK or more uploading at once (memory: about CHUNK × PARTS × BIG)
SMALL_AT_ONCE = 128      # small files' PUTs in flight at once
SMALL = 1 << 20          # bytes: a file this small is read whole, in a batch of others (one worker-thread call each)
BATCH_FILES, BATCH_BYTES = 64, 8 << 20  # a batch of small files; at most BATCHES_HELD batches in memory at once
BATCHES_HELD = 4
MID_AT_ONCE = 8          # files from SMALL to CHUNK, each read whole: at most 8 × CHUNK held
CONNECT_TIMEOUT = "5s"
REQUEST_TIMEOUT = "120s"  # one request (a part of CHUNK bytes at 1 MB/s takes 8 s)
RETRIES = 4              # on 5xx, throttling and dropped connections, with backoff (obstore's)
RETRY_WITHIN_S = 60.0    # and never longer than this per request: the stop's budget bounds the rest
PROBE_RETRIES = 1
PROBE_TIMEOUT = "10s"    # one request of the start's probe: a store that does not answer is not a wrong configuration


class StoreError(OSError):
    """A store operation failed; ``code`` as an errno name where one fits (``EACCES``,
    ``ENOENT``, ``ECONNREFUSED``, ``EEXIST``) or ``S3``."""

    def __init__(self, message: str, code: str = "S3") -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return str(self.args[0])


class Exists(StoreError):
    """A ``create`` put found the key there already."""


class Changed(StoreError):
    """An ``if_match`` put found the key changed (or gone) since it was read."""


@dataclass(frozen=True)
class Access:
    """The resolved way in: never printed whole (the secret is left out of the repr)."""

    endpoint: str | None
    region: str
    key_id: str | None
    secret: str | None
    token: str | None

    def __repr__(self) -> str:
        return f"Access(endpoint={self.endpoint!r}, region={self.region!r}, key_id={self.key_id!r})"


def resolve(spec: StoreSpec, env: Mapping[str, str] | None = None) -> Access:
    """The pair's keys, else the AWS variables, else the AWS files' profile."""
    env = os.environ if env is None else env
    profile, creds_file = _profile(spec, env)
    creds = _ini(creds_file, profile)
    conf = _ini(Path(env.get("AWS_CONFIG_FILE") or Path.home() / ".aws" / "config"),
                profile if profile == "default" else f"profile {profile}")
    key_id = spec.access_key_id or env.get("AWS_ACCESS_KEY_ID") or creds.get("aws_access_key_id")
    secret = spec.secret_access_key or env.get("AWS_SECRET_ACCESS_KEY") or creds.get("aws_secret_access_key")
    token = spec.session_token or (None if spec.access_key_id else env.get("AWS_SESSION_TOKEN") or creds.get("aws_session_token"))
    endpoint = spec.endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or conf.get("endpoint_url")
    region = spec.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or conf.get("region") or "us-east-1"
    return Access(endpoint, region, key_id, secret, token)


def _profile(spec: StoreSpec, env: Mapping[str, str]) -> tuple[str, Path]:
    """The AWS profile and the credentials file it is read from."""
    return (spec.aws_profile or env.get("AWS_PROFILE") or "default",
            Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or Path.home() / ".aws" / "credentials"))


def no_credentials(spec: StoreSpec, env: Mapping[str, str] | None = None) -> str:
    """What to say when no key pair was found anywhere ``resolve`` looks (and the unsigned
    request, for a public bucket, was refused): where it looked, so the user knows where to put one."""
    profile, creds_file = _profile(spec, os.environ if env is None else env)
    return (f"{spec.url}: no credentials found (looked in the pair's access_key_id and secret_access_key, "
            f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and [{profile}] of {creds_file}); "
            "the bucket refused an unsigned request")


def share_access(run_dir: Path, pairs: Sequence[SyncPair]) -> None:
    """The leader, before its node agents start: how it reaches each object store (the
    endpoint, region and keys it resolved) in ``RUN/nodes/store-keys.json``, which only this
    user reads (0600), so the agents reach it alike whatever their environment (``pbsdsh``
    forwards no variable) and no secret goes on their command line. Nothing when no pair is one."""
    from supervisor.config import store_keys_path
    from supervisor.journal import open_own_file

    known = {}
    for p in pairs:
        if p.store is not None:
            a = resolve(p.store)
            known[p.name] = {k: v for k, v in (("endpoint", a.endpoint), ("region", a.region), ("access_key_id", a.key_id),
                                               ("secret_access_key", a.secret), ("session_token", a.token)) if v}
    if not known:
        return
    path = store_keys_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with os.fdopen(open_own_file(tmp, append=False, mode=0o600), "w") as f:
        f.write(json.dumps(known))
    os.replace(tmp, path)


def _ini(path: Path, section: str) -> dict[str, str]:
    parser = configparser.RawConfigParser()
    try:
        parser.read(path)
    except (OSError, configparser.Error):
        return {}
    return dict(parser[section]) if parser.has_section(section) else {}


def _is_http_url(text: str) -> bool:
    from urllib.parse import urlsplit

    try:
        u = urlsplit(text)
        u.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        return False
    return u.scheme in ("http", "https") and bool(u.hostname) and not any(c.isspace() for c in text)


def _seconds(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


class Store:
    """One pair's bucket and prefix. ``key(rel)`` is the object key of a path under the prefix."""

    def __init__(self, spec: StoreSpec, env: Mapping[str, str] | None = None, *, retries: int = RETRIES,
                 timeout: str = REQUEST_TIMEOUT) -> None:
        from obstore.store import S3Store  # the s3 extra: imported only for a store pair

        self.spec = spec
        self.url = spec.url
        self.access = resolve(spec, env)
        self._env = env
        a = self.access
        if a.endpoint is not None and not _is_http_url(a.endpoint):
            # checked here: obstore takes any string, and its signer panics on the first request
            raise StoreError(f"{spec.url}: the endpoint {a.endpoint!r} is not an http(s)://HOST[:PORT] URL", "EINVAL")
        kw: dict[str, Any] = {"region": a.region}
        if a.endpoint:
            kw["endpoint"] = a.endpoint
            kw["virtual_hosted_style_request"] = False
        if a.key_id and a.secret:
            kw["access_key_id"], kw["secret_access_key"] = a.key_id, a.secret
            if a.token:
                kw["session_token"] = a.token
        else:
            kw["skip_signature"] = True  # a public bucket; a private one answers 403 at the probe
        self._store = S3Store(
            spec.bucket,
            client_options={"allow_http": True, "connect_timeout": CONNECT_TIMEOUT, "timeout": timeout},
            retry_config={"max_retries": retries, "retry_timeout": _seconds(RETRY_WITHIN_S),
                          "backoff": {"init_backoff": _seconds(0.2), "max_backoff": _seconds(10.0), "base": 2}},
            **kw)
        self.big = anyio.CapacityLimiter(BIG_AT_ONCE)
        self.small = anyio.CapacityLimiter(SMALL_AT_ONCE)
        self.batches = anyio.CapacityLimiter(BATCHES_HELD)
        self.mid = anyio.CapacityLimiter(MID_AT_ONCE)
        self.pinned: dict[str, int] = {}   # content objects an upload of this process uses: never deleted meanwhile
        self.dropped: dict[str, int] = {}  # content object → the epoch this process deleted it in
        self.epoch = 0
        self.started: datetime.datetime | None = None  # the store's clock at this process's start check (``probe``)

    def key(self, rel: str) -> str:
        return f"{self.spec.prefix}/{rel}" if self.spec.prefix else rel

    def rel(self, key: str) -> str:
        return key[len(self.spec.prefix) + 1:] if self.spec.prefix else key

    # ---- reads --------------------------------------------------------------------

    async def get(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, or None when there is none."""
        import obstore

        try:
            got = await self._call(obstore.get_async(self._store, key), key)
            data = bytes(await self._call(got.bytes_async(), key))
        except StoreError as e:
            if e.code == "ENOENT" and not isinstance(e, Exists):
                return None
            raise
        return data, str(got.meta.get("e_tag") or "")

    async def list(self, rel_prefix: str) -> list[dict[str, Any]]:
        """Every object under ``prefix/rel_prefix`` (``path``, ``size``, ``e_tag``)."""
        import obstore

        out: list[dict[str, Any]] = []
        batches = obstore.list(self._store, prefix=self.key(rel_prefix), chunk_size=1000)
        while (batch := await self._call(_next(batches), self.key(rel_prefix))) is not None:
            out.extend(batch)
        return out

    async def download(self, key: str, dest: Path, sha256: str | None, size: int | None) -> int:
        """Stream ``key`` into ``dest`` (a new file), checking its size and hash; bytes written."""
        import obstore

        h = hashlib.sha256()
        n = 0
        got = await self._call(obstore.get_async(self._store, key), key)
        f = await anyio.to_thread.run_sync(lambda: open(dest, "xb"))
        try:
            chunks = got.stream(min_chunk_size=CHUNK)
            while True:
                chunk = await self._call(_next(chunks), key)
                if chunk is None:
                    break
                data = bytes(chunk)
                await anyio.to_thread.run_sync(_write_hashed, f, h, data)
                n += len(data)
        finally:
            await anyio.to_thread.run_sync(f.close)
        if (size is not None and n != size) or (sha256 is not None and h.hexdigest() != sha256):
            raise StoreError(f"{self.url}: {key} is not what its manifest says ({n} bytes, sha256 {h.hexdigest()[:12]}…)",
                             "EBADMSG")
        return n

    async def head_bytes(self, key: str, n: int) -> bytes:
        """The first ``n`` bytes of an object (fewer when it is shorter)."""
        import obstore

        if n <= 0:
            return b""
        return bytes(await self._call(obstore.get_range_async(self._store, key, start=0, length=n), key))

    async def range_bytes(self, key: str, start: int, end: int) -> bytes:
        import obstore

        return bytes(await self._call(obstore.get_range_async(self._store, key, start=start, end=end), key))

    async def copy(self, src: str, dst: str) -> None:
        """A server-side copy (an object store's way to keep one aside: it has no rename)."""
        import obstore

        await self._call(obstore.copy_async(self._store, src, dst), src)

    async def _call(self, awaitable: Any, key: str) -> Any:
        """Await one obstore call; its failure as a ``StoreError`` (obstore raises its own
        classes and some builtins: a missing key is a ``FileNotFoundError``). In flight on the
        pass's persistent side until it returns (``_stall``)."""
        try:
            with _stall.op(f"s3://{self.spec.bucket}/{key}"):
                return await awaitable
        except Exception as e:  # noqa: BLE001 - every obstore failure, mapped
            raise _mapped(e, self.url, key) from None

    # ---- writes -------------------------------------------------------------------

    async def put_bytes(self, key: str, data: bytes, *, create: bool = False, if_match: str | None = None) -> str:
        """One small object; ``create``: only if absent (``Exists``), ``if_match``: only if its
        ETag is still that (``Changed``). Its new ETag."""
        import obstore

        mode: Any = "create" if create else {"e_tag": if_match} if if_match else "overwrite"
        got = await self._call(obstore.put_async(self._store, key, data, mode=mode, use_multipart=False), key)
        return str(got.get("e_tag") or "")

    async def put_file(self, path: Path, key: str) -> tuple[int, str]:
        """Upload a whole local file, hashing what it reads; (bytes, sha256 hex)."""
        import obstore

        size = (await anyio.to_thread.run_sync(os.stat, path)).st_size
        h = hashlib.sha256()
        if size < CHUNK:
            async with self.mid:
                data = await anyio.to_thread.run_sync(_read_hashed, path, h)
                await self._call(obstore.put_async(self._store, key, data, use_multipart=False), key)
            return len(data), h.hexdigest()
        async with self.big:
            sent = [0]
            await self._call(obstore.put_async(self._store, key, _chunks(path, h, sent, _stall.current()), chunk_size=CHUNK,
                                               max_concurrency=PARTS_AT_ONCE), key)
            return sent[0], h.hexdigest()

    async def put_small_content(self, paths: Sequence[Path], key_of: Callable[[str], str],
                                have: Any) -> Sequence[tuple[int, str, int]]:
        """Small files addressed by content, read and hashed together in one worker-thread
        call; each object ``key_of(sha256)`` pinned (``have.pin``), then put unless ``have`` holds
        it. Each (bytes, sha256 hex, bytes sent), in order."""
        import obstore

        async with self.batches:
            read = await anyio.to_thread.run_sync(_read_all, list(paths))
            out, puts = [], []
            for data, digest in read:
                key = key_of(digest)
                have.pin(key)
                sent = 0 if have.holds(key, len(data)) else len(data)
                out.append((len(data), digest, sent))
                if sent:
                    have.add(key, len(data))
                    puts.append((data, key))

            async def one(data: bytes, key: str) -> None:
                async with self.small:
                    await self._call(obstore.put_async(self._store, key, data, use_multipart=False), key)

            await first_failure([partial(one, data, key) for data, key in puts])
        return out

    async def put_file_content(self, path: Path, key_of: Callable[[str], str], have: Any) -> tuple[int, str, int]:
        """One file under ``CHUNK`` addressed by content: read whole and hashed, its object
        pinned, then put unless ``have`` holds it. (bytes, sha256 hex, bytes sent)."""
        import obstore

        async with self.mid:
            h = hashlib.sha256()
            data = await anyio.to_thread.run_sync(_read_hashed, path, h)
            key = key_of(h.hexdigest())
            have.pin(key)
            if have.holds(key, len(data)):
                return len(data), h.hexdigest(), 0
            have.add(key, len(data))
            await self._call(obstore.put_async(self._store, key, data, use_multipart=False), key)
        return len(data), h.hexdigest(), len(data)

    def pin(self, key: str) -> None:
        self.pinned[key] = self.pinned.get(key, 0) + 1

    def unpin(self, keys: Iterable[str]) -> None:
        for key in keys:
            left = self.pinned.get(key, 0) - 1
            if left > 0:
                self.pinned[key] = left
            else:
                self.pinned.pop(key, None)

    async def drop_objects(self, keys: Sequence[str]) -> Sequence[str]:
        """Delete content objects, less those an upload of this process pins; marked deleted
        first (an upload that lists meanwhile sends them again). The keys deleted."""
        keys = [k for k in keys if not self.pinned.get(k)]
        if not keys:
            return []
        self.epoch += 1
        for k in keys:
            self.dropped[k] = self.epoch
        try:
            await self.delete(keys)
        finally:
            self.epoch += 1
        return keys

    async def put_range(self, path: Path, key: str, start: int, end: int) -> int:
        """Bytes ``[start, end)`` of a local file as one object (a log's segment: what grew
        since its last upload); multipart past ``CHUNK``, as ``put_file``. The bytes sent."""
        import obstore

        if end - start < CHUNK:
            async with self.mid:
                data = await anyio.to_thread.run_sync(_read_range, path, start, end)
                await self._call(obstore.put_async(self._store, key, data, use_multipart=False), key)
            return len(data)
        async with self.big:
            sent = [0]
            await self._call(obstore.put_async(self._store, key, _chunks(path, None, sent, _stall.current(),
                                                                          start=start, end=end),
                                               chunk_size=CHUNK, max_concurrency=PARTS_AT_ONCE), key)
            if sent[0] != end - start:
                raise StoreError(f"{path}: {end - start} bytes from {start} asked, {sent[0]} there (the file shrank)", "EIO")
            return sent[0]

    async def delete(self, keys: Sequence[str]) -> None:
        import obstore

        if not keys:
            return
        try:
            await self._call(obstore.delete_async(self._store, [*keys]), keys[0])
        except StoreError as e:
            if e.code != "ENOENT":
                raise

    # ---- before anything starts -------------------------------------------------------

    def probe(self) -> None:
        """Can this run read and write the prefix? A listing and a small put and delete,
        bounded (seconds); ``StoreError`` in one line otherwise. Blocking: before the start.
        ``started``: the store's clock then (its object's Last-Modified)."""
        import obstore

        key = self.key(f".supervise/probe-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            next(iter(obstore.list(self._store, prefix=self.key(".supervise/"), chunk_size=1)), None)
            obstore.put(self._store, key, b"supervise probe", use_multipart=False)
            self.started = obstore.head(self._store, key)["last_modified"]
            obstore.delete(self._store, key)
        except Exception as e:  # noqa: BLE001
            text = str(e)
            if "TimedOut" in text or "kind: Timeout" in text or "timed out" in text:  # connected, nothing answers (hung)
                raise StoreError(f"{self.url}: the endpoint does not answer", "ETIMEDOUT") from None
            err = _mapped(e, self.url, key)
            if err.code == "EACCES" and not (self.access.key_id and self.access.secret):
                raise StoreError(no_credentials(self.spec, self._env), "EACCES") from None
            raise err from None


async def put_parts(store: Store, path: Path, key_of: Callable[[str], str],
                    have: Any) -> tuple[int, str, int, Sequence[dict[str, Any]], int]:
    """A file of ``CHUNK`` or more as parts of at most ``CHUNK`` bytes, cut where its content's
    structure is (``_cuts``: a safetensors file at its tensors, any other at fixed ``CHUNK``
    offsets), each an object by its own content (one PUT each, ``PARTS_AT_ONCE`` × ``CHUNK``
    bytes in flight: 3 full parts, or as many smaller ones as fit), read and hashed in order,
    the whole file's hash beside: a part whose bytes did not change (a frozen tensor's) is not
    sent again. Each part's key is its bytes' hash by construction (hashed from the very
    bytes put). (bytes, the whole file's sha256 hex, bytes sent, the parts: key, size,
    sha256, parts sent)."""
    import obstore

    whole = hashlib.sha256()
    parts: list[dict[str, Any]] = []
    sent = [0, 0]
    failed: list[Exception] = []
    progress = _stall.current()
    room = anyio.Semaphore(PARTS_AT_ONCE * CHUNK // UNIT)  # in UNITs; taken by this one reader only

    def give(units: int) -> None:
        for _ in range(units):
            room.release()

    async def put(key: str, data: bytes, units: int, scope: anyio.CancelScope) -> None:
        try:
            await store._call(obstore.put_async(store._store, key, data, use_multipart=False), key)
            if progress is not None:
                progress.moved()
        except Exception as e:  # noqa: BLE001 - raised below, the others stopped
            failed.append(e)
            scope.cancel()
        finally:
            give(units)

    async with store.big:
        f, plan = await anyio.to_thread.run_sync(_open_cut, path)
        try:
            async with anyio.create_task_group() as tg:
                for n in plan:
                    units = -(-n // UNIT)
                    for _ in range(units):
                        await room.acquire()
                    data, digest = await anyio.to_thread.run_sync(_read_part, f, whole, n)
                    if progress is not None:
                        progress.moved()  # read and hashed: a frozen file sends nothing, and is not stalled
                    if not data:
                        give(units)
                        break
                    key = key_of(digest)
                    have.pin(key)
                    parts.append({"key": key, "size": len(data), "sha256": digest})
                    if have.holds(key, len(data)):
                        give(units)
                        continue
                    have.add(key, len(data))
                    sent[0] += len(data)
                    sent[1] += 1
                    tg.start_soon(put, key, data, units, tg.cancel_scope)
        finally:
            await anyio.to_thread.run_sync(f.close)
    if failed:
        raise failed[0]
    return sum(p["size"] for p in parts), whole.hexdigest(), sent[0], parts, sent[1]


async def download_parts(store: Store, parts: Sequence[Mapping[str, Any]], dest: Path, sha256: str, size: int) -> int:
    """A file stored as parts into ``dest`` (a new file), fetched a window at a time (``_windows``:
    up to ``PARTS_AT_ONCE`` × ``CHUNK`` bytes) and written in order, checking the whole file's
    size and hash; bytes written."""
    import obstore

    h = hashlib.sha256()
    n = 0
    f = await anyio.to_thread.run_sync(lambda: open(dest, "xb"))

    async def one(key: str) -> bytes:
        got = await store._call(obstore.get_async(store._store, key), key)
        return bytes(await store._call(got.bytes_async(), key))

    try:
        for window in _windows(parts):
            got: list[bytes] = [b""] * len(window)

            async def fetch(j: int) -> None:
                got[j] = await one(str(window[j]["key"]))

            await first_failure([partial(fetch, j) for j in range(len(window))])
            for data in got:
                await anyio.to_thread.run_sync(_write_hashed, f, h, data)
                n += len(data)
    finally:
        await anyio.to_thread.run_sync(f.close)
    if n != size or h.hexdigest() != sha256:
        raise StoreError(f"{store.url}: {dest.name}'s parts are not what its manifest says ({n} bytes, "
                         f"sha256 {h.hexdigest()[:12]}…)", "EBADMSG")
    return n


def _windows(parts: Sequence[Mapping[str, Any]]) -> Iterator[list[Mapping[str, Any]]]:
    """The parts in order, in windows of at most ``PARTS_AT_ONCE`` × ``CHUNK`` bytes (by the
    manifest's sizes) and as many parts as that holds ``UNIT``s (one part at least each): 3
    parts of ``CHUNK``, or more smaller ones (a file cut at its tensors, ``_cuts``)."""
    budget = PARTS_AT_ONCE * CHUNK
    window: list[Mapping[str, Any]] = []
    held = 0
    for p in parts:
        n = int(p.get("size") or 0)
        if window and (held + n > budget or len(window) >= budget // UNIT):
            yield window
            window, held = [], 0
        window.append(p)
        held += n
    if window:
        yield window


async def _next(stream: Any) -> Any:
    """The next item of an obstore async stream, or None at its end."""
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None


def _read_all(paths: Sequence[Path]) -> list[tuple[bytes, str]]:
    out = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        out.append((data, hashlib.sha256(data).hexdigest()))
    return out


def _open_cut(path: Path) -> tuple[Any, Iterator[int]]:
    """A file open to read its parts, and their sizes in order (``_cuts``)."""
    f = open(path, "rb")
    try:
        return f, _cuts.sizes(_cuts.cuts(f, os.fstat(f.fileno()).st_size, CHUNK))
    except BaseException:
        f.close()
        raise


def _read_part(f: Any, whole: Any, n: int) -> tuple[bytes, str]:
    """The next ``n`` bytes of a file, added to its whole hash, and their own sha256 hex."""
    data = f.read(n)
    whole.update(data)
    return data, hashlib.sha256(data).hexdigest()


def _read_hashed(path: Path, h: Any) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    h.update(data)
    return data


def _write_hashed(f: Any, h: Any, data: bytes) -> None:
    h.update(data)
    f.write(data)


async def _chunks(path: Path, h: Any, sent: list[int], progress: _stall.Progress | None, *, start: int = 0,
                  end: int | None = None) -> AsyncIterator[bytes]:
    """A file's bytes (``[start, end)``; all of them by default), CHUNK at a time, read (and
    hashed) in a worker thread. The uploader takes the next one as a part goes out: progress
    (reported to the pass's ``progress`` directly, since obstore runs this outside the pass's
    context)."""
    f = await anyio.to_thread.run_sync(lambda: open(path, "rb"))
    try:
        if start:
            await anyio.to_thread.run_sync(f.seek, start)
        while True:
            want = CHUNK if end is None else min(CHUNK, end - start - sent[0])
            data = await anyio.to_thread.run_sync(_read_chunk, f, h, want) if want > 0 else b""
            if not data:
                return
            sent[0] += len(data)
            if progress is not None:
                progress.moved()
            yield data
    finally:
        await anyio.to_thread.run_sync(f.close)


def _read_range(path: Path, start: int, end: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if len(data) != end - start:
        raise StoreError(f"{path}: {end - start} bytes from {start} asked, {len(data)} there (the file shrank)", "EIO")
    return data


def _read_chunk(f: Any, h: Any, n: int = CHUNK) -> bytes:
    data = f.read(n)
    if h is not None:  # a log's segment is not hashed: nothing reads its digest
        h.update(data)
    return data


def _mapped(e: Exception, url: str, key: str) -> StoreError:
    """obstore's error as one line that names the store and what would help; never a header."""
    from obstore import exceptions as ox

    first = str(e).split("\n", 1)[0]
    text = str(e)
    if isinstance(e, ox.AlreadyExistsError):
        return Exists(f"{url}: {key} exists already", "EEXIST")
    if isinstance(e, ox.PreconditionError):
        return Changed(f"{url}: {key} changed since it was read", "ECHANGED")
    if "NoSuchBucket" in text or (" 404 Not Found" in text and "list request" in text):
        return StoreError(f"{url}: the bucket does not exist (create it, or check the endpoint)", "ENOENT")
    if isinstance(e, (ox.NotFoundError, FileNotFoundError)):
        return StoreError(f"{url}: {key} not found", "ENOENT")
    if isinstance(e, (ox.PermissionDeniedError, PermissionError, ox.UnauthenticatedError)) or "403 Forbidden" in text \
            or "SignatureDoesNotMatch" in text or "InvalidAccessKeyId" in text:
        return StoreError(f"{url}: access denied (check the access key id and secret key, and the bucket's policy)",
                          "EACCES")
    if "error sending request" in text or "Connection refused" in text or "dns error" in text or "timed out" in text:
        where = first.split(" http", 1)[-1].split(" ", 1)[0] if " http" in first else url
        return StoreError(f"{url}: cannot reach the endpoint (http{where})", "ECONNREFUSED")
    return StoreError(f"{url}: {first[:300]}", "S3")
