"""The command line: ``supervise [run|check|env|report] [OPTIONS] -- COMMAND [ARGS…]``.

Parsing only: options become a validated Config (``config.py``) and the work is handed
to the agent, the checker, the environment view or the report. Every usage error is one
line on stderr and exit status 2, before anything is started.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from supervisor import __version__, logs
from supervisor.config import AGENT_GROUPS, KEYS, SyncPair
from supervisor.errors import UsageError

SUBCOMMANDS = ("run", "check", "env", "report", "node-agent", "init")

DESCRIPTION = """\
Supervise one training run inside a batch job: mirror checkpoints and logs to persistent
storage as they are written, sample the GPUs, take a checkpoint and flush it before the
time limit or a preemption kills the job, requeue, and leave a run directory that
`supervise report` explains.

In a job script, exec it, so the scheduler's signals reach it:
    exec supervise --config configs/ibex.toml -- horovodrun -np 8 python train.py
"""

EPILOG = """\
subcommands:
  run (default)   supervise COMMAND (everything after --)
  check           validate the options and show what supervise sees here; starts nothing
  env             the job as supervise sees it: scheduler, nodes, GPUs, launcher
  report RUN_DIR  what happened in a run, and what to change; report DIR… (many runs): where the GPU-hours went
  init            write a job script and config for this cluster: supervise init -- torchrun … train.py
  node-agent      multi-node jobs: mirror this node's part of each checkpoint (one per node;
                  see docs/sync.md)

durations: 90, 90s, 10m, 1h30m, or as the scheduler writes them: MM:SS, HH:MM:SS, D-HH,
  D-HH:MM, D-HH:MM:SS (a bare number is seconds, where sbatch --time reads minutes).
signals: TERM, INT, USR1, USR2, HUP (with or without SIG).
precedence: --config file < SUPERVISE_* environment variables < flags.
exit status: the command's own; 128+N if signal N killed it; 127 command not found;
126 not executable; 2 for a usage or config error (nothing is started); 3 not requeued because
no checkpoint was published in the last --no-progress-attempts attempts; 75 stopped before the
training finished and not requeued (--stopped-status: auto gives 0 when requeued); 74 something
not durable at the end (--not-durable-status). docs/slurm.md, "Exit status of a stop".

examples:
  supervise -- python train.py
  supervise --checkpoints /tmp/ckpt $SCRATCH/run1/ckpt --logs /tmp/tb $SCRATCH/run1/tb \\
            --time-limit 4h --warn-before 10m -- torchrun --nproc-per-node 4 train.py
  supervise check --config configs/ibex.toml -- horovodrun -np 8 python train.py
"""


class _Parser(argparse.ArgumentParser):
    """argparse that raises one-line UsageErrors instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _run_options(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS
    g = p.add_argument_group("run")
    g.add_argument("-c", "--config", metavar="FILE", default=S, help="TOML config file; every key, with its default: supervise init --example-config")
    run_dir = next(k for k in KEYS if k.name == "run_dir")
    g.add_argument(run_dir.flag, metavar=run_dir.metavar, default=S, help=f"{run_dir.help} (default {run_dir.shown})")
    g.add_argument("-q", "--quiet", action="count", default=0, help="only warnings and errors on stderr")
    g.add_argument("-v", "--verbose", action="count", default=0, help="more detail on stderr")
    g.add_argument("-V", "--version", action="version", version=f"supervise {__version__}")
    groups = _setting_options(p, {"run": g})
    groups["time limit, preemption and requeue"].add_argument("--no-requeue", dest="requeue", action="store_const",
                                                              const="false", default=S, help=argparse.SUPPRESS)


def _setting_options(p: argparse.ArgumentParser, groups: dict[str, argparse._ArgumentGroup],
                     only: tuple[str, ...] | None = None) -> dict[str, argparse._ArgumentGroup]:
    """One flag per setting of ``config.KEYS`` (those of the groups ``only``, or all), under its
    group's heading; the mirroring group also holds the pairs and their options. The leader's
    parser and the node agent's both come from here: one definition of each option."""
    S = argparse.SUPPRESS
    for key in KEYS:
        if key.name == "run_dir" or key.name in SPECIAL or (only is not None and key.group not in only):
            continue
        if key.group not in groups:
            groups[key.group] = p.add_argument_group(key.group)
            if key.group == "mirroring to persistent storage":
                _pair_options(groups[key.group])
        default = key.shown or ("none" if key.default is None else "off" if key.default is False
                                else str(getattr(key.default, "name", key.default)))
        help_text = f"{key.help} (default {default.removeprefix('SIG')})"
        if key.metavar is None:
            groups[key.group].add_argument(key.flag, dest=key.name, action="store_const", const="true", default=S,
                                           help=help_text)
        else:
            groups[key.group].add_argument(key.flag, dest=key.name, metavar=key.metavar, default=S, help=help_text,
                                           action="append" if key.name in REPEATABLE else "store")
    return groups


REPEATABLE = ("notify",)
SPECIAL = ("sync_nice", "sync_ionice", "dmon_log", "restart_backoff", "notify_timeout")  # config file and environment only


def _pair_options(g: argparse._ArgumentGroup) -> None:
    """The pairs themselves and the options of the --checkpoints pairs."""
    S = argparse.SUPPRESS
    g.add_argument("--checkpoints", nargs=2, metavar=("LOCAL", "PERSISTENT"), action="append", default=S,
                   help="mirror checkpoints: complete ones only, never torn; repeatable")
    g.add_argument("--logs", nargs=2, metavar=("LOCAL", "PERSISTENT"), action="append", default=S,
                   help="mirror logs such as TensorBoard event files, growing in place; repeatable")
    g.add_argument("--restore", action="store_const", const="true", default=S,
                   help="before starting, bring the newest complete checkpoint back from persistent storage "
                        "(its local path is in SUPERVISE_RESTORED_FROM)")
    g.add_argument("--profile", metavar="NAME", default=S,
                   help="the --checkpoints layout: auto (default: detected), dcp, hf-trainer, accelerate, lightning, "
                        "torch-save, deepspeed, megatron, orbax, generic")
    g.add_argument("--marker", dest="markers", metavar="GLOB", action="append", default=S,
                   help="a file your training writes last into each checkpoint directory; repeatable")
    g.add_argument("--settle", metavar="DURATION", default=S,
                   help="quiet time after which a checkpoint without other evidence counts as complete "
                        f"(default {SyncPair.settle:g}s)")
    g.add_argument("--nodes", metavar="N|auto", default=S,
                   help="every node writes its shards of a --checkpoints checkpoint to its own local disk: publish "
                        "each one only when all N nodes' parts are durable (auto: the job's node count; "
                        "start one `supervise node-agent` per node)")


def _parser(sub: str) -> _Parser:
    prog = "supervise" if sub == "run" else f"supervise {sub}"
    if sub == "report":
        p = _Parser(prog=prog, allow_abbrev=False,
                    description="What happened in a run directory, and what to change. Several paths, a folder of "
                                "run directories or a glob: one row per run, totals, badput by cause and the nodes "
                                "implicated in failures (docs/report.md, \"The fleet view\").")
        p.add_argument("paths", metavar="RUN_DIR", nargs="+", help="a run directory, or folders and globs of them")
        p.add_argument("--json", action="store_true", help="the same facts as JSON")
        p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with plots")
        p.add_argument("--since", metavar="WHEN", help="many runs: only runs active since then (7d, 12h, 2026-11-20)")
        p.add_argument("--state", metavar="STATE", action="append", default=[],
                       help="many runs: only runs in this state (finished, failed, requeued, stopped, cancelled, "
                            "running, killed, local-only, corrupt, unreadable, partial); repeatable or comma-separated")
        p.add_argument("--sort", metavar="KEY", help="many runs: start (default), lost, ettr, wall, gpu-hours, attempts, "
                                                     "state, name")
        p.add_argument("--jobs", metavar="N", type=_jobs, help="many runs: worker processes reading them (default: "
                                                               "the CPUs this process may use, at most 8)")
        return p
    if sub == "node-agent":
        return _node_agent_parser()
    if sub == "init":
        from supervisor.init import parser

        return parser(_Parser)  # type: ignore[return-value]
    if sub == "env":
        p = _Parser(prog=prog, allow_abbrev=False, description="The job as supervise sees it: scheduler, job id, attempt, nodes, GPUs, launcher, and a suggested launch command.")
        p.add_argument("--json", action="store_true", help="as JSON")
        return p
    p = _Parser(prog=f"{prog} [OPTIONS] -- COMMAND [ARGS…]", usage=f"{prog} [OPTIONS] -- COMMAND [ARGS…]",
                allow_abbrev=False, description=DESCRIPTION, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    _run_options(p)
    if sub == "check":
        p.add_argument("--script", metavar="FILE", help="also read this job script: a PBS one that qsig would kill "
                                                        "or that lacks `#PBS -r y` is warned about")
    return p


def _node_agent_parser() -> _Parser:
    from supervisor.sched import RANK_VARIABLES

    S = argparse.SUPPRESS
    p = _Parser(prog="supervise node-agent", allow_abbrev=False,
                description="Multi-node jobs whose nodes write checkpoint shards to their own local disks: mirror this "
                            "node's part of every checkpoint of the per-node pairs (nodes > 1) to persistent storage; "
                            "the main supervise (node 0) publishes a checkpoint once every node's part is there. "
                            "Under Slurm the main supervise starts one per node itself; elsewhere start one per node, "
                            "e.g. mpiexec --ppn 1 supervise node-agent --config FILE & (docs/multinode.md). It takes "
                            "the main supervise's mirroring and sampling options.")
    g = p.add_argument_group("node agent")
    g.add_argument("-c", "--config", metavar="FILE", default=S, help="the same TOML file as the main supervise")
    g.add_argument("--run-dir", metavar="DIR", default=S,
                   help="the main supervise's run directory; this agent journals into DIR/nodes/node-K/")
    g.add_argument("--node-rank", metavar="K", default=S,
                   help=f"this node's index, 1 to N-1 (default: {', '.join(RANK_VARIABLES)}); 0 is the main "
                        "supervise's and exits at once")
    g.add_argument("--leader-config", metavar="JSON", default=S,
                   help="the main supervise's resolved configuration, as it starts its agents: the whole of it "
                        "(no --config, other setting or SUPERVISE_* variable applies beside it)")
    g.add_argument("-q", "--quiet", action="count", default=0, help="only warnings and errors on stderr")
    g.add_argument("-v", "--verbose", action="count", default=0, help="more detail on stderr")
    _setting_options(p, {}, only=AGENT_GROUPS)
    return p


def _known_flags(p: argparse.ArgumentParser) -> list[str]:
    return [s for a in p._actions for s in a.option_strings]  # noqa: SLF001 - argparse has no public accessor


def _check_flags(p: argparse.ArgumentParser, opts: Sequence[str]) -> None:
    """Unknown flags and stray words get a did-you-mean, not argparse's generic line."""
    known = _known_flags(p)
    for word in opts:
        if word.startswith("-") and word != "-" and not word.lstrip("-")[:1].isdigit():
            flag = word.split("=", 1)[0]
            if flag not in known:
                import difflib  # only for a mistake

                close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else "; see supervise --help"
                raise UsageError(f"unknown option {flag}{hint}")


def _split(argv: Sequence[str]) -> tuple[str, list[str], list[str]]:
    args = list(argv)
    sub = "run"
    if args and args[0] in SUBCOMMANDS:
        sub = args.pop(0)
    if "--" in args:
        i = args.index("--")
        return sub, args[:i], args[i + 1 :]
    return sub, args, []


def parse(argv: Sequence[str]) -> tuple[str, argparse.Namespace, list[str]]:
    """``(subcommand, options, command)``; raises UsageError."""
    sub, opts, command = _split(argv)
    p = _parser(sub)
    if "-h" not in opts and "--help" not in opts:
        _check_flags(p, opts)
    ns, extra = p.parse_known_args(opts)
    if extra:
        word = extra[0]
        if sub in ("run", "check") and not command:
            raise UsageError(f"unexpected {word!r}: put the training command after --, e.g. supervise -- {' '.join(extra)}")
        raise UsageError(f"unexpected argument {word!r}")
    return sub, ns, command


CONFIG_FLAGS = tuple(k.name for k in KEYS if k.name not in SPECIAL)


PAIR_FLAGS = ("restore", "markers", "settle", "profile")  # options of the --checkpoints pairs


def config_from(ns: argparse.Namespace, command: Sequence[str], *, for_check: bool = False,  # noqa: ANN201
                create_run_dir: bool | None = None):
    """Build the validated Config from parsed options (file < env < flags)."""
    from supervisor.config import build_config
    from supervisor.sched import run_dir_id

    given = vars(ns)
    flags: dict[str, Any] = {k: given[k] for k in CONFIG_FLAGS if k in given}
    pairs = [("checkpoint", a, b) for a, b in given.get("checkpoints", [])]
    pairs += [("log", a, b) for a, b in given.get("logs", [])]
    cfg_file = Path(given["config"]) if "config" in given else None
    verbosity = given.get("verbose", 0) - given.get("quiet", 0)
    pair_flags = {k: given[k] for k in PAIR_FLAGS if k in given}
    if pair_flags and not given.get("checkpoints"):
        flag = "--" + next(iter(pair_flags)).replace("markers", "marker")
        raise UsageError(f"{flag} applies to --checkpoints pairs, and none was given "
                         "(in a config file, set it in the [[sync]] table)")
    cfg = build_config(flags=flags, flag_pairs=pairs, command=tuple(command), config_file=cfg_file,
                       require_command=not for_check,
                       create_run_dir=not for_check if create_run_dir is None else create_run_dir, flag_nodes=given.get("nodes"),
                       pair_flags=pair_flags, job_id=run_dir_id(os.environ))
    from dataclasses import replace

    return replace(cfg, verbosity=verbosity)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from supervisor.child import remember_inherited_fds

    remember_inherited_fds()
    logs.setup(0)
    try:
        sub, ns, command = parse(argv)
        if sub == "run":
            _hold_signals()
            return _run(ns, command)
        if sub == "check":
            from supervisor.check import run_check

            return run_check(config_from(ns, command, for_check=True), command, script=getattr(ns, "script", None))
        if sub == "env":
            return _env(ns, command)
        if sub == "node-agent":
            return _node_agent(ns, command)
        if sub == "init":
            from supervisor.init import main as init_main

            return init_main(ns, command)
        return _report(ns)
    except UsageError as e:
        print(f"supervise: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `supervise env --json | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


_EARLY: list[int] = []  # stop and pass-on signals that came before the agent listened


def _hold_signals() -> None:
    """From here until the agent's receiver takes over, a stop or pass-on signal is kept,
    not acted on: a KeyboardInterrupt raised inside an import is swallowed by importlib,
    and the agent replays what came (a stop before the spawn exits 128+N)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda n, _frame: _EARLY.append(n))


def _run(ns: argparse.Namespace, command: list[str]) -> int:
    import anyio

    from supervisor.conduct.allocation import supervise
    from supervisor.child import become_subreaper

    from supervisor.config import check_run_dir
    from supervisor.plan import make_plan

    cfg = config_from(ns, command, create_run_dir=False)
    logs.setup(cfg.verbosity)
    plan = make_plan(cfg)  # every ConfigError here: exit 2, nothing started, nothing made
    check_run_dir(plan.run_dir)
    become_subreaper()
    try:
        return anyio.run(supervise, cfg, plan, _EARLY)
    finally:
        logs.close()


def _node_agent(ns: argparse.Namespace, command: list[str]) -> int:
    from supervisor.sched import node_rank

    if command:
        raise UsageError("supervise node-agent takes no command: it mirrors, the main supervise runs the training")
    cfg = node_agent_config(ns)
    if cfg.run_dir is not None and cfg.run_dir.name.endswith(f"Z-{os.getpid()}"):
        # outside a scheduler the default run directory is new per process: not the leader's
        raise UsageError("supervise node-agent needs the main supervise's run directory here: give --run-dir DIR")
    rank = node_rank(getattr(ns, "node_rank", None), os.environ)
    logs.setup(cfg.verbosity)
    try:
        if rank == 0:
            from supervisor.conduct.choice import leaders_node

            return leaders_node()
        import anyio

        from supervisor.conduct.agent import Agent
        from supervisor.conduct.node import NodeRole
        from supervisor.plan import make_plan

        plan = make_plan(cfg, os.environ, node_rank=rank)  # the leader's own make_plan: ConfigError, exit 2, nothing made
        return anyio.run(Agent(plan, NodeRole(plan)).run)
    finally:
        logs.close()


def node_agent_config(ns: argparse.Namespace):  # noqa: ANN201
    """The agent's Config: its leader's whole (``--leader-config``, as the leader starts it), or
    built as the leader's own is (file < environment < flags) when a job script starts it."""
    given = vars(ns)
    if "leader_config" not in given:
        return config_from(ns, (), for_check=True)
    beside = sorted(k for k in given if k not in ("leader_config", "run_dir", "node_rank", "quiet", "verbose"))
    if beside:
        raise UsageError(f"--leader-config is the whole configuration: give no --{beside[0].replace('_', '-').replace('markers', 'marker')} with it")
    if "run_dir" not in given:
        raise UsageError("--leader-config needs --run-dir DIR, the main supervise's run directory")
    from supervisor.config import from_leader

    return from_leader(given["leader_config"], Path(given["run_dir"]).absolute(),
                       given.get("verbose", 0) - given.get("quiet", 0))


def _env(ns: argparse.Namespace, command: list[str]) -> int:
    try:
        from supervisor import envinfo
    except ImportError:
        raise UsageError("supervise env is not available in this build") from None
    import anyio

    from supervisor.sched import detect_job

    job = detect_job(os.environ)
    end = anyio.run(job.sched.end_time, job, lambda message: None)
    info = envinfo.gather(os.environ, command, end_time=end, mpi=envinfo.detect_mpi())
    print(json.dumps(info, indent=2, sort_keys=True) if ns.json else envinfo.render_text(info))
    return 0


def _jobs(v: str) -> int:
    if not v.isdigit() or not 1 <= int(v) <= 256:
        raise argparse.ArgumentTypeError("expected a number of processes from 1 to 256")
    return int(v)


def _report(ns: argparse.Namespace) -> int:
    try:
        from supervisor import report
    except ImportError:
        raise UsageError("supervise report is not available in this build") from None
    html = Path(ns.html) if ns.html else None
    many = ns.since is not None or ns.state or ns.sort is not None or ns.jobs is not None
    if len(ns.paths) == 1 and not many and report.is_one_run(ns.paths[0]):
        return report.main(Path(ns.paths[0]), as_json=ns.json, html=html)
    return report.main_many(ns.paths, as_json=ns.json, html=html, since=ns.since, states=ns.state,
                            sort=ns.sort or "start", jobs=ns.jobs)


def entry() -> None:
    """The console script: ``main`` then a hard exit.

    A worker thread stuck for good in a driver call (NVML on a wedged GPU) would keep the
    interpreter from exiting after the journal's last line; nothing is left to do by then.
    """
    logs.reopen_closed_std_streams()  # issue 14: started with >&- or 2>&-
    status = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(status)
