"""Watch a persistent directory as a reader would: every 50 ms, load every newly visible
checkpoint with its library's loader (checkers.py) and append one JSON line per sighting.

    python tests/frameworks/poller.py CHECKER DIR OUT.jsonl [--interval 0.05] [--also DIR]... [--weights]

A sighting is ``{"t", "name", "where", "ok", "step" | "error"}``, one per version of an entry
(its inode, size, mtime and, for a link, its target): a checkpoint that is swapped for a newer
copy is loaded again. An entry that changed while it was being loaded is looked at again rather
than counted torn: only a version that stays put and does not load is a torn sighting.
``--weights`` adds ``weights``, a digest of the model's weights in it (checkers.weights);
``--also DIR`` watches one more directory the same way (``where`` says which).

DIR may be a bucket, ``s3://BUCKET/PREFIX`` (the store's address and keys from the AWS_*
variables), read as a user reads it: through its manifests, never the bare listing
(docs/sync.md, "Object stores"). Each version of a checkpoint (a manifest's ETag) is downloaded
into ``--scratch`` by the objects its manifest names, each checked against its size and sha256,
then loaded. A version replaced while it was being downloaded is looked at again; a version
whose manifest stays put and whose objects are missing, differ, or do not load is torn. Each
version of a pointer (``.supervise/pointers/``: DeepSpeed's ``latest``, Lightning's
``last.ckpt``) is a sighting of the pointer's name with ``pointer`` true: torn unless its
target's manifest is already there (pointers are published after what they name); a link
pointer is also loaded through, as a link to its target's download.
Runs until SIGTERM; prints ``ready`` on stdout once its imports are done.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import itertools
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkers import CHECKERS, entries, is_entry, weights  # noqa: E402


def version(p: Path) -> tuple | None:
    try:
        st = os.stat(p, follow_symlinks=False)
        key: tuple = (st.st_ino, st.st_size, st.st_mtime_ns)
        if p.is_symlink():
            t = os.stat(p)
            key += (os.readlink(p), t.st_ino, t.st_size, t.st_mtime_ns)
        elif p.is_dir():
            key += tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(p)))
        return key
    except OSError:
        return None


def warm_up(check) -> None:  # noqa: ANN001
    """Pay the loaders' first-call costs now (imports; torch.load's first real load took 2 s
    here), so that the first sighting is not late by seconds."""
    import tempfile

    import torch

    try:
        check(Path("/nonexistent/checkpoint-0"))
    except BaseException:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        pass
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "warm.pt")
        torch.save({"model": torch.nn.Linear(4, 4).state_dict(), "step": 0}, f)
        for weights_only in (True, False):
            torch.load(f, weights_only=weights_only)


class Directory:
    """A directory on the persistent side (or the training's own, for a replay)."""

    def __init__(self, checker: str, root: Path, digest: bool) -> None:
        self.checker, self.root, self.digest = checker, root, digest
        self.seen: dict[str, tuple] = {}

    def look(self) -> list[dict]:
        out = []
        check = CHECKERS[self.checker]
        for p in entries(self.checker, self.root):
            key = version(p)
            if key is None or self.seen.get(p.name) == key:
                continue
            line: dict = {"t": time.time(), "name": p.name, "where": str(self.root)}
            try:
                line.update(ok=True, step=check(p))
                if self.digest:
                    line["weights"] = weights(self.checker, p)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - any failure to load is the finding
                if version(p) != key:
                    continue  # it changed under the load: look again next round
                line.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
            self.seen[p.name] = key
            out.append(line)
        return out


class Changed(Exception):
    """The manifest moved while its version was being read: look again next round."""


class Bucket:
    """A bucket's prefix, read through its manifests (module docstring)."""

    def __init__(self, checker: str, url: str, scratch: Path, digest: bool) -> None:
        from obstore.store import S3Store

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        env = os.environ
        self.store = S3Store(bucket, endpoint=env["AWS_ENDPOINT_URL"], access_key_id=env["AWS_ACCESS_KEY_ID"],
                             secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region=env.get("AWS_REGION", "us-east-1"),
                             client_options={"allow_http": True})
        self.checker, self.url, self.prefix, self.digest = checker, url, prefix.strip("/"), digest
        self.scratch = scratch
        self.seen: dict[str, str] = {}
        self.downloads: dict[str, Path] = {}  # checkpoint name -> its newest download (a link pointer's target)
        self.n = itertools.count()

    def _list(self, sub: str) -> dict[str, str]:
        import obstore

        base = f"{self.prefix}/.supervise/{sub}/"
        return {m["path"][len(base):].removesuffix(".json"): str(m.get("e_tag") or m["last_modified"])
                for batch in obstore.list(self.store, prefix=base) for m in batch}

    def _get(self, key: str) -> tuple[bytes, str] | None:
        import obstore

        try:
            got = obstore.get(self.store, key)
        except FileNotFoundError:
            return None
        return bytes(got.bytes()), str(got.meta.get("e_tag") or "")

    def _file(self, f: dict) -> tuple[bytes, str] | None:
        """A manifest's file: its object, or its parts' objects joined in order (a file of 8 MiB
        or more; parts of any size up to 8 MiB); None when one is missing."""
        if "parts" not in f:
            return self._get(f["key"])
        got = [self._get(p["key"]) for p in f["parts"]]
        return None if any(g is None for g in got) else (b"".join(g[0] for g in got if g is not None), "")

    def _manifest(self, name: str) -> tuple[dict, str] | None:
        got = self._get(f"{self.prefix}/.supervise/manifests/{name}.json")
        return (json.loads(got[0]), got[1]) if got else None

    def _download(self, name: str, doc: dict, tag: str) -> Path:
        """The version's files, as its manifest names them; raises ``Changed`` when the manifest
        moved meanwhile, ``FileNotFoundError``/``ValueError`` when it stays and its objects are wrong."""
        dest = self.scratch / str(next(self.n)) / name
        for rel, f in doc["files"].items():
            got = self._file(f)
            if got is None or len(got[0]) != f["size"] or hashlib.sha256(got[0]).hexdigest() != f["sha256"]:
                now = self._manifest(name)
                if now is None or now[1] != tag:
                    raise Changed
                what = "missing" if got is None else "differs from its manifest"
                raise (FileNotFoundError if got is None else ValueError)(f"{rel or name}: {f.get('key') or 'its parts'} {what}")
            path = dest / rel if rel else dest
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(got[0])
        if doc.get("is_dir"):
            dest.mkdir(parents=True, exist_ok=True)
        return dest

    def look(self) -> list[dict]:
        out = []
        check = CHECKERS[self.checker]
        for name, tag in sorted(self._list("manifests").items()):
            if not is_entry(self.checker, name) or self.seen.get(name) == tag:
                continue
            got = self._manifest(name)
            if got is None or got[1] != tag:
                continue  # replaced since the listing: next round
            doc = got[0]
            line: dict = {"t": time.time(), "name": name, "where": self.url, "version": tag}
            try:
                path = self._download(name, doc, tag)
                line.update(ok=True, step=check(path))
                if self.digest:
                    line["weights"] = weights(self.checker, path)
                self.downloads[name] = path
            except Changed:
                continue
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - any failure to load is the finding
                line.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
            self.seen[name] = tag
            out.append(line)
        for name, tag in sorted(self._list("pointers").items()):
            key = f"pointer:{name}"
            if self.seen.get(key) == tag:
                continue
            got = self._get(f"{self.prefix}/.supervise/pointers/{name}.json")
            if got is None or got[1] != tag:
                continue
            doc = json.loads(got[0])
            line = {"t": time.time(), "name": name, "where": self.url, "version": tag, "pointer": True,
                    "target": doc.get("target")}
            target = self._manifest(str(doc.get("target")))
            if target is None:
                line.update(ok=False, error=f"names {doc.get('target')!r}, which has no manifest")
            elif doc.get("link") and is_entry(self.checker, name):
                # through the link, to the target's download (this round's manifests came first)
                src = self.downloads.get(str(doc["target"]))
                if src is None:
                    continue  # its target's version is not downloaded yet: next round
                # the link as the store keeps it (its bytes: the link's text), beside its target
                link = self.scratch / str(next(self.n)) / name
                link.parent.mkdir(parents=True)
                os.link(src, link.parent / src.name)
                os.symlink(base64.b64decode(doc["content"]).decode(), link)
                try:
                    line.update(ok=True, step=check(link))
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as e:  # noqa: BLE001
                    line.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
            else:
                line.update(ok=True)
            self.seen[key] = tag
            out.append(line)
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checker", choices=sorted(CHECKERS))
    ap.add_argument("dir")
    ap.add_argument("out", type=Path)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--also", action="append", default=[], help="one more directory to watch")
    ap.add_argument("--weights", action="store_true", help="a digest of each sighting's model weights")
    ap.add_argument("--scratch", type=Path, help="where a bucket's versions are downloaded")
    a = ap.parse_args()
    check = CHECKERS[a.checker]
    ready = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sources: list[Directory | Bucket] = []
    for d in [a.dir, *a.also]:
        if d.startswith("s3://"):
            assert a.scratch is not None, "a bucket needs --scratch"
            sources.append(Bucket(a.checker, d, a.scratch, a.weights))
        else:
            sources.append(Directory(a.checker, Path(d), a.weights))
    warm_up(check)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    ready.write("ready\n")
    ready.close()
    with open(a.out, "a") as out:
        while not stop:
            for source in sources:
                for line in source.look():
                    out.write(json.dumps(line) + "\n")
                    out.flush()
            time.sleep(a.interval)


if __name__ == "__main__":
    main()
