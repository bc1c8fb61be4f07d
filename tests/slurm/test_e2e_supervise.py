"""supervise end to end under a real Slurm 22.05 (the local cluster of ``scripts/slurm-up.sh``).

Every job here is an sbatch script that ``exec``s ``supervise`` around the stand-in training
``tests/helpers/trainer.py`` (it checkpoints into ``step_N/`` with ``.metadata`` last and a
``latest`` pointer, resumes, and prints ``resumed N`` / ``checkpoint N`` / ``stopped N``).
The node-local side of the checkpoint pair is a fresh ``local-<SLURM_RESTART_COUNT>``
directory per attempt, so a resumed step can only have come from ``restore``; the run
directory and the persistent side are shared by every attempt, as on a real cluster.

Cases: the time limit approaching (``--time-limit`` inside the job; a real ``#SBATCH --time``
in the ``slow`` ones, with and without ``--signal=B:…@N``), ``scancel --signal=USR1 --batch``
(checkpoint now, the run goes on), plain ``scancel`` (reason cancelled, no second TERM),
requeue until ``--max-requeues`` is spent (each attempt restores and resumes at the last
durable step), and a crash (not requeued). What each case measured (warning → checkpoint
durable, margin before SIGKILL) is printed and, with ``$SUPERVISE_SLURM_BENCH`` set, appended
to that file as JSON lines (``bench/slurm_stop.py`` runs this file and prints the table).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.runs import RunJournal, first_publish_after
from tests.support.slurm import ACTIVE, SLURM_POLL, Slurm
from tests.support.wait import wait_for
from tests.support.webhook import Server
from supervisor.launchers import catches

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
TRAINER = REPO / "tests" / "helpers" / "trainer.py"
RECORDER = REPO / "tests" / "helpers" / "recorder.py"
OUTPUT_LINE = re.compile(r"^(resumed|checkpoint|stopped|done|crash) (\d+)$")
ATTEMPT_LINE = re.compile(r"^job-script attempt=(\d+) ")


# ----------------------------------------------------------------------------- one job

@dataclass
class Job(RunJournal):
    """One sbatch job running supervise, and what it left behind."""

    slurm: Slurm
    d: Path
    jobid: str = ""
    final_state: str | None = None
    marks: dict[str, float] = field(default_factory=dict)  # test-side wall-clock times

    @property
    def run(self) -> Path:
        return self.d / "run"

    @property
    def persist(self) -> Path:
        return self.d / "persist"

    @property
    def out(self) -> Path:
        return self.d / "out.txt"

    def local(self, restart_count: int) -> Path:
        return self.d / f"local-{restart_count}"

    def output(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def tail(self, n: int = 40) -> str:
        return "job output (tail):\n" + "\n".join(self.output().splitlines()[-n:])

    def trainer(self, what: str) -> dict[int, list[int]]:
        """The trainer's ``what N`` lines per attempt (keyed by SLURM_RESTART_COUNT)."""
        seen: dict[int, list[int]] = {}
        attempt = -1
        for line in self.output().splitlines():
            if m := ATTEMPT_LINE.match(line):
                attempt = int(m.group(1))
                seen.setdefault(attempt, [])
            elif (m := OUTPUT_LINE.match(line)) and m.group(1) == what:
                seen.setdefault(attempt, []).append(int(m.group(2)))
        return seen

    def wait_event(self, kind: str, timeout: float = 60, **match: object) -> dict:
        def found() -> dict | None:
            for e in self.events(kind):
                if all(e.get(k) == v for k, v in match.items()):
                    return e
            return None
        return wait_for(found, timeout, lambda: f"a {kind} event {match} in {self.run}\n{self.tail()}", interval=SLURM_POLL)

    def wait_running_trainer(self, timeout: float = 90) -> int:
        """Until the training runs and catches USR1 (supervisor.training's handler): its pid."""
        spawn = self.wait_event("spawn", timeout)
        wait_for(lambda: catches(spawn["pid"], signal.SIGUSR1), 30,
                 lambda: f"the trainer's USR1 handler (pid {spawn['pid']})\n{self.tail()}", interval=SLURM_POLL)
        return spawn["pid"]

    def finish(self, timeout: float = 180) -> str:
        """Until the controller reports a final state (MinJobAge=300 keeps the job visible).

        Only ``scontrol``: sacct -c also has rows of earlier, requeued attempts."""
        def final() -> str | None:
            state = self.slurm.show(self.jobid).get("JobState")
            return state if state and state not in ACTIVE else None
        self.final_state = wait_for(
            final, timeout, lambda: f"job {self.jobid} still {self.slurm.show(self.jobid).get('JobState')}\n{self.tail()}",
            interval=SLURM_POLL)
        return self.final_state


def job_script(d: Path, name: str, *, supervise: list[str], command: list[str] | None = None,
               trainer: list[str] = (), sbatch: list[str] = ()) -> Path:
    """An sbatch script that execs supervise around the trainer (or ``command``).

    Per attempt (``A`` = SLURM_RESTART_COUNT, 0 on the first run) the checkpoint pair goes
    from a fresh ``d/local-A`` to the shared ``d/persist``, with ``restore = true``.
    """
    head = "".join(f"#SBATCH {a}\n" for a in (f"--job-name=e2e-{name}", f"--output={d}/out.txt",
                                                "--open-mode=append", *sbatch))
    if command is None:
        command = [PY, str(TRAINER), f"{d}/local-$A", *trainer]
    argv = " ".join(f'"{a}"' if "$" in a else _q(a) for a in command)
    script = f"""#!/bin/bash
{head}A=${{SLURM_RESTART_COUNT:-0}}
for v in ${{!SUPERVISE_@}}; do unset "$v"; done
mkdir -p {_q(str(d))}/attempt-$A
cat > {_q(str(d))}/attempt-$A/supervise.toml <<EOF
[[sync]]
name = "ckpt"
from = "{d}/local-$A"
to = "{d}/persist"
restore = true
EOF
echo "job-script attempt=$A restart_count=${{SLURM_RESTART_COUNT:-unset}} t=$(date +%s.%N) pid=$$"
cd {_q(str(REPO))}
export PYTHONPATH={_q(str(REPO))}
exec {_q(PY)} -m supervisor --config {_q(str(d))}/attempt-$A/supervise.toml --run-dir {_q(str(d))}/run \\
    --gpu-every 0 --sync-every 1m {' '.join(_q(a) for a in supervise)} -- {argv}
"""
    path = d / "job.sh"
    path.write_text(script)
    return path


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'" if re.search(r"[^\w@%+=:,./-]", s) else s


def submit(slurm: Slurm, d: Path, name: str, **kw) -> Job:
    d.mkdir(parents=True, exist_ok=True)
    job = Job(slurm, d)
    job.marks["submitted"] = time.time()
    job.jobid = slurm.submit(job_script(d, name, **kw), cwd=d)
    return job


# ----------------------------------------------------------------------------- checks and figures

def complete_checkpoints(persist: Path) -> list[int]:
    """Steps on the persistent side, each checked whole; ``latest`` names a complete one."""
    steps = []
    for c in sorted(persist.glob("step_*")):
        names = sorted(p.name for p in c.iterdir())
        assert names == [".metadata", "shard_0.bin", "shard_1.bin"], f"{c} is not complete: {names}"
        step = int(c.name.split("_")[1])
        assert (c / ".metadata").read_text() == str(step)
        for shard in ("shard_0.bin", "shard_1.bin"):
            data = (c / shard).read_bytes()
            assert len(data) == 4096 and data == step.to_bytes(8, "little") * 512, f"{c}/{shard} torn"
        steps.append(step)
    leftovers = [p.name for p in persist.iterdir() if p.name.startswith(".supervise-")] if persist.exists() else []
    assert leftovers == [], f"staging left on the persistent side: {leftovers}"
    if steps:
        latest = (persist / "latest").read_text()
        assert latest == f"step_{max(steps):06d}", f"latest names {latest}, newest complete is {max(steps)}"
    return steps


def record(case: str, **figures: object) -> None:
    """Print one case's figures; append them to $SUPERVISE_SLURM_BENCH when set."""
    row = {"case": case, **{k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}}
    print(f"\nbench {json.dumps(row)}")
    path = os.environ.get("SUPERVISE_SLURM_BENCH")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


# ----------------------------------------------------------------------------- the time limit (--time-limit)

@pytest.fixture(scope="module")
def deadline_job(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> Job:
    job = submit(slurm, tmp_path_factory.mktemp("deadline"), "deadline",
                 supervise=["--time-limit", "8s", "--warn-before", "4s", "--grace", "5s"],
                 trainer=["--write-time", "0.5"], sbatch=["--time=5"])
    job.finish(timeout=120)
    return job


def test_deadline_checkpoint_is_durable_before_the_child_is_stopped(deadline_job: Job) -> None:
    job = deadline_job
    # exit 75: stopped at the time limit, not requeued, the training unfinished (afterok must not fire)
    assert job.final_state == "FAILED", job.tail()
    warning = job.one("warning")
    stop = job.one("stop")
    assert stop["reason"] == "deadline" and stop["signal"] is None, stop
    assert [e["step"] for e in job.events("stop-step")] == ["checkpoint", "flush", "stop-child", "final-flush", "requeue"]
    ck = job.step("checkpoint")
    assert ck["outcome"] == "published" and ck["published"] >= 1, ck
    durable = first_publish_after(job, warning["t"])
    stop_child = job.step("stop-child")
    assert durable is not None and durable["t"] < stop_child["t"] - stop_child["seconds"], \
        "the checkpoint asked for at the warning must be on persistent storage before the child is stopped"
    end = job.one("end")
    assert end["reason"] == "deadline" and end["exit_status"] == 75 and end["not_durable"] == [], end
    saved = job.trainer("checkpoint")[0]
    assert saved, job.tail()
    steps = complete_checkpoints(job.persist)
    assert max(steps) == max(saved), "the last checkpoint the training wrote is the newest durable one"
    deadline = job.one("deadline")
    assert deadline["source"] == "time-limit"
    margin = deadline["end"] - end["t"]
    assert margin > 0, f"supervise ended {-margin:.3f}s after the job's end"
    record("deadline (--time-limit 8s, --warn-before 4s)", warn_to_durable_s=durable["t"] - warning["t"],
           margin_before_end_s=margin, margin_before_sigkill_s=None, reason=end["reason"])


# ----------------------------------------------------------------------------- scancel: USR1 --batch, then plain

@pytest.fixture(scope="module")
def scancel_job(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> Job:
    """``scancel --signal=USR1 --batch`` (checkpoint now), then a plain ``scancel``."""
    job = submit(slurm, tmp_path_factory.mktemp("scancel"), "scancel",
                 supervise=["--warn-before", "1m", "--grace", "10s"], trainer=[], sbatch=["--time=10"])
    job.wait_running_trainer()
    job.wait_event("sync")  # the mirror's first pass: the watcher is up
    # Twice: the second checkpoint is at a later step, so the training went on after the first.
    for n in (1, 2):
        job.marks[f"usr1_{n}"] = time.time()
        slurm.cancel(job.jobid, "--signal=USR1", "--batch")
        request = wait_for(lambda: len(job.events("checkpoint-request")) >= n and job.events("checkpoint-request")[n - 1],
                           30, lambda: f"checkpoint request {n}\n{job.tail()}", interval=SLURM_POLL)
        wait_for(lambda: first_publish_after(job, request["t"]), 30,
                 lambda: f"the requested checkpoint {n} on persistent storage\n{job.tail()}", interval=SLURM_POLL)
        job.marks[f"state_after_usr1_{n}"] = slurm.state(job.jobid)  # type: ignore[assignment]
    job.marks["stops_after_usr1"] = len(job.events("stop"))
    job.marks["cancel"] = time.time()
    slurm.cancel(job.jobid)
    job.finish(timeout=120)
    return job


def test_scancel_usr1_batch_checkpoints_and_the_run_goes_on(scancel_job: Job) -> None:
    job = scancel_job
    assert job.marks["state_after_usr1_1"] == job.marks["state_after_usr1_2"] == "RUNNING"
    assert job.marks["stops_after_usr1"] == 0, "USR1 is 'checkpoint now', not a stop"
    requests = job.events("checkpoint-request")[:2]
    saved = job.trainer("checkpoint")[0]  # --every 0: only requested checkpoints
    assert len(saved) >= 2 and saved[1] > saved[0], f"the training went on between the two requests: {saved}"
    for n, request in enumerate(requests, 1):
        assert request["signal"] == "SIGUSR1" and request["why"] == "received SIGUSR1", request
        assert request["to"], "the trainer catches USR1, so it was signalled"
        assert request["t"] >= job.marks[f"usr1_{n}"]
        durable = first_publish_after(job, request["t"])
        assert durable is not None and durable["t"] < job.marks["cancel"]
        assert durable["checkpoint"] == f"step_{saved[n - 1]:06d}", durable
        record(f"scancel --signal=USR1 --batch (request {n})", warn_to_durable_s=durable["t"] - request["t"],
               request_latency_ms=request.get("latency_ms"), run_goes_on=True)


def test_plain_scancel_is_cancelled_and_the_stop_checkpoint_is_durable(scancel_job: Job) -> None:
    job = scancel_job
    assert job.final_state == "CANCELLED", job.tail()
    sig = job.one("signal", signal="SIGTERM", action="stop")
    assert sig["t"] >= job.marks["cancel"]
    stop_child = job.step("stop-child")
    assert "already_signalled" in stop_child and stop_child["sent_to"] == [], stop_child
    stopped = job.trainer("stopped")[0]
    assert len(stopped) == 1, job.tail()
    steps = complete_checkpoints(job.persist)
    assert max(steps) == stopped[0], "the checkpoint written on Slurm's TERM reached persistent storage"
    durable = first_publish_after(job, sig["t"])
    end = job.one("end")
    margin = sig["t"] + job.slurm.kill_wait - end["t"]
    reason = job.one("reason")
    record("plain scancel", warn_to_durable_s=durable["t"] - sig["t"] if durable else None,
           margin_before_sigkill_s=margin, job_state_seen=reason["state"], reason=end["reason"])
    assert margin > 0, "supervise must be done before KillWait's SIGKILL"
    assert end["not_durable"] == [] and end["exit_status"] == 75, end  # cancelled: the training is unfinished


def test_plain_scancel_reason_is_cancelled(scancel_job: Job) -> None:
    reason = scancel_job.one("reason")
    assert reason["state"] in ("CANCELLED", "COMPLETING"), reason  # what the controller says during KillWait
    end = scancel_job.one("end")
    assert end["reason"] == "cancelled", f"JobState at refine time was {reason['state']!r}: {end}"


def stubborn_job(slurm: Slurm, d: Path, *supervise: str) -> Job:
    """Plain scancel of a training that ignores TERM (the recorder logs every signal)."""
    job = submit(slurm, d, "stubborn", supervise=["--warn-before", "1m", "--grace", "2s", *supervise],
                 sbatch=["--time=10"], command=[PY, str(RECORDER), str(d / "signals.log"), "--on-term", "ignore"])
    job.wait_event("spawn")
    wait_for(lambda: "ready" in (d / "signals.log").read_text() if (d / "signals.log").exists() else False,
             30, "the recorder's handlers", interval=SLURM_POLL)
    job.marks["cancel"] = time.time()
    slurm.cancel(job.jobid)
    job.finish(timeout=120)
    return job


@pytest.fixture(scope="module")
def scancel_stubborn(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> Job:
    # --checkpoint-timeout 1s: the checkpoint step gives up long before KillWait (5 s here).
    return stubborn_job(slurm, tmp_path_factory.mktemp("stubborn"), "--checkpoint-timeout", "1s")


def test_plain_scancel_sends_no_second_term(scancel_stubborn: Job) -> None:
    job = scancel_stubborn
    lines = (job.d / "signals.log").read_text().splitlines()
    terms = [ln for ln in lines if ln.startswith("SIGTERM ")]
    assert len(terms) == 1, f"the training got SIGTERM {len(terms)} times: {lines}"
    stop_child = job.step("stop-child")
    assert "already_signalled" in stop_child and stop_child["sent_to"] == [], stop_child
    # Not stop_child["killed"]: it lists only pids signalled one by one after killpg, often none.
    assert stop_child["graceful"] is False, "it ignored TERM: SIGKILL after the grace"
    assert job.step("checkpoint")["outcome"] == "timeout"
    end = job.one("end")
    sig = job.one("signal", signal="SIGTERM", action="stop")
    margin = sig["t"] + job.slurm.kill_wait - end["t"]
    assert margin > 0, "supervise (grace 2s) is done before KillWait's SIGKILL"
    assert end["exit_status"] == 128 + signal.SIGKILL, end
    assert job.final_state == "CANCELLED"
    record("plain scancel, training ignores TERM (--checkpoint-timeout 1s, --grace 2s)",
           margin_before_sigkill_s=margin, job_state_seen=job.one("reason")["state"], reason=end["reason"])


def test_plain_scancel_stop_steps_fit_in_killwait(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> None:
    job = stubborn_job(slurm, tmp_path_factory.mktemp("stubborn-default"))  # default --checkpoint-timeout 10m
    kinds = [e["kind"] for e in job.events()]
    assert "stop" in kinds, job.tail()
    assert kinds[-1] == "end", f"the journal ends with {kinds[-3:]}: SIGKILLed KillWait after the TERM\n{job.tail()}"
    assert job.one("end")["exit_status"] == 128 + signal.SIGKILL, "supervise itself killed the training"


# ----------------------------------------------------------------------------- requeue and --max-requeues

MAX_REQUEUES = 2


@pytest.fixture(scope="module")
def hooks() -> Iterator[Server]:
    """A webhook on 127.0.0.1 for the jobs (they run on this machine)."""
    server = Server()
    yield server
    server.close()


@pytest.fixture(scope="module")
def requeue_job(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory, hooks: Server) -> Job:
    """Deadline → requeue, MAX_REQUEUES times; the attempt after that is refused a requeue."""
    job = submit(slurm, tmp_path_factory.mktemp("requeue"), "requeue",
                 supervise=["--time-limit", "6s", "--warn-before", "3s", "--grace", "5s",
                            "--requeue", "--max-requeues", str(MAX_REQUEUES), "--notify", hooks.url("json")],
                 trainer=["--every", "20", "--write-time", "0.3"], sbatch=["--time=5", "--requeue"])
    for attempt in range(1, MAX_REQUEUES + 1):
        # Not "end": see test_a_requeued_attempt_journals_its_end.
        job.wait_event("stop-step", 90, attempt=attempt, step="requeue")
        job.marks[f"pending{attempt}"] = slurm.wait_state(job.jobid, "PENDING", timeout=60)  # type: ignore[assignment]
        slurm.release(job.jobid)
    job.wait_event("end", 90, attempt=MAX_REQUEUES + 1)
    job.finish(timeout=120)
    return job


def test_requeue_after_the_deadline_until_max_requeues(requeue_job: Job) -> None:
    job = requeue_job
    assert job.final_state == "FAILED", job.tail()  # the last attempt, refused a requeue, exits 75
    attempts = MAX_REQUEUES + 1
    starts = job.events("start")
    assert [s["attempt"] for s in starts] == list(range(1, attempts + 1))
    assert [s["restart_count"] for s in starts] == list(range(attempts)), "SLURM_RESTART_COUNT 0 (unset), 1, 2"
    assert all(s["job_id"] == job.jobid for s in starts)
    for a in range(1, attempts + 1):
        stop = job.one("stop", a)
        assert stop["reason"] == "deadline", stop
        steps = [e["step"] for e in job.events("stop-step", a)]
        assert steps == ["checkpoint", "flush", "stop-child", "final-flush", "requeue"], steps
        assert job.step("checkpoint", a)["outcome"] == "published"
        assert job.step("final-flush", a)["pending"] == []
        rq = job.step("requeue", a)
        if a <= MAX_REQUEUES:
            assert rq["requeued"] is True and rq["restart_count"] == a - 1, rq
            assert job.marks[f"pending{a}"] == "PENDING"
        else:
            assert rq["requeued"] is False, rq
            refused = job.one("requeue-refused", a)
            assert refused["restart_count"] == MAX_REQUEUES and refused["max_requeues"] == MAX_REQUEUES
            end = job.one("end", a)
            assert end["reason"] == "deadline" and end["exit_status"] == 75 and end["not_durable"] == [], end
    assert job.slurm.show(job.jobid).get("Restarts") == str(MAX_REQUEUES)


def test_each_attempt_tells_of_the_warning_the_preemption_and_the_requeue(requeue_job: Job, hooks: Server) -> None:
    from collections import Counter

    sent = Counter(json.loads(h["body"])["event"] for h in hooks.hits("json"))
    attempts = MAX_REQUEUES + 1
    assert sent == {"start": attempts, "warning": attempts, "preempted": attempts, "requeued": MAX_REQUEUES}, sent


def test_each_attempt_restores_the_last_durable_checkpoint_and_resumes_there(requeue_job: Job) -> None:
    job = requeue_job
    saved = job.trainer("checkpoint")
    resumed = job.trainer("resumed")
    for a in range(1, MAX_REQUEUES + 2):
        restore = job.one("restore", a)
        if a == 1:
            assert restore["checkpoint"] is None and resumed.get(0, []) == [], (restore, resumed)
            continue
        last = max(saved[a - 2])  # what the previous attempt wrote last (keyed by restart count)
        assert restore["checkpoint"] == f"step_{last:06d}", (restore, saved)
        assert Path(restore["to"]).parent == job.local(a - 1), "restored into this attempt's fresh local dir"
        assert resumed[a - 1] == [last], f"attempt {a} resumed at {resumed.get(a - 1)}, last durable {last}"
        spawn = job.one("spawn", a)
        assert restore["t"] < spawn["t"]
    steps = complete_checkpoints(job.persist)
    assert max(steps) == max(saved[MAX_REQUEUES])
    for a in range(1, MAX_REQUEUES + 2):
        warning = job.one("warning", a)
        durable = first_publish_after(job, warning["t"], a)
        last = job.events(attempt=a)[-1]  # "end", when the requeue's TERM let supervise write it
        deadline = job.one("deadline", a)
        record(f"requeue, attempt {a} (--time-limit 6s, --warn-before 3s)",
               warn_to_durable_s=durable["t"] - warning["t"] if durable else None,
               margin_before_end_s=deadline["end"] - last["t"],
               requeued=job.step("requeue", a).get("requeued"), resumed_at=(resumed.get(a - 1) or [None])[0])


def test_a_requeued_attempt_journals_its_end(requeue_job: Job) -> None:
    """docs/journal.md: `end` is the last line of every attempt, requeued ones included."""
    for a in range(1, MAX_REQUEUES + 1):
        kinds = [e["kind"] for e in requeue_job.events(attempt=a)]
        assert kinds[-1] == "end", f"attempt {a} ends with {kinds[-3:]}\n{requeue_job.tail(60)}"
        assert requeue_job.one("end", a)["reason"] == "deadline"


# ----------------------------------------------------------------------------- a crash

@pytest.fixture(scope="module")
def crash_job(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> Job:
    job = submit(slurm, tmp_path_factory.mktemp("crash"), "crash",
                 supervise=["--time-limit", "1m", "--warn-before", "10s", "--requeue", "--max-requeues", "3"],
                 trainer=["--every", "10", "--fail-at", "25"], sbatch=["--time=5", "--requeue"])
    job.finish(timeout=120)
    return job


def test_a_crash_is_not_requeued(crash_job: Job) -> None:
    job = crash_job
    assert job.final_state == "FAILED", job.tail()
    assert job.slurm.show(job.jobid).get("Restarts") == "0"
    assert job.slurm.sacct(job.jobid).get("ExitCode") == "3:0"
    end = job.one("end")
    assert end["reason"] == "child-failed" and end["exit_status"] == 3, end
    assert job.step("requeue")["skipped"] == "not after child-failed"
    assert job.step("checkpoint")["skipped"].startswith("not wanted")
    assert [s["attempt"] for s in job.events("start")] == [1]
    assert job.trainer("crash")[0] == [25]
    assert complete_checkpoints(job.persist) == [10, 20], "the periodic checkpoints before the crash are durable"


# ----------------------------------------------------------------------------- a real #SBATCH --time (slow)

SIGNAL_AT = 30  # --signal=B:…@30: Slurm sends it between 30 and 90 s before the end (docs/slurm.md)


@pytest.fixture(scope="module")
def real_time_jobs(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    """Three jobs with a real time limit, submitted together (two run at once on 2 CPUs):

    * ``watch``: ``--time=1``, no ``--signal``: supervise's own deadline watch, end from squeue;
    * ``usr2``: ``--time=2 --signal=B:USR2@30``: the warn signal comes before supervise's own
      warning (``--warn-before 10s``);
    * ``usr1``: the same with ``B:USR1`` and ``--warn-signal USR1``.
    """
    jobs = {
        "watch": submit(slurm, tmp_path_factory.mktemp("time-watch"), "time-watch",
                        supervise=["--warn-before", "20s", "--grace", "5s"],
                        trainer=["--write-time", "0.5"], sbatch=["--time=1"]),
        "usr2": submit(slurm, tmp_path_factory.mktemp("time-usr2"), "time-usr2",
                       supervise=["--warn-before", "10s", "--grace", "5s"],
                       trainer=["--write-time", "0.5"], sbatch=["--time=2", f"--signal=B:USR2@{SIGNAL_AT}"]),
        "usr1": submit(slurm, tmp_path_factory.mktemp("time-usr1"), "time-usr1",
                       supervise=["--warn-before", "10s", "--grace", "5s", "--warn-signal", "USR1"],
                       trainer=["--write-time", "0.5"], sbatch=["--time=2", f"--signal=B:USR1@{SIGNAL_AT}"]),
    }
    for job in jobs.values():
        job.wait_event("deadline", 240)
        job.marks["end_time"] = slurm.show(job.jobid)["EndTime"]  # type: ignore[assignment]
    for job in jobs.values():
        job.finish(timeout=300)
    return jobs


def _check_real_limit(job: Job) -> tuple[dict, dict, dict]:
    """What every real-limit case shares: the end from Slurm, a durable checkpoint before the
    stop, supervise done before the end. Returns (deadline, end, the first publish)."""
    from supervisor.sched._slurm_output import parse_slurm_time

    # FAILED (exit 75: stopped, not requeued), not TIMEOUT: supervise stopped before Slurm's limit
    assert job.final_state == "FAILED", f"supervise stopped before Slurm's limit\n{job.tail()}"
    deadline = job.one("deadline")
    assert deadline["source"] == "scheduler" and deadline["end"] == parse_slurm_time(job.marks["end_time"]), \
        (deadline, job.marks["end_time"])
    stop = job.one("stop")
    assert stop["reason"] == "deadline", stop
    ck = job.step("checkpoint")
    assert ck["outcome"] == "published", ck
    durable = first_publish_after(job, stop["t"])
    stop_child = job.step("stop-child")
    assert durable is not None and durable["t"] < stop_child["t"] - stop_child["seconds"]
    end = job.one("end")
    assert end["reason"] == "deadline" and end["exit_status"] == 75 and end["not_durable"] == [], end
    assert end["t"] < deadline["end"], "done before the time limit, so before its TERM and SIGKILL"
    saved = job.trainer("checkpoint")[0]
    assert max(complete_checkpoints(job.persist)) == max(saved)
    return deadline, end, durable


@pytest.mark.slow
def test_real_time_limit_supervise_warns_from_squeue_end(real_time_jobs: dict[str, Job]) -> None:
    job = real_time_jobs["watch"]
    deadline, end, durable = _check_real_limit(job)
    warning = job.one("warning")
    assert warning["source"] == "scheduler" and 18 <= warning["left_s"] <= 20.5, warning
    assert job.one("stop")["signal"] is None
    record("real --time=1, supervise's watch (--warn-before 20s)", warn_to_durable_s=durable["t"] - warning["t"],
           margin_before_end_s=deadline["end"] - end["t"],
           margin_before_sigkill_s=deadline["end"] + job.slurm.kill_wait - end["t"], reason=end["reason"])


@pytest.mark.slow
@pytest.mark.parametrize("name, sig", [("usr2", "SIGUSR2"), ("usr1", "SIGUSR1")])
def test_real_time_limit_signal_b_at_n(real_time_jobs: dict[str, Job], name: str, sig: str) -> None:
    job = real_time_jobs[name]
    deadline, end, durable = _check_real_limit(job)
    # Far from the end (60 s, the lead 10 s) the warning signal is deferred to end - lead
    # (policy.signal_action): the allocation is used, then the stop comes as a deadline.
    received = job.one("signal", signal=sig, action="deferred")
    stop = job.one("stop")
    assert stop["reason"] == "deadline", stop
    assert abs(stop["t"] - received["stop_at"]) < 5, (stop, received)
    lead = deadline["end"] - received["t"]
    assert SIGNAL_AT <= lead <= SIGNAL_AT + 65, f"--signal=B:{sig[3:]}@{SIGNAL_AT} arrived {lead:.1f}s before the end"
    record(f"real --time=2, --signal=B:{sig[3:]}@{SIGNAL_AT}", warn_to_durable_s=durable["t"] - received["t"],
           signal_lead_s=lead, margin_before_end_s=deadline["end"] - end["t"],
           margin_before_sigkill_s=deadline["end"] + job.slurm.kill_wait - end["t"], reason=end["reason"])
