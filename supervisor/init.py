"""``supervise init``: a job script and a TOML config for this cluster, from the shipped templates.

The templates are the repository's own ``scripts/*.sbatch|*.pbs`` and ``configs/*.toml``, shipped
as they are in the wheel (the data packages ``supervisor.job_scripts`` and ``supervisor.presets``,
see pyproject.toml): one copy, run under a real Slurm by the tests. ``init`` picks the template
for the scheduler and launcher, puts in the training command, the directories, the node and GPU
counts and the time, and leaves the scheduler-specific lines (warning signal, requeue) as the
template has them. It asks nothing: what it cannot detect it takes from options.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from supervisor import __version__
from supervisor.errors import UsageError

SCHEDULERS = ("slurm", "pbs")
_HERE = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path:
    """Where the shipped ``job_scripts`` or ``presets`` are: the checkout's ``scripts/`` and
    ``configs/`` when running from one (an editable install), else the installed package's."""
    checkout = {"job_scripts": "scripts", "presets": "configs"}[kind]
    if (_HERE.parent / "pyproject.toml").is_file() and (_HERE.parent / checkout).is_dir():
        return _HERE.parent / checkout
    return _HERE / kind


@dataclass(frozen=True)
class Template:
    """A job script and the preset it reads."""

    script: str
    preset: str


def choose(scheduler: str, launcher: str) -> Template:
    """The template for this scheduler and launcher (a close one when there is no exact one)."""
    if scheduler == "pbs":
        return Template("pbs-mpiexec.pbs", "polaris.toml")
    if launcher.startswith("horovodrun"):
        return Template("slurm-horovodrun.sbatch", "ibex.toml")
    if launcher == "csrun":
        return Template("cerebras-csrun.sbatch", "cerebras.toml")
    if launcher == "srun" or launcher.startswith("mpiexec"):
        return Template("slurm-srun.sbatch", "slurm.toml")  # one task per GPU, started by the allocation
    return Template("slurm-torchrun.sbatch", "slurm.toml")  # one task that starts the ranks itself


def detect_scheduler(env: Mapping[str, str]) -> str | None:
    """The scheduler of the job we are in, else the one whose submit command is on PATH."""
    if env.get("SLURM_JOB_ID"):
        return "slurm"
    if env.get("PBS_JOBID"):
        return "pbs"
    if shutil.which("sbatch"):
        return "slurm"
    if shutil.which("qsub"):
        return "pbs"
    return None


def detect_launcher(command: Sequence[str]) -> str:
    from supervisor.launchers import detect

    return str(detect(list(command)).name)


def detect_gpus(env: Mapping[str, str]) -> int | None:
    """GPUs per node: the job's, else this machine's (nvidia-smi -L); None when unknown."""
    from supervisor.job import detect_job

    job = detect_job(env)
    if job.gpus_per_node:
        return job.gpus_per_node
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    import subprocess

    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return n or None


# ---------------------------------------------------------------------------- rendering
def _set_directive(lines: list[str], pattern: str, new: str | None) -> None:
    """Replace what ``pattern`` matches in the first line it matches (the rest kept); None deletes it."""
    rx = re.compile(pattern)
    for i, line in enumerate(lines):
        m = rx.match(line)
        if m:
            if new is None:
                del lines[i]
            else:
                lines[i] = new + line[m.end():]
            return


LEAD_MAX = 600     # seconds: the templates' --signal=B:USR2@600, for jobs of 40 min and more
LEAD_SHARE = 0.25  # a shorter job is warned this share of its time limit before the end…
LEAD_FLOOR = 45    # …but never less (Slurm checks about every 30 s and may send it up to 60 s early)


def slurm_seconds(text: str) -> float | None:
    """Slurm's ``--time``: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS → seconds."""
    days, _, rest = text.strip().rpartition("-")
    try:
        d = int(days) if days else 0
        parts = [int(p) for p in rest.split(":")]
    except ValueError:
        return None
    if days:  # D-HH[:MM[:SS]]
        parts = (parts + [0, 0])[:3] if 1 <= len(parts) <= 3 else []
    elif len(parts) == 1:  # minutes
        parts = [0, parts[0], 0]
    elif len(parts) == 2:  # MM:SS
        parts = [0, *parts]
    if len(parts) != 3 or min(parts) < 0 or d < 0:
        return None
    return float(((d * 24 + parts[0]) * 60 + parts[1]) * 60 + parts[2])


def warning_lead(limit: float) -> int:
    """How long before the end the Slurm warning signal is asked for: the templates' 600 s,
    scaled down for a short job (a 2-minute job must not be warned 10 minutes ahead, which is
    at once), at least ``LEAD_FLOOR`` and never more than half the limit."""
    return int(min(LEAD_MAX, max(LEAD_FLOOR, LEAD_SHARE * limit), limit / 2))


def _set_default(lines: list[str], name: str, value: str) -> None:
    """``VAR=${VAR:-old}`` → ``VAR=${VAR:-value}``: the job can still override it at submission."""
    rx = re.compile(rf"^(export )?{name}=\$\{{{name}:-.*?\}}(?=\s|$)")
    for i, line in enumerate(lines):
        m = rx.match(line)
        if m:
            lines[i] = f"{m.group(1) or ''}{name}=${{{name}:-{value}}}" + line[m.end():]
            return


def shell_words(command: Sequence[str]) -> str:
    """The command as a shell line. A word with ``$`` is double-quoted so that the job's own
    variables expand there (``--ckpt-dir '$LOCAL_DIR/ckpt'`` given to init → the job's LOCAL_DIR)."""
    def word(w: str) -> str:
        if "$" in w:
            return '"' + re.sub(r'(["\\`])', r"\\\1", w) + '"'
        return shlex.quote(w)

    return " ".join(word(w) for w in command)


def _set_command(lines: list[str], command: Sequence[str]) -> None:
    """Everything after the ``exec supervise … -- \\`` line becomes the training command."""
    for i, line in enumerate(lines):
        if line.startswith("exec supervise "):
            lines[i + 1:] = ["    " + shell_words(command)]
            return
    raise AssertionError("template without an exec supervise line")


def _drop_unused(lines: list[str]) -> None:
    """Drop the template's example variables (STEPS, NPROC, REPO, …) the new command does not read."""
    assign = re.compile(r"^([A-Z_]+)=\$\{\1:[-?]")
    dropped: list[str] = []
    changed = True
    while changed:
        changed = False
        text = "\n".join(lines)
        for i, line in enumerate(lines):
            m = assign.match(line)
            if m and not re.search(rf"\$\{{?{m.group(1)}\b", text.replace(line, "")):
                dropped.append(m.group(1))
                del lines[i]
                changed = True
                break
    lines[:] = [ln for ln in lines if not any(ln.startswith(f"# {name}: ") for name in dropped)]  # its comment line
    for i, line in enumerate(lines):  # a trailing comment that names a dropped variable goes too
        code, sep, comment = line.partition("  #")
        if sep and code.strip() and any(re.search(rf"\b{name}\b", comment) for name in dropped):
            lines[i] = code.rstrip()
    # a comment line left describing a dropped block ("# The training (examples/…)")
    lines[:] = [ln for ln in lines if "examples/" not in ln or not ln.startswith("#")]


def _header(lines: list[str], template: Template, note: str | list[str]) -> None:
    """The template's usage comment gives way to one that says where this file came from."""
    end = next(i for i, ln in enumerate(lines) if ln.strip() == "#")
    notes = [note] if isinstance(note, str) else note
    lines[1:end] = [f"# Written by `supervise init` (supervise {__version__}) from {template.script}.",
                    *(f"#   {n}" for n in notes),
                    "# Every VAR=${VAR:-default} below can be overridden at submission (sbatch --export=ALL,VAR=…,"
                    " qsub -v VAR=…)."]


@dataclass(frozen=True)
class Choices:
    scheduler: str
    launcher: str
    command: tuple[str, ...]
    name: str
    nodes: int | None
    gpus: int | None
    time: str | None
    local: str | None
    persistent: str | None
    account: str | None = None      # PBS: #PBS -A
    queue: str | None = None        # PBS: #PBS -q ('' drops it: the server's default queue)
    select: str | None = None       # PBS: the chunk of -l select=N:CHUNK ('' for none)
    filesystems: str | None = None  # PBS: -l filesystems= ('' drops it: a Polaris/Aurora resource)


def pbs_submit_notes(script_name: str, config_name: str, account: bool) -> list[str]:
    """How the PBS script is submitted, and why that way (it says so itself at the top)."""
    a = "" if account else " -A PROJECT"
    return [f"submit: ./{script_name}{a} [more qsub options]",
            f"check first: supervise check --config {config_name} --script {script_name} -- …",
            "Run, it submits itself as an executable job (qsub with its #PBS lines and your options, then",
            "`-- /bin/bash THIS`, read again on the node when the job starts): supervise leads the job's session,",
            f"so qsig -s USR1|USR2 reaches it. `qsub {script_name}` works too, but then your login shell leads",
            "the session, and qsig kills it and the job (Exit_status 266)."]


def render_script(template: Template, c: Choices, config: Path) -> str:
    lines = (data_dir("job_scripts") / template.script).read_text().splitlines()
    script_name = f"{c.name}.{'sbatch' if c.scheduler == 'slurm' else 'pbs'}"
    if c.scheduler == "slurm":
        _header(lines, template, f"submit: sbatch {script_name}   (check first: supervise check --config {config.name} -- …)")
    else:
        _header(lines, template, pbs_submit_notes(script_name, config.name, bool(c.account)))
    if c.scheduler == "slurm":
        _set_directive(lines, r"^#SBATCH --job-name=\S+", f"#SBATCH --job-name={c.name}")
        if c.nodes:
            _set_directive(lines, r"^#SBATCH --nodes=\S+", f"#SBATCH --nodes={c.nodes}")
        if c.gpus is not None:
            _set_directive(lines, r"^#SBATCH --gpus-per-node=\S+", f"#SBATCH --gpus-per-node={c.gpus}" if c.gpus else None)
            if template.script == "slurm-srun.sbatch" and c.gpus:
                _set_directive(lines, r"^#SBATCH --ntasks-per-node=\S+", f"#SBATCH --ntasks-per-node={c.gpus}")
        if c.time:
            _set_directive(lines, r"^#SBATCH --time=\S+", f"#SBATCH --time={c.time}")
            limit = slurm_seconds(c.time)
            lead = warning_lead(limit) if limit else LEAD_MAX
            if lead < LEAD_MAX:
                _set_directive(lines, r"^#SBATCH --signal=B:USR2@\d+.*$",
                               f"#SBATCH --signal=B:USR2@{lead}           # USR2 to the batch shell (= supervise) {lead} s "
                               f"before the end: a quarter of the {c.time} limit, at least {LEAD_FLOOR} s (not the "
                               f"templates' {LEAD_MAX} s: longer than the job, it would come at once)")
    else:
        _set_directive(lines, r"^#PBS -N \S+", f"#PBS -N {c.name}")
        if c.select is not None:
            m = re.search(r"^#PBS -l select=(\d+)", "\n".join(lines), re.M)
            n = c.nodes or (int(m.group(1)) if m else 1)
            _set_directive(lines, r"^#PBS -l select=\S*", f"#PBS -l select={n}" + (f":{c.select}" if c.select else ""))
        elif c.nodes:
            _set_directive(lines, r"^#PBS -l select=\d+", f"#PBS -l select={c.nodes}")
        if c.queue is not None:
            _set_directive(lines, r"^#PBS -q \S+", f"#PBS -q {c.queue}" if c.queue else None)
        if c.filesystems is not None:
            _set_directive(lines, r"^#PBS -l filesystems=\S+",
                           f"#PBS -l filesystems={c.filesystems}" if c.filesystems else None)
        if c.account:
            i = next(i for i, ln in enumerate(lines) if ln.startswith("#PBS -N "))
            lines.insert(i + 1, f"#PBS -A {c.account}")
        if c.time:
            _set_directive(lines, r"^#PBS -l walltime=\S+", f"#PBS -l walltime={c.time}")
    if c.local:
        _set_default(lines, "LOCAL_DIR", c.local)
    if c.persistent:
        _set_default(lines, "PERSISTENT_DIR", c.persistent)
    _set_default(lines, "CONFIG", str(config))
    _set_default(lines, "VENV", sys.prefix)
    _set_command(lines, c.command)
    _drop_unused(lines)
    return "\n".join(lines) + "\n"


def render_config(template: Template, script: Path) -> str:
    lines = (data_dir("presets") / template.preset).read_text().splitlines()
    if lines and lines[0].startswith("# Preset:"):
        lines[0] = f"# Written by `supervise init` from the preset {template.preset}, for {script.name}."
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- command line
def parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(prog="supervise init", usage="supervise init [OPTIONS] -- COMMAND [ARGS…]", allow_abbrev=False,
            description="Write a job script and a TOML config for COMMAND (the training, as the job runs it) "
                        "from the shipped templates, with the warning-signal and requeue lines right for the "
                        "scheduler. Detected when not given: the scheduler (the job's, else sbatch or qsub on "
                        "PATH), the launcher (from COMMAND), nodes and GPUs per node (the job's, else nvidia-smi).")
    p.add_argument("--scheduler", choices=SCHEDULERS, help="slurm or pbs (default: detected)")
    p.add_argument("--launcher", help="torchrun, srun, mpiexec, horovodrun, csrun, deepspeed, python, generic "
                                      "(default: from COMMAND)")
    p.add_argument("--name", default="train", help="job name and file names: NAME.sbatch|NAME.pbs and NAME.toml (default train)")
    p.add_argument("--dir", default=".", help="where to write them (default: here)")
    p.add_argument("--nodes", type=int, help="nodes (default: the job's, else the template's)")
    p.add_argument("--gpus", type=int, help="GPUs per node; 0 drops the GPU request (default: detected, else the template's)")
    p.add_argument("--time", help="time limit as the scheduler writes it, e.g. 12:00:00")
    p.add_argument("--local", metavar="DIR", help="node-local directory the training writes to (LOCAL_DIR)")
    p.add_argument("--persistent", metavar="DIR", help="persistent directory the mirror goes to (PERSISTENT_DIR)")
    site = p.add_argument_group("PBS site directives", "the template's are Polaris's (-l select=N:system=polaris, "
                                "-l filesystems=home:eagle, -q prod); elsewhere give '' to drop one")
    site.add_argument("--account", metavar="PROJECT", help="#PBS -A PROJECT (default: none; give -A when submitting)")
    site.add_argument("--queue", metavar="QUEUE", help="#PBS -q QUEUE; '' drops it (the server's default queue)")
    site.add_argument("--select", metavar="CHUNK", help="the chunk of -l select=N:CHUNK, e.g. ncpus=64:ngpus=4; "
                                                        "'' for select=N alone")
    site.add_argument("--filesystems", metavar="FS", help="-l filesystems=FS (Polaris, Aurora); '' drops it")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    return p


def main(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    if not command:
        raise UsageError("supervise init needs the training command after --, e.g. "
                         "supervise init --scheduler slurm -- torchrun --nproc-per-node 4 train.py")
    scheduler = ns.scheduler or detect_scheduler(env)
    if scheduler is None:
        raise UsageError("supervise init: no scheduler found here (no job, no sbatch or qsub on PATH): "
                         "give --scheduler slurm or --scheduler pbs")
    from supervisor.config import LAUNCHERS

    if ns.launcher is not None and ns.launcher not in LAUNCHERS[1:]:
        raise UsageError(f"--launcher {ns.launcher!r}: one of {', '.join(LAUNCHERS[1:])}")
    launcher = ns.launcher or detect_launcher(command)
    if not re.fullmatch(r"[\w.-]+", ns.name):
        raise UsageError(f"--name {ns.name!r}: letters, digits, '.', '_' and '-' only")
    for flag, n in (("--nodes", ns.nodes), ("--gpus", ns.gpus)):
        if n is not None and n < (1 if flag == "--nodes" else 0):
            raise UsageError(f"{flag} {n}: must be {'1' if flag == '--nodes' else '0'} or more")
    pbs_only = [f"--{k}" for k in ("account", "queue", "select", "filesystems") if getattr(ns, k) is not None]
    if pbs_only and scheduler != "pbs":
        raise UsageError(f"{', '.join(pbs_only)}: PBS directives; with Slurm write #SBATCH lines in the script")
    for k in ("account", "queue", "select", "filesystems"):
        v = getattr(ns, k)
        if v and not re.fullmatch(r"[\w.:=@+,/-]+", v):
            raise UsageError(f"--{k} {v!r}: one #PBS word (letters, digits and . : = @ + , / - _)")
    from supervisor.job import detect_job

    job = detect_job(env)
    gpus = ns.gpus if ns.gpus is not None else detect_gpus(env)
    choices = Choices(scheduler=scheduler, launcher=launcher, command=tuple(command), name=ns.name,
                      nodes=ns.nodes or (job.num_nodes if job.scheduler != "local" else None), gpus=gpus,
                      time=ns.time, local=ns.local, persistent=ns.persistent, account=ns.account, queue=ns.queue,
                      select=ns.select, filesystems=ns.filesystems)
    template = choose(scheduler, launcher)
    out = Path(ns.dir).resolve()
    script = out / f"{ns.name}.{'sbatch' if scheduler == 'slurm' else 'pbs'}"
    config = out / f"{ns.name}.toml"
    for f in (script, config):
        if f.exists() and not ns.force:
            raise UsageError(f"{f} exists; --force overwrites it")
    out.mkdir(parents=True, exist_ok=True)
    script.write_text(render_script(template, choices, config))
    script.chmod(0o755)
    config.write_text(render_config(template, script))
    _tell(choices, template, script, config)
    return 0


def _tell(c: Choices, template: Template, script: Path, config: Path) -> None:
    gpus = "unknown here: the template's" if c.gpus is None else str(c.gpus)
    nodes = "the template's" if c.nodes is None else str(c.nodes)
    print(f"wrote {script} (from {template.script}) and {config} (from {template.preset})")
    print(f"  scheduler {c.scheduler}, launcher {c.launcher}, nodes {nodes}, GPUs per node {gpus}")
    local = c.local or "$TMPDIR/…"
    persistent = c.persistent or "…/results/…"
    print("check it (the job script sets LOCAL_DIR and PERSISTENT_DIR; give them here):")
    print(f"  LOCAL_DIR={shlex.quote(local)} PERSISTENT_DIR={shlex.quote(persistent)} "
          f"supervise check --config {shlex.quote(str(config))} -- {shlex.join(c.command)}")
    if any("$" in w for w in c.command):
        print("  (words with $VARIABLE are left to the job's shell to expand)")
    if c.scheduler == "slurm":
        print(f"then: sbatch {shlex.quote(str(script))}")
    else:
        print(f"then: {shlex.quote(str(script))}{'' if c.account else ' -A PROJECT'}   (it submits itself as an "
              "executable job, which qsig does not kill)")
