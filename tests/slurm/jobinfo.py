"""Run inside a batch job: write what supervisor.job sees (detect_job, end_time) as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import anyio

from supervisor.job import detect_job, end_time, requeue_command


async def main(path: str) -> None:
    job = detect_job(os.environ)
    problems: list[str] = []
    end = await end_time(job, report=problems.append)
    with open(path, "w") as f:
        json.dump({"job": dataclasses.asdict(job), "end_time": end, "problems": problems,
                   "requeue_command": requeue_command(job)}, f)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
