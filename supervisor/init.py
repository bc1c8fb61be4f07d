"""``supervise init``: a job script and a TOML config for this cluster, from the shipped templates.

The templates are the repository's own ``scripts/*.sbatch|*.pbs`` and ``configs/*.toml``, shipped
as they are in the wheel (the data packages ``supervisor.job_scripts`` and ``supervisor.presets``,
see pyproject.toml): one copy, run under a real Slurm by the tests. ``init`` picks the template
for the scheduler and launcher, puts in the training command, the directories, the node and GPU
counts and the time, and leaves the scheduler-specific lines (warning signal, requeue) as the
template has them. It asks nothing: what it cannot detect it takes from options. What differs
between schedulers (the template, the directives, how the script is submitted) is the
scheduler's (``supervisor.sched``: ``Scheduler.job_script``, ``set_directives``, ``submit_notes``).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from supervisor import __version__
from supervisor.errors import UsageError
from supervisor.launchers import command_ranks_per_node
from supervisor.sched import BATCH, SCHEDULERS, Scheduler, detect_job, for_submit

SITE_OPTIONS = ("account", "queue", "select", "filesystems")  # a scheduler's own directives (PBS's)
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


def choose(scheduler: Scheduler, launcher: str) -> Template:
    """The template for this scheduler and launcher (a close one when there is no exact one)."""
    return Template(*scheduler.job_script(launcher))


def detect_launcher(command: Sequence[str]) -> str:
    from supervisor.launchers import detect

    return str(detect(list(command)).name)


def _detect_mpi(command: Sequence[str]) -> str | None:
    """The family of the command's ``mpiexec``/``mpirun`` as installed here (``--version``), or None."""
    from supervisor.envinfo import detect_mpi
    from supervisor.launchers import unwrap

    program = unwrap(list(command))[0] if command else ""
    if os.path.basename(program) not in ("mpiexec", "mpirun"):
        return None
    path = shutil.which(program)
    return detect_mpi(path) if path else None


def detect_gpus(env: Mapping[str, str]) -> int | None:
    """GPUs per node: the job's, else this machine's (nvidia-smi -L); None when unknown."""
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


ALCF_PRESETS = {"polaris": "polaris.toml", "aurora": "aurora.toml"}
NON_ALCF_PRESET = "pbs.toml"  # the PBS preset of a site that is not ALCF's


def alcf_machine(env: Mapping[str, str], host: str | None = None, exists: Callable[[str], bool] = os.path.isdir) -> str | None:
    """``polaris`` or ``aurora`` when init runs at ALCF, whose machines the PBS template's paths
    and site directives are (``MACHINE``, as the template reads it; the host name, as ezpz
    reads it: x3… Polaris, x4… Aurora; the login nodes' names; their Lustre file systems);
    None elsewhere (``MACHINE=pbs``: any other site)."""
    named = env.get("MACHINE", "").strip().lower()
    if named:
        return named if named in ALCF_PRESETS else None
    h = (host if host is not None else socket.gethostname()).lower()
    for machine, prefix in (("aurora", "x4"), ("polaris", "x3")):
        if h.startswith((prefix, machine)) or f".{machine}.alcf" in h:
            return machine
    for machine, lustre in (("aurora", "/lus/flare"), ("polaris", "/lus/eagle")):
        if exists(lustre):
            return machine
    return None


def _generic_site(lines: list[str]) -> bool:
    """Away from ALCF: the template's machine ``case`` keeps only its generic branch (no
    /lus/eagle, no /local/scratch, which ``mkdir -p`` under ``set -e`` cannot make), its lines
    to edit marked EDIT. False when the template has no such block."""
    start = next((i for i, ln in enumerate(lines) if ln.startswith('case "${MACHINE')), None)
    if start is None:
        return False
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "esac")
    body = lines[start + 1:end]
    generic = next(i for i, ln in enumerate(body) if ln.lstrip().startswith("*)"))
    kept = [ln.strip().removeprefix("*)").strip() for ln in body[generic:] if ln.strip() != ";;"]
    lines[start:end + 1] = ["# Not an ALCF machine (Polaris, Aurora): generic PBS defaults. Edit the lines marked EDIT",
                            "# for this site, or give supervise init --local and --persistent.", *kept]
    return True


def _mpi_flags(command: Sequence[str], mpi: str | None) -> tuple[tuple[str, ...], str | None]:
    """The command with its ranks-per-node option in the form the installed ``mpiexec`` takes
    (``mpi``: envinfo.detect_mpi): OpenMPI refuses ``--ppn N`` and takes ``--map-by ppr:N:node``;
    MPICH, Hydra and PALS refuse ``--map-by ppr:N:node``/``-npernode N`` and take ``--ppn N``.
    Returns (command, what was changed or None)."""
    from supervisor.launchers import unwrap

    words = list(command)
    if mpi is None or not words or os.path.basename(unwrap(words)[0]) not in ("mpiexec", "mpirun"):
        return tuple(words), None
    for i, w in enumerate(words[:-1]):
        value = words[i + 1]
        m = re.fullmatch(r"ppr:(\d+):node", value)
        if mpi == "openmpi" and w in ("--ppn", "-ppn") and value.isdigit():
            words[i:i + 2] = ["--map-by", f"ppr:{value}:node"]
        elif mpi != "openmpi" and ((w == "--map-by" and m) or (w in ("-npernode", "--npernode") and value.isdigit())):
            words[i:i + 2] = ["--ppn", m.group(1) if m else value]
        else:
            continue
        return tuple(words), f"{w} {value} → {' '.join(words[i:i + 2])}"
    return tuple(words), None


# ---------------------------------------------------------------------------- rendering
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
    scheduler: Scheduler
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
    generic: bool = False           # away from the template's site (ALCF): its generic defaults, lines to edit
    spares: int = 0                 # of ``nodes``, kept aside to replace a node that dies (spare_nodes)
    notes: tuple[str, ...] = field(default=())  # what init changed or could not know: printed by _tell


def render_script(template: Template, c: Choices, config: Path) -> str:
    lines = (data_dir("job_scripts") / template.script).read_text().splitlines()
    _header(lines, template, c.scheduler.submit_notes(f"{c.name}.{c.scheduler.script_suffix}", config.name, bool(c.account)))
    c.scheduler.set_directives(lines, c, template.script)
    if c.spares:
        at = max(i for i, ln in enumerate(lines) if ln.startswith(c.scheduler.directive + " "))
        lines.insert(at + 1, c.scheduler.keep_on_node_failure)
    if c.generic:
        _generic_site(lines)
    if c.local:
        _set_default(lines, "LOCAL_DIR", c.local)
    if c.persistent:
        _set_default(lines, "PERSISTENT_DIR", c.persistent)
    _set_default(lines, "CONFIG", str(config))
    _set_default(lines, "VENV", sys.prefix)
    _set_command(lines, c.command)
    _drop_unused(lines)
    return "\n".join(lines) + "\n"


def render_config(template: Template, script: Path, nodes: int | None = None, spares: int = 0) -> str:
    """The preset; for a job of several nodes (``nodes``), ``nodes = "auto"`` in each checkpoint
    pair, so that every node's part of a checkpoint is mirrored (docs/multinode.md); with
    ``spares``, ``spare_nodes`` before the first table."""
    lines = (data_dir("presets") / template.preset).read_text().splitlines()
    if lines and lines[0].startswith("# Preset:"):
        lines[0] = f"# Written by `supervise init` from the preset {template.preset}, for {script.name}."
    if nodes is not None and nodes > 1:
        _per_node_pairs(lines)
    if spares:
        at = next((i for i, ln in enumerate(lines) if ln.startswith("[[")), len(lines))
        lines[at:at] = [f"spare_nodes = {spares}             # of the job's {nodes} nodes: a node that dies is replaced "
                        "inside the allocation", ""]
    return "\n".join(lines) + "\n"


def _per_node_pairs(lines: list[str]) -> None:
    """``nodes = "auto"`` after ``kind = "checkpoint"`` in each [[sync]] table that names no ``nodes``."""
    tables = [i for i, ln in enumerate(lines) if ln.strip() == "[[sync]]"] + [len(lines)]
    for start, end in reversed(list(zip(tables, tables[1:]))):
        body = lines[start:end]
        kind = next((i for i, ln in enumerate(body) if re.match(r'kind\s*=\s*"checkpoint"', ln)), None)
        if kind is not None and not any(re.match(r"nodes\s*=", ln) for ln in body):
            lines.insert(start + kind + 1, 'nodes = "auto"              # every node mirrors its own part: the job\'s node count')


def template_nodes(template: Template) -> int | None:
    """The node count the job script asks for as the template has it (``--nodes=N``, ``select=N``)."""
    text = (data_dir("job_scripts") / template.script).read_text()
    m = re.search(r"^#(?:SBATCH --nodes=|PBS -l select=)(\d+)", text, re.M)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------- command line
def parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(prog="supervise init", usage="supervise init [OPTIONS] -- COMMAND [ARGS…]", allow_abbrev=False,
            description="Write a job script and a TOML config for COMMAND (the training, as the job runs it) "
                        "from the shipped templates, with the warning-signal and requeue lines right for the "
                        "scheduler. Detected when not given: the scheduler (the job's, else sbatch or qsub on "
                        "PATH), the launcher (from COMMAND), nodes and GPUs per node (the job's, else nvidia-smi).")
    p.add_argument("--scheduler", choices=BATCH, help=f"{' or '.join(BATCH)} (default: detected)")
    p.add_argument("--launcher", help="torchrun, srun, mpiexec, horovodrun, csrun, deepspeed, python, generic "
                                      "(default: from COMMAND)")
    p.add_argument("--name", default="train", help="job name and file names: NAME.sbatch|NAME.pbs and NAME.toml (default train)")
    p.add_argument("--dir", default=".", help="where to write them (default: here)")
    p.add_argument("--nodes", type=int, help="nodes the training runs on (default: the job's, else the template's)")
    p.add_argument("--spare-nodes", type=int, default=0, metavar="K",
                   help="ask for K nodes more, kept aside: a node that dies is replaced by one inside the "
                        "allocation, no requeue (writes #SBATCH --no-kill or -W tolerate_node_failures=all and "
                        "spare_nodes = K; docs/multinode.md, \"Spare nodes\")")
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
    p.add_argument("--example-config", action="store_true",
                   help="print the example config, every key with its default and a comment (the package's "
                        "configs/example.toml), and exit: supervise init --example-config > job.toml")
    return p


def main(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    if ns.example_config:
        if command:
            raise UsageError("supervise init --example-config takes no command: it prints the example config")
        sys.stdout.write((data_dir("presets") / "example.toml").read_text())
        return 0
    if not command:
        raise UsageError("supervise init needs the training command after --, e.g. "
                         "supervise init --scheduler slurm -- torchrun --nproc-per-node 4 train.py")
    scheduler = SCHEDULERS[ns.scheduler] if ns.scheduler else for_submit(env)
    if scheduler is None:
        raise UsageError("supervise init: no scheduler found here (no job, no sbatch or qsub on PATH): "
                         "give --scheduler slurm or --scheduler pbs")
    from supervisor.config import LAUNCHERS

    if ns.launcher is not None and ns.launcher not in LAUNCHERS[1:]:
        raise UsageError(f"--launcher {ns.launcher!r}: one of {', '.join(LAUNCHERS[1:])}")
    launcher = ns.launcher or detect_launcher(command)
    if not re.fullmatch(r"[\w.-]+", ns.name):
        raise UsageError(f"--name {ns.name!r}: letters, digits, '.', '_' and '-' only")
    for flag, n in (("--nodes", ns.nodes), ("--gpus", ns.gpus), ("--spare-nodes", ns.spare_nodes)):
        if n is not None and n < (1 if flag == "--nodes" else 0):
            raise UsageError(f"{flag} {n}: must be {'1' if flag == '--nodes' else '0'} or more")
    site = [k for k in SITE_OPTIONS if getattr(ns, k) is not None and k not in scheduler.script_options]
    if site:
        raise UsageError(f"{', '.join('--' + k for k in site)}: PBS directives; with {scheduler.label} write "
                         f"{scheduler.directive} lines in the script")
    for k in SITE_OPTIONS:
        v = getattr(ns, k)
        if v and not re.fullmatch(r"[\w.:=@+,/-]+", v):
            raise UsageError(f"--{k} {v!r}: one #PBS word (letters, digits and . : = @ + , / - _)")
    job = detect_job(env)
    template = choose(scheduler, launcher)
    nodes = ns.nodes or (job.num_nodes if job.sched.is_batch else None)
    notes: list[str] = []
    command, changed = _mpi_flags(command, _detect_mpi(command))
    if changed:
        notes.append(f"the mpiexec here takes other flags than the command gave: {changed}")
    gpus, per_node = ns.gpus, command_ranks_per_node(command, nodes or template_nodes(template))
    if gpus is None and per_node is not None:
        gpus = per_node
        notes.append(f"GPUs per node {per_node}: the ranks per node the command starts")
    elif gpus is None:
        gpus = detect_gpus(env)
    machine = alcf_machine(env)
    directives: dict[str, str | None] = {k: getattr(ns, k) for k in SITE_OPTIONS}
    generic = machine is None and template.preset in ALCF_PRESETS.values()
    if generic:  # the PBS template is ALCF's: its paths and site directives would fail here
        template = replace(template, preset=NON_ALCF_PRESET)
        defaults = {"queue": "", "filesystems": "", "select": f"ngpus={gpus}" if gpus else ""}
        given = {k for k in defaults if directives[k] is not None}
        directives.update({k: v for k, v in defaults.items() if directives[k] is None})
        notes.append("not an ALCF machine (Polaris, Aurora; MACHINE=polaris|aurora says it is one): generic PBS "
                     f"defaults, LOCAL_DIR under $TMPDIR and PERSISTENT_DIR under the submit directory; edit the "
                     f"lines marked EDIT in {ns.name}.{scheduler.script_suffix} (or give --local and --persistent)"
                     + ("" if given == set(defaults) else "; #PBS -q, -l filesystems and system=polaris left out "
                        "(--queue, --filesystems, --select give this site's)"))
    elif machine is not None and template.preset in ALCF_PRESETS.values():
        template = replace(template, preset=ALCF_PRESETS[machine])
    if ns.spare_nodes:
        train = nodes or template_nodes(template) or 1
        if nodes and job.sched.is_batch and not ns.nodes:  # inside a job: its nodes are the allocation, spares included
            train = nodes - ns.spare_nodes
            if train < 1:
                raise UsageError(f"--spare-nodes {ns.spare_nodes}: this job has {nodes} node(s); give --nodes, the "
                                 "nodes the training runs on")
        nodes = train + ns.spare_nodes
        notes.append(f"{ns.spare_nodes} spare node(s): the job asks for {nodes} nodes, the training runs on {train}")
    choices = Choices(scheduler=scheduler, launcher=launcher, command=tuple(command), name=ns.name,
                      nodes=nodes, gpus=gpus, spares=ns.spare_nodes, time=ns.time, local=ns.local, persistent=ns.persistent,
                      account=ns.account, queue=directives["queue"], select=directives["select"],
                      filesystems=directives["filesystems"],
                      generic=generic, notes=tuple(notes))
    out = Path(ns.dir).resolve()
    script = out / f"{ns.name}.{scheduler.script_suffix}"
    config = out / f"{ns.name}.toml"
    for f in (script, config):
        if f.exists() and not ns.force:
            raise UsageError(f"{f} exists; --force overwrites it")
    out.mkdir(parents=True, exist_ok=True)
    script.write_text(render_script(template, choices, config))
    script.chmod(0o755)
    config.write_text(render_config(template, script, choices.nodes or template_nodes(template), ns.spare_nodes))
    _tell(choices, template, script, config)
    return 0


def _tell(c: Choices, template: Template, script: Path, config: Path) -> None:
    gpus = "unknown here: the template's" if c.gpus is None else str(c.gpus)
    nodes = "the template's" if c.nodes is None else str(c.nodes)
    print(f"wrote {script} (from {template.script}) and {config} (from {template.preset})")
    print(f"  scheduler {c.scheduler.name}, launcher {c.launcher}, nodes {nodes}, GPUs per node {gpus}")
    for note in c.notes:
        print(f"  {note}")
    local = c.local or "$TMPDIR/…"
    persistent = c.persistent or "…/results/…"
    print("check it (the job script sets LOCAL_DIR and PERSISTENT_DIR; give them here):")
    print(f"  LOCAL_DIR={shlex.quote(local)} PERSISTENT_DIR={shlex.quote(persistent)} "
          f"supervise check --config {shlex.quote(str(config))} -- {shlex.join(c.command)}")
    if any("$" in w for w in c.command):
        print("  (words with $VARIABLE are left to the job's shell to expand)")
    print(f"then: {c.scheduler.submit_line(shlex.quote(str(script)), bool(c.account))}")
