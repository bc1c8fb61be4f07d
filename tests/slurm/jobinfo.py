"""Run inside a batch job: write what supervisor.sched sees (detect_job, end_time) as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import anyio

from supervisor.sched import detect_job


async def main(path: str) -> None:
    job = detect_job(os.environ)
    problems: list[str] = []
    end = await job.sched.end_time(job, report=problems.append)
    with open(path, "w") as f:
        json.dump({"job": dataclasses.asdict(job), "end_time": end, "problems": problems,
                   "requeue_command": job.sched.requeue_command(job)}, f)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
