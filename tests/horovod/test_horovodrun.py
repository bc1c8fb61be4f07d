"""`supervise -- horovodrun -np 2 …` end to end, with the real Horovod (Gloo and MPI controllers).

The headline command of this project, for real: the real `supervise` CLI with the Ibex preset
(configs/ibex.toml, as scripts/slurm-horovodrun.sbatch uses it) around a real
`horovodrun -np 2 -H localhost:2 --gloo|--mpi` running tests/ranks/signal_rank.py (every rank
records each request it sees) or examples/hvd_train.py (a horovod.torch training). Checked:
a checkpoint request reaches every rank; a deadline stop and a preemption each take a
checkpoint, make it durable and stop the whole tree with no process left; the exit statuses of
docs/launchers.md; a second attempt restores the checkpoint and ends with the weights of an
uninterrupted run.

No process left: every process of a run carries a marker in its environment (horovodrun passes
its environment to the ranks, mpirun to its local ranks), and after `supervise` exits none
that carries it may be alive; while the run is going, the same scan must find the launcher,
its helpers and both ranks, which shows it would see them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from supervisor.launchers import catches
from tests.support.horovod import HOROVODRUN
from tests.support.supervise import supervise_argv
from tests.support.wait import wait_for

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
TRAIN = REPO / "examples" / "hvd_train.py"
SIGNAL_RANK = REPO / "tests" / "ranks" / "signal_rank.py"
IBEX = REPO / "configs" / "ibex.toml"
DIGEST = re.compile(r"final weights sha256 ([0-9a-f]{64})")
STEPS = 60
GRACE = "10s"


def hvd(mode: str, *command: str) -> list[str]:
    return [str(HOROVODRUN), "-np", "2", "-H", "localhost:2", f"--{mode}", PY, *command]


def training(local: Path, *args: str) -> list[str]:
    """examples/hvd_train.py with the seed's directory arguments (the Ibex preset's layout)."""
    return [str(TRAIN), "--write-checkpoints-to", str(local / "checkpoints"),
            "--tensorboard-logging-dir", str(local / "tensorboard"), "--ckpt-every", "10", *args]


def marked(marker: bytes) -> set[int]:
    """Live processes whose environment carries ``marker``."""
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if marker not in f.read():
                    continue
            with open(f"/proc/{entry.name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.add(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class Run:
    """One test's directories (local, persistent, run) and its `supervise` processes."""

    def __init__(self, root: Path, local: str = "local") -> None:
        self.root = root
        self.local = root / local
        self.persistent = root / "persistent"
        self.run_dir = root / "run"
        self.marker = f"HVD_TEST_RUN={uuid.uuid4().hex}"
        self.proc: subprocess.Popen[str] | None = None
        self.out = root / f"{local}.out"
        self.err = root / f"{local}.err"

    def start(self, command: list[str], *flags: str) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_"))}
        env.update(LOCAL_DIR=str(self.local), PERSISTENT_DIR=str(self.persistent), OMP_NUM_THREADS="1",
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        key, _, value = self.marker.partition("=")
        env[key] = value
        argv = supervise_argv("--config", str(IBEX), "--run-dir", str(self.run_dir), "--grace", GRACE,
                              "--gpu-every", "0", *flags, "--", *command)
        self.proc = subprocess.Popen(argv, env=env, cwd=self.root, stdout=open(self.out, "w"),
                                     stderr=open(self.err, "w"), stdin=subprocess.DEVNULL, text=True)
        return self.proc

    def tree(self) -> set[int]:
        return marked(self.marker.encode())

    def wait(self, timeout: float = 90) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"supervise did not finish in {timeout}s\n{self.logs()}") from None

    def logs(self) -> str:
        return f"--- stdout\n{self.out.read_text()[-3000:]}\n--- stderr\n{self.err.read_text()[-3000:]}"

    def events(self, attempt: int | None = None) -> list[dict]:
        ev = read_journal(self.run_dir).events
        return [e for e in ev if attempt is None or e.get("attempt") == attempt]

    def assert_no_orphans(self) -> None:
        """Nothing of the run is alive once supervise has exited (zombies aside)."""
        assert self.proc is not None and self.proc.returncode is not None
        try:
            wait_for(lambda: not self.tree(), timeout=5, what="no process of the run left")
        except AssertionError:
            raise AssertionError(f"left behind: { {p: cmdline(p) for p in self.tree()} }") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.tree():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def runs(tmp_path: Path):
    made: list[Run] = []

    def make(local: str = "local") -> Run:
        made.append(Run(tmp_path, local))
        return made[-1]

    yield make
    for r in made:
        r.kill()


def ready_ranks(out: Path) -> dict[int, str]:
    return {int(p.name.split(".")[1]): p.read_text() for p in out.glob("ready.*")}


def rank_events(out: Path, pid: int) -> list[tuple[str, float]]:
    """What one signal_rank.py rank recorded: (event, its CLOCK_MONOTONIC time)."""
    f = out / f"events.{pid}"
    return [(w[0], float(w[1])) for w in map(str.split, f.read_text().splitlines())] if f.exists() else []


def training_ranks(run: Run) -> set[int]:
    """The two examples/hvd_train.py processes (not the launcher or a shell that names it)."""
    ranks = {p for p in run.tree() if cmdline(p).split(" ")[1:2] == [str(TRAIN)]}
    assert len(ranks) == 2, {p: cmdline(p) for p in run.tree()}
    return ranks


def whole_tree(run: Run, ranks: set[int], mode: str) -> set[int]:
    """The run's processes while it runs, checked to hold what horovodrun starts."""
    tree = run.tree()
    assert ranks <= tree, (ranks, tree)
    names = " ".join(cmdline(p) for p in tree)
    if mode == "gloo":
        # the driver, one middleman per rank (in its own session), a /bin/sh per rank
        assert "horovodrun" in names and names.count("multiprocessing.spawn") == 2 and names.count("/bin/sh -c") >= 2
    else:
        # horovodrun replaced by `/bin/sh -c mpirun …`, mpirun below it, the ranks below mpirun
        assert "/bin/sh -c mpirun" in names and any(cmdline(p).startswith("mpirun ") for p in tree), names
    return tree


def stop_steps(events: list[dict]) -> dict[str, dict]:
    return {e["step"]: e for e in events if e["kind"] == "stop-step"}


def complete(ckpt_dir: Path, name: str) -> bool:
    return (ckpt_dir / name / ".metadata").is_file() and (ckpt_dir / name / "model.pt").is_file()


def assert_durable_stop_checkpoint(run: Run, attempt: int = 1) -> int:
    """The stop sequence's checkpoint was published, and the newest local checkpoint (the
    training's last, taken on TERM) is the persistent `latest`, complete. Returns its step."""
    ev = run.events(attempt)
    steps = stop_steps(ev)
    assert steps["checkpoint"]["outcome"] == "published", steps["checkpoint"]
    assert steps["final-flush"]["ok"] and not steps["final-flush"]["pending"], steps["final-flush"]
    local, persistent = run.local / "checkpoints", run.persistent / "checkpoints"
    latest = (local / "latest").read_text()
    assert (persistent / "latest").read_text() == latest
    assert complete(persistent, latest)
    step = int(latest.split("_")[1])
    assert f"stop requested: saved step {step}, exiting 0" in run.out.read_text(), run.logs()
    requested = [e for e in ev if e["kind"] == "publish" and e.get("checkpoint", "").startswith("step_")]
    assert requested, "nothing was published"
    return step


# --------------------------------------------------------------------------- the tests

def test_a_checkpoint_request_reaches_every_rank(mode: str, runs, tmp_path: Path) -> None:
    """USR1 to supervise: both ranks see "checkpoint now" (gloo: USR1 straight to the ranks,
    since the driver dies of it; mpi: USR1 to mpirun, which forwards it) and nothing stops;
    then TERM: both ranks see the stop sequence's own request, then the stop, and the whole
    tree is gone."""
    out = tmp_path / "out"
    out.mkdir()
    run = runs()
    # These ranks write no checkpoint: the stop sequence waits its --checkpoint-timeout for one.
    proc = run.start(hvd(mode, str(SIGNAL_RANK), str(out), "--stop-handler"), "--checkpoint-timeout", "2s")
    ranks = wait_for(lambda: len(ready_ranks(out)) == 2 and ready_ranks(out), timeout=90, what="2 ranks up")
    assert sorted(ranks.values()) == ["0", "1"], ranks
    tree = whole_tree(run, set(ranks), mode)
    start = run.events(1)[0]
    assert start["kind"] == "start" and start["launcher"] == f"horovodrun-{mode}", start
    wait_for(lambda: all(catches(p, signal.SIGUSR1) for p in ranks), timeout=20, what="the ranks' USR1 handler")

    os.kill(proc.pid, signal.SIGUSR1)
    wait_for(lambda: all(rank_events(out, p) for p in ranks), timeout=30, what="both ranks to see the request")
    req = [e for e in run.events() if e["kind"] == "checkpoint-request"]
    assert len(req) == 1, req
    if mode == "gloo":
        assert (req[0]["route"], set(req[0]["to"])) == ("ranks", set(ranks)), req
    else:
        (to,) = req[0]["to"]
        assert req[0]["route"] == "launcher" and to in tree and to not in ranks and "mpirun" in cmdline(to), req
    time.sleep(0.5)  # "checkpoint now" is not "stop": the whole tree goes on
    assert proc.poll() is None and set(ranks) <= run.tree()

    assert all({e for e, _ in rank_events(out, p)} == {"checkpoint"} for p in ranks)
    stopping = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    rc = run.wait()
    # The stop sequence asks for a checkpoint of its own first, and that reaches every rank too.
    # (One request can count twice on a rank, when its request file is seen before its signal.)
    seen = {p: rank_events(out, p) for p in ranks}
    for events in seen.values():
        assert [e for e, _ in events][-1] == "stop" and {e for e, _ in events[:-1]} == {"checkpoint"}, seen
        assert any(e == "checkpoint" and t > stopping for e, t in events), seen
    end = run.events()[-1]
    assert end["kind"] == "end" and end["reason"] == "preempted", end
    # 75: stopped cleanly, not requeued, the training unfinished (docs/slurm.md, "Exit status of a stop")
    assert rc == end["exit_status"] == 75, f"rc {rc}, end {end}, stop steps {stop_steps(run.events())}\n{run.logs()}"
    run.assert_no_orphans()


def test_a_slow_exit_gets_the_whole_grace(mode: str, runs, tmp_path: Path) -> None:
    """Ranks that take 7 s to leave after the stop TERM (a large model's save on the way out) get
    supervise's --grace (30 s), not horovodrun --gloo's own 5 s (its GRACEFUL_TERMINATION_TIME_S,
    a constant: after it the ranks are SIGKILLed and horovodrun exits 1 at 10.1 s). With every
    rank on this node, the stop TERM goes to the ranks, and horovodrun exits 0 after them."""
    out = tmp_path / "out"
    out.mkdir()
    run = runs()
    proc = run.start(hvd(mode, str(SIGNAL_RANK), str(out), "--stop-handler", "--exit-delay", "7"),
                     "--checkpoint-timeout", "2s", "--grace", "30s")
    ranks = wait_for(lambda: len(ready_ranks(out)) == 2 and ready_ranks(out), timeout=90, what="2 ranks up")
    wait_for(lambda: all(catches(p, signal.SIGUSR1) for p in ranks), timeout=20, what="the ranks' USR1 handler")
    os.kill(proc.pid, signal.SIGTERM)
    rc = run.wait()
    seen = {p: [e for e, _ in rank_events(out, p)] for p in ranks}
    assert all(events[-2:] == ["stop", "stopped"] for events in seen.values()), (seen, run.logs())
    ev = run.events()
    step = stop_steps(ev)["stop-child"]
    assert step["route"] == "ranks" and set(step["sent_to"]) == set(ranks), step
    assert step["graceful"] and not step["killed"] and step["seconds"] > 6, step
    end = ev[-1]
    assert end["kind"] == "end" and rc == end["exit_status"] == 75, f"rc {rc}, end {end}\n{run.logs()}"  # not requeued
    run.assert_no_orphans()


@pytest.fixture(scope="module")
def reference_digest(tmp_path_factory: pytest.TempPathFactory, horovod_controllers: set[str]) -> str:
    """The uninterrupted training, without supervise: its final weights."""
    work = tmp_path_factory.mktemp("hvd-reference")
    mode = "gloo" if "gloo" in horovod_controllers else "mpi"
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run(hvd(mode, *training(work, "--steps", str(STEPS))), env=env, cwd=work,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (digest,) = DIGEST.findall(proc.stdout)
    return digest


def test_deadline_stop_checkpoints_flushes_and_ends_the_tree(horovod_controllers: set[str], runs) -> None:
    """The time limit approaching (--time-limit, --warn-before): checkpoint on request, durable,
    then one stop; the training saves once more and exits 0; nothing is left. (Gloo only: the
    stop is the preemption's, which both controllers go through below.)"""
    mode = "gloo"
    if mode not in horovod_controllers:
        pytest.skip("horovod was built without the gloo controller (bash scripts/build-horovod.sh)")
    run = runs()
    started = time.monotonic()
    run.start(hvd(mode, *training(run.local, "--steps", "100000", "--step-sleep", "0.05")),
              "--time-limit", "75s", "--warn-before", "30s")  # 45 s to start: CI runs 4-node clusters beside
    scalars = run.local / "tensorboard" / "scalars.csv"
    wait_for(lambda: scalars.exists() and len(scalars.read_text().splitlines()) > 3, timeout=60,
             what="the training to run")
    whole_tree(run, training_ranks(run), mode)
    rc = run.wait()
    took = time.monotonic() - started
    assert took < 75, f"supervise ran {took:.1f}s, past the time limit"
    ev = run.events()
    stop = next(e for e in ev if e["kind"] == "stop")
    assert stop["reason"] == "deadline", stop
    assert_durable_stop_checkpoint(run)
    end = ev[-1]
    assert end["kind"] == "end" and end["reason"] == "deadline", end
    assert rc == end["exit_status"] == 75, f"rc {rc}, end {end}, stop steps {stop_steps(run.events())}\n{run.logs()}"
    run.assert_no_orphans()


def test_preempted_then_resumed_ends_with_the_uninterrupted_weights(mode: str, runs, reference_digest: str) -> None:
    """TERM (a preemption) mid-run: checkpoint, durable, stop, nothing left. A second attempt
    (same run directory and persistent side, an empty node-local side, as after a requeue)
    restores the newest checkpoint, resumes from it, and ends bit-identical to a run that was
    never interrupted."""
    first = runs("local-1")
    # Slow enough that the training cannot end by itself during the stop's checkpoint and flush
    # (CI, beside a 4-node cluster's torch ranks: the flush took 6.2 s while the training, at
    # 0.1 s a step, reached its last step), and a grace that outlasts the ranks' way out at
    # that load (hvd.shutdown under --mpi: more than 10 s): this test is about the resume.
    proc = first.start(hvd(mode, *training(first.local, "--steps", str(STEPS), "--step-sleep", "0.3")), "--grace", "30s")
    wait_for(lambda: complete(first.persistent / "checkpoints", "step_10") or proc.poll() is not None,
             timeout=90, what="step_10 on the persistent side")
    assert proc.poll() is None, first.logs()
    whole_tree(first, training_ranks(first), mode)
    os.kill(proc.pid, signal.SIGTERM)
    rc = first.wait()
    ev1 = first.events(1)
    assert next(e for e in ev1 if e["kind"] == "stop")["reason"] == "preempted"
    saved = assert_durable_stop_checkpoint(first)
    assert 10 <= saved < STEPS
    # a clean stop, not requeued (no scheduler here): the training is unfinished, 75 (docs/slurm.md)
    assert rc == ev1[-1]["exit_status"] == 75, f"rc {rc}, end {ev1[-1]}, stop steps {stop_steps(ev1)}\n{first.logs()}"
    assert ev1[-1]["stopped_cleanly"], ev1[-1]
    first.assert_no_orphans()

    second = runs("local-2")
    second.start(hvd(mode, *training(second.local, "--steps", str(STEPS))))
    assert second.wait() == 0, second.logs()
    ev2 = second.events(2)
    restored = [e["checkpoint"] for e in ev2 if e["kind"] == "restore"]
    assert restored == [f"step_{saved}"], restored
    out = second.out.read_text()
    assert re.search(rf"resumed from step {saved} \(.*restored by supervise\)", out), second.logs()
    assert DIGEST.findall(out) == [reference_digest], second.logs()
    assert (second.persistent / "checkpoints" / "latest").read_text() == f"step_{STEPS}"
    assert ev2[-1]["kind"] == "end" and (ev2[-1]["reason"], ev2[-1]["exit_status"]) == ("child-exit", 0)
    second.assert_no_orphans()
