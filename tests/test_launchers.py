"""Launcher profiles: detection from argv, and the routes checked against real launchers.

The mpi and torch tests start real ``mpiexec -n 2`` and ``torchrun --nproc-per-node 2``
jobs running tests/ranks/*.py, send real signals by the profile's route, and read what each
rank recorded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from supervisor import proctree
from supervisor.launchers import PROFILES, aborting, catches, detect, maps_libmpi, unwrap
from tests.support.wait import wait_for

RANKS = Path(__file__).parent / "ranks"
REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
TORCHRUN = shutil.which("torchrun", path=str(Path(PY).parent)) or shutil.which("torchrun")
MPIEXEC = shutil.which("mpiexec")

try:
    import importlib.util
    HAVE_TORCH = importlib.util.find_spec("torch") is not None
except ImportError:  # pragma: no cover
    HAVE_TORCH = False

needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="OpenMPI mpiexec not on PATH (apt-get install openmpi-bin)")
needs_torch = pytest.mark.skipif(not HAVE_TORCH or TORCHRUN is None,
                                 reason="torch/torchrun not installed (pip install torch==2.13.0)")


# --- detection ---

@pytest.mark.parametrize("argv, name", [
    (["mpiexec", "-n", "2", "python", "train.py"], "mpiexec-openmpi"),  # /usr/bin/mpiexec → orterun here
    (["mpirun.openmpi", "-np", "4", "a.out"], "mpiexec-openmpi"),
    (["orterun", "-np", "4", "a.out"], "mpiexec-openmpi"),
    (["mpiexec.hydra", "-n", "2", "a.out"], "mpiexec-hydra"),
    (["mpiexec.mpich", "-n", "2", "a.out"], "mpiexec-hydra"),
    (["/opt/cray/pals/1.3.2/bin/mpiexec", "-n", "8", "--ppn", "4", "python", "t.py"], "mpiexec-pals"),
    (["/nonexistent/mpiexec", "-n", "8", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth", "./a"], "mpiexec-pals"),
    (["/nonexistent/mpiexec", "--mca", "btl", "self", "-n", "2", "./a"], "mpiexec-openmpi"),
    (["/nonexistent/mpiexec", "-n", "2", "./a"], "mpiexec"),
    (["srun", "-n", "4", "python", "train.py"], "srun"),
    (["torchrun", "--standalone", "--nproc-per-node", "2", "train.py"], "torchrun"),
    (["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"], "torchrun"),
    (["python3", "-u", "-m", "torch.distributed.launch", "train.py"], "torchrun"),
    (["/venv/bin/python3.11", "/venv/bin/torchrun", "train.py"], "torchrun"),
    (["deepspeed", "--num_gpus", "4", "train.py"], "deepspeed"),
    (["python", "-m", "deepspeed.launcher.runner", "train.py"], "deepspeed"),
    (["horovodrun", "-np", "4", "--gloo", "python", "train.py"], "horovodrun-gloo"),
    (["horovodrun", "--mpi", "-np", "4", "python", "train.py"], "horovodrun-mpi"),
    (["horovodrun", "-np", "4", "-H", "localhost:4", "python", "train.py"], "horovodrun"),
    (["csrun_wse", "python", "run.py", "--mode=train"], "csrun"),
    (["csrun_cpu", "--alloc-node=True", "python", "run.py"], "csrun"),
    (["python", "train.py"], "python"),
    (["python3.11", "train.py"], "python"),
    (["bash", "train.sh"], "generic"),
    (["./train.sh"], "generic"),
    ([], "generic"),
    # wrappers
    (["env", "NCCL_DEBUG=INFO", "-u", "FOO", "torchrun", "train.py"], "torchrun"),
    (["/usr/bin/env", "A=1", "B=2", "mpiexec.hydra", "-n", "2", "x"], "mpiexec-hydra"),
    (["singularity", "exec", "--nv", "-B", "/data:/data", "img.sif", "torchrun", "t.py"], "torchrun"),
    (["apptainer", "exec", "--nv", "--bind=/a", "--env", "A=1", "img.sif", "python", "-m",
      "torch.distributed.run", "t.py"], "torchrun"),
    (["numactl", "--cpunodebind=0", "-m", "0", "python", "train.py"], "python"),
    (["numactl", "-N", "0", "--localalloc", "horovodrun", "--gloo", "python", "t.py"], "horovodrun-gloo"),
    (["env", "X=1", "numactl", "-C", "0-3", "apptainer", "exec", "img", "srun", "python", "t"], "srun"),
    (["taskset", "-c", "0-3", "deepspeed", "t.py"], "deepspeed"),
    (["nice", "-n", "5", "timeout", "-s", "INT", "1h", "python", "t.py"], "python"),
    (["singularity", "shell", "img.sif"], "generic"),
    # ALCF's ezpz: a launcher around the mpiexec/mpirun it composes
    (["ezpz", "launch", "-np", "2", "--", "python", "train.py"], "ezpz"),
    (["/opt/ezpz-venv/bin/ezpz", "launch", "python", "-m", "ezpz.test_dist"], "ezpz"),
    (["ezpz-launch", "python", "train.py"], "ezpz"),
    (["python", "-m", "ezpz.launch", "python", "train.py"], "ezpz"),
    (["/venv/bin/python3", "-u", "/venv/bin/ezpz", "launch", "train.py"], "ezpz"),
    (["env", "NCCL_DEBUG=INFO", "ezpz", "launch", "--", "python", "t.py"], "ezpz"),
    (["ezpz", "test"], "generic"),
    (["ezpz", "doctor"], "generic"),
    (["python", "ezpz.py", "launch"], "python"),
])
def test_detect(argv: list[str], name: str) -> None:
    if argv[:1] == ["mpiexec"] and (MPIEXEC is None or "orterun" not in os.path.realpath(MPIEXEC)):
        pytest.skip("this row needs Debian's OpenMPI as /usr/bin/mpiexec")
    assert detect(argv).name == name


def test_unwrap_keeps_the_training_arguments() -> None:
    assert unwrap(["env", "A=1", "apptainer", "exec", "--nv", "img", "python", "t.py", "--lr", "1"]) == \
        ["python", "t.py", "--lr", "1"]


@pytest.mark.parametrize("override, argv, name", [
    ("auto", ["torchrun", "t.py"], "torchrun"),
    ("torchrun", ["./my_launcher.sh"], "torchrun"),
    ("mpiexec", ["mpiexec.hydra", "-n", "2", "x"], "mpiexec-hydra"),   # coarse name refined by argv
    ("mpiexec", ["./wrapper.sh"], "mpiexec"),                          # no argv hint: the cautious one
    ("horovodrun", ["horovodrun", "--gloo", "x"], "horovodrun-gloo"),
    ("generic", ["python", "t.py"], "generic"),
    ("mpiexec-pals", ["mpiexec", "x"], "mpiexec-pals"),                 # a profile name is taken as is
    ("mpiexec", ["ezpz", "launch", "python", "t.py"], "ezpz"),         # ezpz runs an mpiexec: argv agrees
])
def test_override(override: str, argv: list[str], name: str) -> None:
    assert detect(argv, override).name == name


def test_unknown_override_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown launcher"):
        detect(["python"], "slurmy")


def test_profile_table_is_consistent() -> None:
    for p in PROFILES.values():
        assert p.checkpoint_route in ("launcher", "ranks", "file"), p.name
        assert p.stop_route in ("launcher", "ranks", "local-ranks"), p.name
    # the measured hazards
    assert PROFILES["torchrun"].checkpoint_route == "ranks"          # dies on USR1
    assert PROFILES["horovodrun-gloo"].stop_route == "local-ranks"   # its own TERM kills after 5 s
    assert PROFILES["horovodrun-gloo"].checkpoint_route == "ranks"   # dies on USR1
    assert PROFILES["mpiexec-openmpi"].checkpoint_route == "launcher"  # forwards USR1
    assert PROFILES["mpiexec-openmpi"].stop_route_mpi == "ranks"     # MPI_Init'ed ranks wait for its SIGKILL
    assert PROFILES["ezpz"].wraps and not any(p.wraps for p in PROFILES.values() if p.name != "ezpz")
    assert all(p.stop_route_mpi in ("", "ranks") for p in PROFILES.values())


def test_child_env_fits_inside_our_grace() -> None:
    env = PROFILES["mpiexec-openmpi"].child_env(30)
    t = int(env["OMPI_MCA_odls_base_sigkill_timeout"])
    assert 1 <= t and 2 * t < 30                 # ranks get TERM at t and KILL at 2t, before ours
    assert PROFILES["mpiexec-openmpi"].child_env(0.5) == {"OMPI_MCA_odls_base_sigkill_timeout": "1"}
    assert 1 <= int(PROFILES["torchrun"].child_env(30)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < 30
    assert PROFILES["python"].child_env(30) == {}


# --- helpers for the real-process tests ---

def ready_pids(out: Path) -> dict[int, str]:
    return {int(p.name.split(".")[1]): p.read_text() for p in out.glob("ready.*")}


def events(out: Path, pid: int) -> list[str]:
    f = out / f"events.{pid}"
    return [line.split()[0] for line in f.read_text().splitlines()] if f.exists() else []


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a launcher in its own session; afterwards stop it and everything below it."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        full = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **env)
        p = subprocess.Popen(argv, env=full, start_new_session=True, stdout=open(tmp_path / "launcher.log", "ab"),
                             stderr=subprocess.STDOUT)
        started.append(p)
        return p

    yield start
    for p in started:
        (tmp_path / "out" / "stop").touch()
        tree = proctree.descendants(p.pid) | {p.pid}
        try:
            p.wait(timeout=3)  # ranks that watch the stop file leave by themselves
        except subprocess.TimeoutExpired:
            pass
        for pid in tree | proctree.descendants(p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait(timeout=10)


def start_ranks(launch: Callable[..., subprocess.Popen[bytes]], tmp_path: Path, argv: list[str], n: int = 2,
                timeout: float = 60, **env: str) -> tuple[subprocess.Popen[bytes], Path, dict[int, str]]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    proc = launch(argv + [str(out)] if "{out}" not in argv else [a.replace("{out}", str(out)) for a in argv], **env)
    pids = wait_for(lambda: len(ready_pids(out)) == n and ready_pids(out), timeout, f"{n} ranks ready")
    assert proc.poll() is None, (tmp_path / "launcher.log").read_text()
    return proc, out, pids  # type: ignore[return-value]


def send(pids: frozenset[int], sig: signal.Signals) -> None:
    for pid in pids:
        os.kill(pid, sig)


# --- OpenMPI ---

@pytest.mark.mpi
@needs_mpi
def test_mpiexec_ranks_and_checkpoint_through_the_launcher(launch, tmp_path: Path) -> None:
    proc, out, pids = start_ranks(launch, tmp_path, [MPIEXEC, "--oversubscribe", "-n", "2", PY,
                                                     str(RANKS / "signal_rank.py")])
    prof = detect([MPIEXEC, "-n", "2", PY])
    assert prof.name == "mpiexec-openmpi"
    assert prof.ranks(proc.pid) == set(pids)
    assert sorted(pids.values()) == ["0", "1"]
    assert catches(proc.pid, signal.SIGUSR1)          # mpiexec handles USR1 (it forwards it)
    t = prof.checkpoint_targets(proc.pid)
    assert (t.route, t.pids, dict(t.skipped)) == ("launcher", frozenset({proc.pid}), {})
    send(t.pids, prof.checkpoint_signal)
    wait_for(lambda: all(events(out, p) == ["checkpoint"] for p in pids), 20, "both ranks to see the request")
    time.sleep(0.5)  # both ranks and mpiexec keep running: "checkpoint now" is not "stop"
    assert proc.poll() is None and all(proctree.alive(p) for p in pids)
    # a second request is seen too (acknowledge() re-armed it)
    send(t.pids, prof.checkpoint_signal)
    wait_for(lambda: all(events(out, p) == ["checkpoint"] * 2 for p in pids), 20, "the second request")


@pytest.mark.mpi
@needs_mpi
def test_mpiexec_ranks_route_reaches_each_rank(launch, tmp_path: Path) -> None:
    proc, out, pids = start_ranks(launch, tmp_path, [MPIEXEC, "--oversubscribe", "-n", "2", PY,
                                                     str(RANKS / "signal_rank.py")])
    prof = PROFILES["mpiexec"]  # the cautious profile signals the ranks themselves
    t = prof.checkpoint_targets(proc.pid)
    assert (t.route, set(t.pids)) == ("ranks", set(pids))
    send(t.pids, signal.SIGUSR1)
    wait_for(lambda: all(events(out, p) == ["checkpoint"] for p in pids), 20, "both ranks to see the request")
    assert proc.poll() is None and all(proctree.alive(p) for p in pids)


@pytest.mark.mpi
@needs_mpi
def test_no_checkpoint_signal_to_ranks_that_would_die_of_it(launch, tmp_path: Path) -> None:
    """Ranks without a USR1 handler: the launcher would forward USR1 and kill them."""
    out = tmp_path / "out"
    out.mkdir()
    script = "import os,time; open(os.path.join(%r, 'ready.%%d' %% os.getpid()), 'w').write('x'); time.sleep(60)" % str(out)
    proc = launch([MPIEXEC, "--oversubscribe", "-n", "2", PY, "-c", script])
    pids = wait_for(lambda: len(ready_pids(out)) == 2 and ready_pids(out), 30, "ranks ready")
    prof = PROFILES["mpiexec-openmpi"]
    assert prof.ranks(proc.pid) == set(pids)
    t = prof.checkpoint_targets(proc.pid)
    assert t.pids == frozenset() and set(t.skipped) == set(pids)
    t2 = PROFILES["mpiexec"].checkpoint_targets(proc.pid)
    assert t2.pids == frozenset() and set(t2.skipped) == set(pids)


@pytest.mark.mpi
@needs_mpi
def test_mpiexec_stop_once_with_our_grace(launch, tmp_path: Path) -> None:
    """One TERM to mpiexec with child_env(grace): the ranks get TERM (not KILL) in time."""
    prof = PROFILES["mpiexec-openmpi"]
    grace = 6.0
    proc, out, pids = start_ranks(launch, tmp_path, [MPIEXEC, "--oversubscribe", "-n", "2", PY,
                                                     str(RANKS / "signal_rank.py"), "{out}", "--stop-handler"],
                                  **prof.child_env(grace))
    t = prof.stop_targets(proc.pid)
    assert t.pids == frozenset({proc.pid})
    t0 = time.monotonic()
    send(t.pids, prof.stop_signal)
    proc.wait(timeout=grace + 5)
    took = time.monotonic() - t0
    assert took < grace, took
    assert all(events(out, p) == ["stop"] for p in pids), {p: events(out, p) for p in pids}


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("script, mpi", [("from mpi4py import MPI", True), ("import mpi4py", False), ("", False)],
                         ids=["MPI_Init", "mpi4py-imported-only", "plain"])
def test_mpiexec_stop_goes_to_ranks_that_called_mpi_init(launch, tmp_path: Path, script: str, mpi: bool) -> None:
    """Under OpenMPI's mpirun the stop goes to the ranks when each has libmpi mapped (it called
    MPI_Init: mpirun, TERMed, would hold such ranks and itself until its SIGKILL); ranks that
    did not (plain Python, torch/gloo, mpi4py imported without MPI) keep the TERM to mpirun."""
    if mpi or script:
        pytest.importorskip("mpi4py", reason="mpi4py not installed")
    out = tmp_path / "out"
    out.mkdir()
    code = (f"{script}\nimport os, time; open(os.path.join({str(out)!r}, 'ready.%d' % os.getpid()), 'w').write('x')\n"
            "time.sleep(60)")
    proc = launch([MPIEXEC, "--oversubscribe", "-n", "2", PY, "-c", code])
    pids = wait_for(lambda: len(ready_pids(out)) == 2 and ready_pids(out), 60, "ranks ready")
    assert all(maps_libmpi(p) == mpi for p in pids)
    assert not maps_libmpi(proc.pid)                  # mpirun itself does not link libmpi
    t = detect([MPIEXEC, "-n", "2", PY]).stop_targets(proc.pid)
    assert (t.route, t.pids) == (("ranks", frozenset(pids)) if mpi else ("launcher", frozenset({proc.pid})))
    assert PROFILES["mpiexec-hydra"].stop_targets(proc.pid).route == "launcher"  # measured for OpenMPI only


@pytest.mark.mpi
@needs_mpi
def test_mpirun_outlives_ranks_that_died_of_term_until_two_terms_end_it(launch, tmp_path: Path) -> None:
    """Issue 42 item 11, OpenMPI 4.1 measured: MPI_Init'ed ranks that die of the stop TERM (no
    handler) make mpirun abort the job, and it then sleeps out 2 × ``odls_base_sigkill_timeout``
    with no rank left (52 s for T = 27; asleep: ``aborting``). One TERM then only prints "abort
    is already in progress" (it still exited 52 s after the ranks); a second ends it at once."""
    pytest.importorskip("mpi4py", reason="mpi4py not installed")
    out = tmp_path / "out"
    out.mkdir()
    code = ("from mpi4py import MPI\nimport os, time\n"
            f"open(os.path.join({str(out)!r}, 'ready.%d' % os.getpid()), 'w').write('x')\ntime.sleep(60)")
    proc = launch([MPIEXEC, "--oversubscribe", "-n", "2", PY, "-c", code], OMPI_MCA_odls_base_sigkill_timeout="27")
    pids = wait_for(lambda: len(ready_pids(out)) == 2 and ready_pids(out), 60, "ranks ready")
    t = detect([MPIEXEC, "-n", "2", PY]).stop_targets(proc.pid)
    assert (t.route, t.pids, t.finish) == ("ranks", frozenset(pids), proc.pid)
    assert aborting(proc.pid) is False                 # running: mpirun polls
    send(t.pids, signal.SIGTERM)
    wait_for(lambda: aborting(proc.pid), 10, "mpirun asleep in its kill timer")
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.2)
    assert proc.poll() is None                         # one TERM: "abort is already in progress"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=5) == 1 and time.monotonic() - t0 < 5
    assert not [p for p in pids if proctree.alive(p)]


@pytest.mark.mpi
@needs_mpi
def test_ezpz_launch_is_looked_through_to_its_mpirun(launch, tmp_path: Path) -> None:
    """`ezpz launch` (tests/ranks/ezpz_stand_in.py: a Python process that composes mpirun and
    dies of any signal, as ezpz's own does): until its mpirun runs, "checkpoint now" is the file
    only and the stop goes to ezpz; then both route as OpenMPI's profile does, from mpirun."""
    pytest.importorskip("mpi4py", reason="mpi4py not installed")
    ezpz = tmp_path / "ezpz"
    ezpz.write_text(f"#!{PY}\n" + (RANKS / "ezpz_stand_in.py").read_text())
    ezpz.chmod(0o755)
    out, go = tmp_path / "out", tmp_path / "go"
    out.mkdir()
    argv = [str(ezpz), "launch", "-np", "2", "--oversubscribe", "--", PY, str(RANKS / "mpi4py_rank.py"), str(out)]
    prof = detect(argv)
    assert prof.name == "ezpz" and "OMPI_MCA_odls_base_sigkill_timeout" in prof.child_env(30)
    proc = launch(argv, EZPZ_STAND_IN_GO=str(go))
    wait_for(lambda: _cmd(proc.pid)[1:3] == [str(ezpz), "launch"], 20, "the stand-in up")
    assert not catches(proc.pid, signal.SIGUSR1) and not catches(proc.pid, signal.SIGTERM)
    assert prof.inner(proc.pid) is None and prof.ranks(proc.pid) == set()
    t = prof.checkpoint_targets(proc.pid)
    assert (t.route, t.pids, set(t.skipped)) == ("file", frozenset(), {proc.pid})
    assert prof.stop_targets(proc.pid) == type(t)("launcher", frozenset({proc.pid}))
    go.touch()
    pids = wait_for(lambda: len(ready_pids(out)) == 2 and ready_pids(out), 60, "ranks ready")
    mpirun = prof.find_launcher(proc.pid)
    assert mpirun != proc.pid and _cmd(mpirun)[0] == "mpirun"
    inner = prof.inner(proc.pid)
    assert inner is not None and (inner[0].name, inner[1]) == ("mpiexec-openmpi", mpirun)
    assert prof.ranks(proc.pid) == set(pids)
    wait_for(lambda: all(catches(p, signal.SIGUSR1) for p in pids), 20, "the ranks' USR1 handler")
    t = prof.checkpoint_targets(proc.pid)
    assert (t.route, t.pids) == ("launcher", frozenset({mpirun}))
    send(t.pids, prof.checkpoint_signal)            # forwarded by mpirun to both ranks
    wait_for(lambda: (out / "ckpt.0").exists() and (out / "ckpt.1").exists(), 30, "both ranks to checkpoint")
    # MPI_Init'ed; once they are gone, the mpirun below ezpz is ended (never ezpz launch: TERM kills it)
    assert prof.stop_targets(proc.pid) == type(t)("ranks", frozenset(pids), finish=mpirun)


# --- torchrun ---

@pytest.mark.torch
@needs_torch
def test_torchrun_ranks_and_checkpoint_to_the_workers(launch, tmp_path: Path) -> None:
    proc, out, pids = start_ranks(launch, tmp_path, [TORCHRUN, "--standalone", "--nproc-per-node", "2",
                                                     str(RANKS / "signal_rank.py")])
    prof = detect([TORCHRUN, "--standalone", "x.py"])
    assert prof.name == "torchrun"
    assert prof.ranks(proc.pid) == set(pids)
    assert sorted(pids.values()) == ["0", "1"]
    assert not catches(proc.pid, signal.SIGUSR1)      # torchrun would die of USR1: hence the route
    t = prof.checkpoint_targets(proc.pid)
    assert (t.route, set(t.pids)) == ("ranks", set(pids))
    send(t.pids, prof.checkpoint_signal)
    wait_for(lambda: all(events(out, p) == ["checkpoint"] for p in pids), 20, "both workers to see the request")
    time.sleep(0.5)
    assert proc.poll() is None and all(proctree.alive(p) for p in pids)


@pytest.mark.torch
@needs_torch
def test_torchrun_through_env_and_python_m(launch, tmp_path: Path) -> None:
    """Spawned as ``env … python -m torch.distributed.run``: the ranks are still found."""
    argv = ["env", "SOMETHING=1", PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(RANKS / "signal_rank.py")]
    proc, out, pids = start_ranks(launch, tmp_path, argv)
    prof = detect(argv)
    assert prof.name == "torchrun"
    assert prof.ranks(proc.pid) == set(pids)


@pytest.mark.torch
@needs_torch
def test_torchrun_gloo_ddp_agrees_on_the_checkpoint_step(launch, tmp_path: Path) -> None:
    """USR1 to ONE worker only; the all_reduce(MAX) pattern makes both save at the same step."""
    proc, out, pids = start_ranks(launch, tmp_path, [TORCHRUN, "--standalone", "--nproc-per-node", "2",
                                                     str(RANKS / "ddp_rank.py")], timeout=90)
    prof = PROFILES["torchrun"]
    assert prof.ranks(proc.pid) == set(pids)
    one = next(p for p, r in pids.items() if r == "1")
    wait_for(lambda: catches(one, signal.SIGUSR1), 10, "the handler")
    os.kill(one, signal.SIGUSR1)
    wait_for(lambda: (out / "ckpt.0").exists() and (out / "ckpt.1").exists(), 30, "both ranks to checkpoint")
    assert (out / "ckpt.0").read_text() == (out / "ckpt.1").read_text()
    assert (out / "model.pt").exists()
    (out / "stop").touch()
    assert proc.wait(timeout=30) == 0


# --- Horovod (scripts/build-horovod.sh builds it; measured in docs/launchers.md) ---

@pytest.fixture(scope="module")
def horovod_controllers() -> set[str]:
    from tests.support.horovod import built_controllers
    found, why = built_controllers()
    if not found:
        pytest.skip(why or "horovod has no controller")
    return found


def horovodrun(mode: str, controllers: set[str], *command: str) -> list[str]:
    from tests.support.horovod import HOROVODRUN
    if mode not in controllers:
        pytest.skip(f"horovod was built without the {mode} controller (bash scripts/build-horovod.sh)")
    return [str(HOROVODRUN), "-np", "2", "-H", "localhost:2", f"--{mode}", PY, *command]


def test_horovodrun_gloo_ranks_and_checkpoint(launch, tmp_path: Path, horovod_controllers: set[str]) -> None:
    argv = horovodrun("gloo", horovod_controllers, str(RANKS / "signal_rank.py"))
    proc, out, pids = start_ranks(launch, tmp_path, argv, timeout=90)
    prof = detect(argv)
    assert prof.name == "horovodrun-gloo"
    assert prof.find_launcher(proc.pid) == proc.pid
    assert prof.ranks(proc.pid) == set(pids)
    assert sorted(pids.values()) == ["0", "1"]
    assert not catches(proc.pid, signal.SIGUSR1)      # the driver would die of USR1: hence the route
    t = prof.checkpoint_targets(proc.pid)
    assert (t.route, set(t.pids)) == ("ranks", set(pids))
    assert prof.stop_targets(proc.pid) == type(t)("ranks", frozenset(pids))  # -np 2, both here
    send(t.pids, prof.checkpoint_signal)
    wait_for(lambda: all(events(out, p) == ["checkpoint"] for p in pids), 20, "both ranks to see the request")
    time.sleep(0.5)
    assert proc.poll() is None and all(proctree.alive(p) for p in pids)


@pytest.mark.parametrize("sig, rc", [(signal.SIGTERM, 0), (signal.SIGINT, 0), (signal.SIGUSR1, -signal.SIGUSR1)],
                         ids=["TERM", "INT", "USR1"])
def test_horovodrun_gloo_turns_term_int_and_usr1_into_a_stop_of_every_rank(
        launch, tmp_path: Path, horovod_controllers: set[str], sig: signal.Signals, rc: int) -> None:
    """The driver handles INT and TERM: TERM to each rank at once, and its exit status is the
    ranks' (0). USR1 kills the driver, and its per-rank middlemen, seeing it gone, TERM the
    ranks all the same: USR1 to horovodrun is a stop, never "checkpoint now"."""
    argv = horovodrun("gloo", horovod_controllers, str(RANKS / "signal_rank.py"), "{out}", "--stop-handler")
    proc, out, pids = start_ranks(launch, tmp_path, argv, timeout=90)
    t0 = time.monotonic()
    os.kill(proc.pid, sig)
    assert proc.wait(timeout=30) == rc
    wait_for(lambda: all(events(out, p) == ["stop"] for p in pids), 10, "both ranks to get TERM")
    wait_for(lambda: not any(proctree.alive(p) for p in pids), 10, "ranks gone")
    assert time.monotonic() - t0 < 5


_FAKE_HOROVODRUN = """
import os, subprocess, sys
out = sys.argv[-1]
ranks = [subprocess.Popen([sys.executable, os.path.join(%r, "signal_rank.py"), out],
                          env=dict(os.environ, HOROVOD_RANK=str(i))) for i in range(2)]
for r in ranks:
    r.wait()
"""


@pytest.mark.parametrize("np_args, route", [(["-np", "2"], "ranks"), (["--num-proc=2"], "ranks"),
                                            (["-np", "4"], "launcher"), ([], "launcher")],
                         ids=["all-local", "all-local-long-flag", "two-of-four-here", "no-count"])
def test_horovodrun_gloo_stops_through_the_ranks_only_when_all_are_here(
        launch, tmp_path: Path, np_args: list[str], route: str) -> None:
    """horovodrun --gloo SIGKILLs its ranks 5 s after its own TERM, so the stop goes to the
    ranks, which then have the whole --grace; but only when every rank of its -np is below it
    on this node: ranks on other hosts hear only horovodrun."""
    argv = [PY, "-c", _FAKE_HOROVODRUN % str(RANKS), *np_args, "{out}"]
    proc, out, pids = start_ranks(launch, tmp_path, argv)
    t = PROFILES["horovodrun-gloo"].stop_targets(proc.pid)
    assert (t.route, set(t.pids)) == (route, set(pids) if route == "ranks" else {proc.pid})


def test_horovodrun_mpi_is_a_shell_around_mpirun(launch, tmp_path: Path, horovod_controllers: set[str]) -> None:
    """`horovodrun --mpi` becomes `/bin/sh -c "mpirun …"`, and that shell passes nothing on: a
    TERM to it ends the shell alone and orphans mpirun and the ranks. The profile walks down
    to mpirun for USR1 (forwarded to every rank) and stops the ranks themselves."""
    argv = horovodrun("mpi", horovod_controllers, str(RANKS / "signal_rank.py"))
    proc, out, pids = start_ranks(launch, tmp_path, argv, timeout=90)
    prof = detect(argv)
    assert prof.name == "horovodrun-mpi"
    mpirun = prof.find_launcher(proc.pid)
    assert mpirun != proc.pid and _cmd(mpirun)[0] == "mpirun", _cmd(mpirun)
    assert _cmd(proc.pid)[:2] == ["/bin/sh", "-c"] and not catches(proc.pid, signal.SIGUSR1)
    assert prof.ranks(proc.pid) == set(pids) and sorted(pids.values()) == ["0", "1"]
    t = prof.checkpoint_targets(proc.pid)
    assert (t.route, t.pids) == ("launcher", frozenset({mpirun}))
    send(t.pids, prof.checkpoint_signal)
    wait_for(lambda: all(events(out, p) == ["checkpoint"] for p in pids), 20, "both ranks to see the request")
    assert prof.stop_targets(proc.pid) == type(t)("ranks", frozenset(pids))
    try:
        os.kill(proc.pid, signal.SIGTERM)             # what a plain `kill` of the launcher pid does
        assert proc.wait(timeout=60) == -signal.SIGTERM
        time.sleep(1.0)
        assert proctree.alive(mpirun) and all(proctree.alive(p) for p in pids)
        assert all(events(out, p) == ["checkpoint"] for p in pids)  # the ranks heard nothing
    finally:
        (out / "stop").touch()                        # orphans: the launch fixture cannot see them
        wait_for(lambda: not proctree.alive(mpirun), 20, "mpirun to leave with its ranks")


@pytest.mark.torch
def test_horovod_mpi_ranks_hang_in_finalize_after_mpirun_is_stopped(
        launch, tmp_path: Path, horovod_controllers: set[str]) -> None:
    """Why the stop of `horovodrun --mpi` goes to the ranks: after a TERM to mpirun (SIGCONT,
    TERM after odls_base_sigkill_timeout, SIGKILL after twice that) Horovod's ranks save and
    leave their loop, then hang in MPI_Finalize until mpirun's SIGKILL: exit 1 at twice the
    timeout. (A TERM to the ranks themselves ends in 0: tests/horovod/test_horovodrun.py.)"""
    work = tmp_path / "out"
    argv = horovodrun("mpi", horovod_controllers, str(REPO / "examples" / "hvd_train.py"), "--steps", "100000",
                      "--step-sleep", "0.05", "--write-checkpoints-to", str(work / "ckpt"),
                      "--tensorboard-logging-dir", str(work / "tb"))
    proc = launch(argv, OMPI_MCA_odls_base_sigkill_timeout="2", OMP_NUM_THREADS="1")
    scalars = work / "tb" / "scalars.csv"
    wait_for(lambda: scalars.exists() and len(scalars.read_text().splitlines()) > 3, 90, "training")
    mpirun = PROFILES["horovodrun-mpi"].find_launcher(proc.pid)
    assert _cmd(mpirun)[0] == "mpirun"
    t0 = time.monotonic()
    os.kill(mpirun, signal.SIGTERM)
    assert proc.wait(timeout=60) == 1
    assert time.monotonic() - t0 >= 3.5                 # mpirun's SIGKILL at 2 x 2 s ended it
    log = (tmp_path / "launcher.log").read_text()
    assert "stop requested: saved step" in log, log[-3000:]   # the ranks had saved and meant to exit 0


def _cmd(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


@pytest.mark.torch
@needs_torch
def test_torchrun_kill_timer_follows_our_grace(launch, tmp_path: Path) -> None:
    """Workers that ignore TERM: torchrun's own SIGKILL comes before our grace ends
    (its default is 30 s), because child_env set TORCH_ELASTIC_SHUTDOWN_TIMEOUT."""
    prof = PROFILES["torchrun"]
    grace = 10.0  # torchrun's own timer is then 8 s, far below its default 30 s
    proc, out, pids = start_ranks(launch, tmp_path, [TORCHRUN, "--standalone", "--nproc-per-node", "2",
                                                     str(RANKS / "signal_rank.py"), "{out}", "--ignore-term"],
                                  **prof.child_env(grace))
    t = prof.stop_targets(proc.pid)
    assert t.pids == frozenset({proc.pid})
    t0 = time.monotonic()
    send(t.pids, prof.stop_signal)
    proc.wait(timeout=grace + 10)
    took = time.monotonic() - t0
    # our timer, not torchrun's 30 s default; its exit after its SIGKILL took 2 s more in CI
    # beside a 4-node cluster (where our own kill at the grace's end would come too)
    assert 3.0 <= took < grace + 5, took
    wait_for(lambda: not any(proctree.alive(p) for p in pids), 5, "workers gone")


@pytest.mark.mpi
@needs_mpi
def test_mpi4py_ranks_agree_on_the_checkpoint_step(launch, tmp_path: Path) -> None:
    """The docs/training.md mpi4py pattern: USR1 to one rank, both checkpoint at one step."""
    pytest.importorskip("mpi4py", reason="mpi4py not installed")
    proc, out, pids = start_ranks(launch, tmp_path, [MPIEXEC, "--oversubscribe", "-n", "2", PY,
                                                     str(RANKS / "mpi4py_rank.py")], timeout=60)
    one = next(p for p, r in pids.items() if r == "1")
    os.kill(one, signal.SIGUSR1)
    wait_for(lambda: (out / "ckpt.0").exists() and (out / "ckpt.1").exists(), 30, "both ranks to checkpoint")
    time.sleep(0.3)
    assert (out / "ckpt.0").read_text() == (out / "ckpt.1").read_text()
    (out / "stop").touch()
    assert proc.wait(timeout=30) == 0


def test_plain_python_gets_the_signal_only_once_it_handles_it(tmp_path: Path) -> None:
    """The python profile signals the child itself, but never before it catches USR1."""
    prof = detect(["env", "A=1", PY, "train.py"])
    assert prof.name == "python"
    code = ("import sys, time, pathlib; d = pathlib.Path(sys.argv[1]); (d / 'up').touch()\n"
            "while not (d / 'go').exists(): time.sleep(0.01)\n"
            "from supervisor import training\n(d / 'armed').touch()\n"
            "end = time.monotonic() + 20\n"
            "while not training.checkpoint_requested() and time.monotonic() < end: time.sleep(0.01)\n"
            "print('requested', training.checkpoint_requested())")
    p = subprocess.Popen([PY, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "up").exists(), 20, "child up")
        t = prof.checkpoint_targets(p.pid)
        assert t.pids == frozenset() and p.pid in t.skipped      # USR1 would kill it now
        (tmp_path / "go").touch()
        wait_for(lambda: (tmp_path / "armed").exists(), 20, "helper imported")
        t = prof.checkpoint_targets(p.pid)
        assert (t.route, t.pids) == ("launcher", frozenset({p.pid}))
        send(t.pids, prof.checkpoint_signal)
        out, _ = p.communicate(timeout=20)
        assert p.returncode == 0 and "requested True" in out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
