"""A Mirror in its own process, for the SIGKILL test: ``python -m tests.sync._runner SRC DST BACKEND``."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from supervisor.config import SyncPair
from supervisor.sync import Mirror


def main() -> None:
    src, dst, backend = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    mirror = Mirror([SyncPair("ckpt", "checkpoint", src, dst)], emit=lambda kind, durable=False, **f: f,
                    sync_every=3600, backend=backend)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            print("ready", flush=True)

    anyio.run(run)


if __name__ == "__main__":
    main()
