"""The SeaweedFS server the S3 benches run against (``scripts/s3-up.sh``), and a client of it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def s3_up(where: Path, bucket: str = "bench") -> tuple[dict[str, str], Any]:
    """Start a server with data under ``where`` and one bucket; (an environment with its
    ``AWS_*`` variables, an obstore ``S3Store`` on the bucket). Stopped by ``scripts/s3-down.sh``."""
    from obstore.store import S3Store

    up = subprocess.run(["bash", str(ROOT / "scripts" / "s3-up.sh"), str(where), "--bucket", bucket],
                        capture_output=True, text=True, check=True)
    env = dict(os.environ)
    for word in up.stdout.split():
        if "=" in word and word.startswith("AWS_"):
            k, _, v = word.partition("=")
            env[k] = v
    store = S3Store(bucket, endpoint=env["AWS_ENDPOINT_URL"], access_key_id=env["AWS_ACCESS_KEY_ID"],
                    secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region=env["AWS_REGION"],
                    client_options={"allow_http": True})
    return env, store
