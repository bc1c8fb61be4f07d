"""The job-script templates in scripts/: syntax, directives, `exec supervise`, and their presets.

Each template is also *run* with bash up to its `exec supervise`, in a faked Slurm or PBS job
environment, with stand-ins on PATH for the launchers (and module/conda/scontrol): the
`supervise` stand-in records what it was given and runs the real `supervise check` with the
template's own flags and command, so the preset, the paths the template builds and the
launcher supervise would detect are all checked. (tests/slurm/test_templates.py submits them
to a real local Slurm.)
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

SCRIPTS = ROOT / "scripts"
SLURM_TEMPLATES = sorted(SCRIPTS.glob("*.sbatch"))
PBS_TEMPLATES = sorted(SCRIPTS.glob("*.pbs"))
TEMPLATES = SLURM_TEMPLATES + PBS_TEMPLATES

# sbatch 22.05 long options (man sbatch) that a template may reasonably use.
SBATCH_OPTIONS = {
    "account", "array", "begin", "chdir", "comment", "constraint", "cpus-per-gpu", "cpus-per-task",
    "dependency", "error", "exclusive", "export", "gpus", "gpus-per-node", "gpus-per-task", "gres",
    "hint", "job-name", "mail-type", "mail-user", "mem", "mem-per-cpu", "mem-per-gpu", "nodes",
    "ntasks", "ntasks-per-node", "open-mode", "output", "partition", "qos", "requeue", "reservation",
    "signal", "tasks-per-node", "time", "wckey",
}
SBATCH_SHORT = {"A": "account", "c": "cpus-per-task", "C": "constraint", "e": "error", "J": "job-name",
                "N": "nodes", "n": "ntasks", "o": "output", "p": "partition", "q": "qos", "t": "time"}
PBS_OPTIONS = {"A", "N", "l", "q", "r", "j", "o", "e", "k", "m", "M", "V", "v", "W", "S"}
PBS_RESOURCES = {"select", "place", "walltime", "filesystems", "ncpus", "ngpus", "mem"}

EXPECTED_LAUNCHER = {
    "slurm-torchrun.sbatch": ("torchrun", "torchrun"),
    "slurm-srun.sbatch": ("srun", "srun"),
    "slurm-horovodrun.sbatch": ("horovodrun", "horovodrun"),
    "cerebras-csrun.sbatch": ("csrun_wse", "csrun"),
    "pbs-mpiexec.pbs": ("mpiexec", "mpiexec-pals"),
}


def directives(path: Path, prefix: str) -> list[str]:
    """The directive lines the scheduler reads: those before the first command."""
    out = []
    for line in path.read_text().splitlines()[1:]:
        s = line.strip()
        if s.startswith(prefix + " "):
            out.append(s[len(prefix):].split(" #")[0].strip())
        elif s and not s.startswith("#"):
            break
    return out


def sbatch_options(path: Path) -> dict[str, str]:
    opts = {}
    for d in directives(path, "#SBATCH"):
        if d.startswith("--"):
            name, _, value = d[2:].partition("=")
        else:
            m = re.fullmatch(r"-(\w)\s*(.*)", d)
            assert m, f"{path.name}: cannot parse #SBATCH {d}"
            name, value = SBATCH_SHORT.get(m.group(1), "-" + m.group(1)), m.group(2)
        opts[name.strip()] = value.strip()
    return opts


def exec_line(path: Path) -> list[str]:
    """The `exec supervise …` command, continuation lines joined, as words."""
    text = path.read_text().replace("\\\n", " ")
    lines = [ln for ln in text.splitlines() if ln.startswith("exec ")]
    assert len(lines) == 1, f"{path.name}: expected one exec line, found {len(lines)}"
    return shlex.split(lines[0], comments=True)


def test_there_are_templates() -> None:
    assert {p.name for p in TEMPLATES} == set(EXPECTED_LAUNCHER)


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_bash_syntax(path: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_execs_supervise_last(path: Path) -> None:
    words = exec_line(path)
    assert words[:2] == ["exec", "supervise"], words
    assert "--config" in words and "--" in words
    # Nothing runs after the exec: it is the script's last command.
    text = path.read_text().replace("\\\n", " ").rstrip().splitlines()
    assert text[-1].startswith("exec supervise"), f"{path.name}: something follows the exec"
    # No rsync loop, no background dmon, no `&`: supervise does those.
    body = "\n".join(ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#"))
    for word in ("rsync", "nvidia-smi", " &\n", "wait ", "trap "):
        assert word not in body, f"{path.name} still has {word.strip()!r}"


@pytest.mark.parametrize("path", SLURM_TEMPLATES, ids=lambda p: p.name)
def test_sbatch_directives(path: Path) -> None:
    opts = sbatch_options(path)
    unknown = set(opts) - SBATCH_OPTIONS
    assert not unknown, f"{path.name}: unknown #SBATCH options {sorted(unknown)}"
    # supervise's --warn-signal default is USR2; B: sends it to the batch shell (= supervise).
    m = re.fullmatch(r"B:USR2@(\d+)", opts.get("signal", ""))
    assert m and int(m.group(1)) >= 300, f"{path.name}: --signal={opts.get('signal')}"
    assert "requeue" in opts and opts["requeue"] == ""
    assert opts.get("open-mode") == "append"
    assert re.fullmatch(r"\d+(:\d\d){0,2}|\d+-\d+(:\d\d){0,2}", opts["time"]), opts["time"]


@pytest.mark.parametrize("path", PBS_TEMPLATES, ids=lambda p: p.name)
def test_pbs_directives(path: Path) -> None:
    seen: dict[str, list[str]] = {}
    for d in directives(path, "#PBS"):
        m = re.fullmatch(r"-(\w)(?:\s+(\S+))?", d)
        assert m, f"{path.name}: cannot parse #PBS {d}"
        assert m.group(1) in PBS_OPTIONS, f"{path.name}: unknown #PBS option -{m.group(1)}"
        seen.setdefault(m.group(1), []).append(m.group(2) or "")
    assert seen.get("r") == ["y"], "#PBS -r y (rerunnable) is needed for a requeue"
    for res in seen.get("l", []):
        name, _, value = res.partition("=")
        assert name in PBS_RESOURCES and value, f"{path.name}: #PBS -l {res}"
    assert "walltime" in {r.split("=")[0] for r in seen["l"]}


# ---- run each template up to its exec, with stand-ins ---------------------------------------

SHIM = '''#!{python}
"""Stand-in for `supervise`: record argv, the paths the config resolves to, and the launcher
supervise would detect; then run the real `supervise check` with the same arguments."""
import json, os, subprocess, sys
from pathlib import Path
args = sys.argv[1:]
sep = args.index("--")
opts, command = args[:sep], args[sep + 1:]
from supervisor import launchers
from supervisor.config import build_config
cfg = build_config(flags={{}}, command=tuple(command), config_file=Path(opts[opts.index("--config") + 1]),
                   create_run_dir=False)
proc = subprocess.run([sys.executable, "-m", "supervisor", "check", *args], capture_output=True, text=True)
rec = {{"opts": opts, "command": command, "rc": proc.returncode, "out": proc.stdout + proc.stderr,
        "pairs": [[p.name, p.kind, str(p.src), str(p.dst), p.restore] for p in cfg.sync],
        "launcher": launchers.detect(command, cfg.launcher).name, "warn_signal": getattr(cfg.warn_signal, "name", str(cfg.warn_signal)),
        "env": {{k: os.environ.get(k) for k in ("LOCAL_DIR", "PERSISTENT_DIR", "MASTER_ADDR", "MASTER_PORT")}}}}
Path(os.environ["SHIM_RECORD"]).write_text(json.dumps(rec))
sys.exit(proc.returncode)
'''
STUB = '''#!{python}
import sys
if sys.argv[1:3] == ["show", "hostnames"]:
    print("node001")
'''


def _stubs(bin_dir: Path) -> None:
    bin_dir.mkdir()
    (bin_dir / "supervise").write_text(SHIM.format(python=sys.executable))
    for name in ("torchrun", "srun", "horovodrun", "csrun_wse", "mpiexec", "module", "conda", "scontrol"):
        (bin_dir / name).write_text(STUB.format(python=sys.executable))
    for p in bin_dir.iterdir():
        p.chmod(0o755)


def _job_env(tmp: Path, path: Path, machine: str) -> dict[str, str]:
    submit = tmp / "submit"
    submit.mkdir(exist_ok=True)
    base = {"PATH": f"{tmp / 'bin'}:/usr/bin:/bin", "HOME": str(tmp), "USER": "tester", "LANG": "C.UTF-8",
            "REPO": str(ROOT), "VENV": str(tmp / "no-venv"), "SHIM_RECORD": str(tmp / "record.json"),
            "LOCAL_DIR": str(tmp / "local"), "PERSISTENT_DIR": str(tmp / "persistent"),
            "PYTHONPATH": str(ROOT)}
    if path.suffix == ".pbs":
        nodefile = tmp / "nodefile"
        nodefile.write_text("x3001c0s1b0n0\nx3001c0s1b1n0\n")
        return {**base, "PBS_JOBID": "4242.polaris-pbs-01", "PBS_JOBNAME": "tpl", "PBS_O_WORKDIR": str(submit),
                "PBS_NODEFILE": str(nodefile), "MACHINE": machine}
    return {**base, "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "tpl", "SLURM_SUBMIT_DIR": str(submit),
            "SLURM_NTASKS": "8", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node001",
            "SLURM_GPUS_ON_NODE": "4", "TRAINING_SCRIPT": "train.py", "CS_IP": "10.0.0.1"}


# "pbs": any other PBS site, the template's generic branch (configs/pbs.toml; issue 42)
CASES = [(p, "") for p in SLURM_TEMPLATES] + [(p, m) for p in PBS_TEMPLATES for m in ("polaris", "aurora", "pbs")]


@pytest.mark.parametrize(("path", "machine"), CASES, ids=lambda v: v.name if isinstance(v, Path) else v)
def test_template_runs_to_a_valid_supervise_check(path: Path, machine: str, tmp_path: Path) -> None:
    _stubs(tmp_path / "bin")
    env = _job_env(tmp_path, path, machine)
    proc = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path / "submit", stdin=subprocess.DEVNULL)
    record = tmp_path / "record.json"
    assert record.exists(), f"{path.name} did not reach `exec supervise`:\n{proc.stdout}\n{proc.stderr}"
    rec = json.loads(record.read_text())
    assert proc.returncode == 0 and rec["rc"] == 0, f"supervise check failed:\n{rec['out']}\n{proc.stderr}"
    assert "check: ready" in rec["out"]

    # The preset is the matching configs/*.toml, and it is one test_example_config validates.
    config = Path(rec["opts"][rec["opts"].index("--config") + 1])
    assert config.parent == ROOT / "configs" and config.is_file()
    if machine:
        assert config.name == f"{machine}.toml"
    # The run directory is on the persistent side, one per job id (so requeues append to it).
    run_dir = rec["opts"][rec["opts"].index("--run-dir") + 1]
    assert run_dir.startswith(str(tmp_path / "persistent") + "/") and "4242" in run_dir
    # Every pair goes from the node-local side to the persistent side; checkpoints are restored.
    assert rec["pairs"], "the preset mirrors nothing"
    for name, kind, src, dst, restore in rec["pairs"]:
        assert src.startswith(str(tmp_path / "local") + "/"), (name, src)
        assert dst.startswith(str(tmp_path / "persistent") + "/"), (name, dst)
        assert restore == (kind == "checkpoint"), (name, kind, restore)
    # The launcher, and the profile supervise picks for it (docs/launchers.md).
    first, profile = EXPECTED_LAUNCHER[path.name]
    assert rec["command"][0] == first and rec["launcher"] == profile, (rec["command"], rec["launcher"])
    # The warn signal the preset expects is the one #SBATCH --signal sends.
    if path.suffix == ".sbatch":
        assert rec["warn_signal"].endswith("USR2")
        assert (tmp_path / "local").is_dir() and (tmp_path / "persistent").is_dir()


def test_pbs_template_sizes_mpiexec_from_the_nodefile(tmp_path: Path) -> None:
    path = SCRIPTS / "pbs-mpiexec.pbs"
    _stubs(tmp_path / "bin")
    for machine, ppn in (("polaris", 4), ("aurora", 12), ("pbs", 1)):
        env = _job_env(tmp_path, path, machine)
        subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=120,
                       cwd=tmp_path / "submit", stdin=subprocess.DEVNULL)
        rec = json.loads((tmp_path / "record.json").read_text())
        cmd = rec["command"]
        assert cmd[cmd.index("--np") + 1] == str(2 * ppn) and cmd[cmd.index("--ppn") + 1] == str(ppn)
        assert cmd[cmd.index("--hostfile") + 1] == env["PBS_NODEFILE"]
        assert rec["env"]["MASTER_ADDR"] == "x3001c0s1b0n0"


def test_shrinking_a_template_through_the_environment(tmp_path: Path) -> None:
    """STEPS, NPROC, CKPT_EVERY reach the training command (what the Slurm test relies on)."""
    path = SCRIPTS / "slurm-torchrun.sbatch"
    _stubs(tmp_path / "bin")
    env = {**_job_env(tmp_path, path, ""), "STEPS": "7", "NPROC": "2", "CKPT_EVERY": "3"}
    subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=120,
                   cwd=tmp_path / "submit", stdin=subprocess.DEVNULL)
    cmd = json.loads((tmp_path / "record.json").read_text())["command"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[cmd.index("--steps") + 1] == "7" and cmd[cmd.index("--ckpt-every") + 1] == "3"
