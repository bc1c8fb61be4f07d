"""One frozen, validated Config from a TOML file, ``SUPERVISE_*`` variables and flags.

Precedence is file < environment < flags. Everything is checked here, before anything is
started, and every failure is one ``ConfigError`` line naming the key, the value and
what would be right (exit status 2). Keys are documented in ``configs/example.toml``.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from supervisor import childenv
from supervisor._units import MAX_DURATION, parse_duration, parse_positive_duration, parse_signal
from supervisor.errors import ConfigError

ENV_PREFIX = "SUPERVISE_"
FORWARD_POLICIES = ("launcher", "group")
SYNC_KINDS = ("checkpoint", "log")
LAUNCHERS = ("auto", "horovodrun", "mpiexec", "srun", "torchrun", "deepspeed", "csrun", "python", "generic")


STORE_SCHEMES = ("s3://",)
STORE_KEYS = ("endpoint", "region", "aws_profile", "access_key_id", "secret_access_key")  # [[sync]] keys of an s3:// pair


@dataclass(frozen=True)
class StoreSpec:
    """Where an object-store pair's persistent side is: ``s3://bucket/prefix`` and how to reach
    it. Unset fields come from the usual AWS variables and files when the store is opened
    (``supervisor/sync/_store.py``). The secret never shows in a repr, a log or the journal."""

    url: str
    bucket: str
    prefix: str
    endpoint: str | None = None
    region: str | None = None
    aws_profile: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)  # from the leader (``store_keys_path``), not a key

    @staticmethod
    def parse(url: str) -> StoreSpec:
        """``s3://bucket[/prefix]``; ValueError (what would be right) otherwise."""
        if not url.startswith("s3://"):
            raise ValueError("an s3://bucket/prefix URL")
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
            raise ValueError("s3://BUCKET/prefix with a bucket name of 3 to 63 lowercase letters, digits, dots and hyphens")
        prefix = prefix.strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise ValueError("s3://bucket/prefix without empty, . or .. path segments")
        return StoreSpec(url=f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}", bucket=bucket, prefix=prefix)


def is_store(text: object) -> bool:
    """Is a pair's ``to`` an object store (``s3://``) rather than a directory?"""
    return isinstance(text, str) and text.startswith(STORE_SCHEMES)


@dataclass(frozen=True)
class SyncPair:
    """One local → persistent mirror. ``kind`` decides the semantics (docs/sync.md). ``store``:
    the persistent side is an object store (``to = "s3://…"``); ``dst`` then only names it."""

    name: str
    kind: str
    src: Path
    dst: Path
    markers: tuple[str, ...] = ()
    every: float | None = None
    restore: bool = False
    exclude: tuple[str, ...] = ()
    keep_local: int | None = None
    settle: float = 5.0
    fsync: bool = False
    nodes: int = 1  # > 1: every node writes its own part; published once all parts are durable (0: auto, see for_job)
    profile: str = "auto"  # the framework's layout (supervisor/sync/_profiles.py), or auto: detected
    peer_copies: int = 1  # nodes > 1: each node's complete versions copied to the next node's disk too (0: off)
    origin: str = field(default="", compare=False)  # the file that set it: the plan's errors name it
    store: StoreSpec | None = None

    @property
    def where(self) -> str:
        """The persistent side as the user wrote it: a directory, or the ``s3://`` URL."""
        return self.store.url if self.store is not None else str(self.dst)

    def for_job(self, job_nodes: int) -> SyncPair:
        """``nodes = "auto"`` (0) made the job's node count: the plan knows the job, config does not."""
        return replace(self, nodes=max(1, job_nodes)) if self.nodes == 0 else self


# --- converters: each returns the typed value or raises ValueError(what would be right) ---

def _duration(v: Any) -> float:
    d = parse_duration(v)
    if d != d or d in (float("inf"), float("-inf")):
        raise ValueError("a finite duration such as 30s or 10m")
    return d


def _positive_duration(v: Any) -> float:
    """An interval or a timeout: 0 would spin (``--sync-every 0`` took a core) or never wait."""
    return parse_positive_duration(v)


MAX_TIME_LIMIT = 366 * 86400.0  # past any scheduler's limit: a typo (99999999999999h), not a plan


def _opt_duration(v: Any) -> float | None:
    if v in (None, "", "none", "off", 0, "0"):
        return None
    seconds = parse_duration(v)
    if seconds > MAX_TIME_LIMIT:
        raise ValueError("a duration of at most 366 days (no scheduler allows more)")
    return seconds


def _hang_after(v: Any) -> float | None:
    """``auto`` (unset): the learned bound alone; ``off`` or 0: no hang watch (0.0)."""
    if v in (None, "", "auto"):
        return None
    return _opt_duration(v) or 0.0


def _warn_before(v: Any) -> float | None:
    if isinstance(v, str) and v.strip().lower() == "auto":
        return None
    try:
        return parse_duration(v)
    except ValueError:
        raise ValueError("a duration such as 5m, or auto") from None


def _opt_signal(v: Any) -> signal.Signals | None:
    if isinstance(v, str) and v.strip().lower() in ("", "auto", "default", "none", "off"):
        return None
    return parse_signal(v)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false")


def _count(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("a whole number, 0 or more")
    try:
        n = int(v) if isinstance(v, (int, str)) else None
    except ValueError:
        n = None
    if n is None or n < 0:
        raise ValueError("a whole number, 0 or more")
    return n


def _opt_count(v: Any) -> int | None:
    """A whole number, 0 or more; absent (None) means the key's documented default."""
    return None if v is None else _count(v)


def _status(v: Any) -> int | None:
    """An exit status 0-255, or "child": keep the launcher's own."""
    if isinstance(v, str) and v.strip().lower() == "child":
        return None
    try:
        n = _count(v)
    except ValueError:
        n = 256
    if n > 255:
        raise ValueError("an exit status 0-255, or child")
    return n


def _stopped_status(v: Any) -> int | str | None:
    """``auto`` (policy.exit_status: 0 when requeued, 75 when the training is left unfinished),
    an exit status 0-255 whatever happens next, or "child"."""
    if isinstance(v, str) and v.strip().lower() == "auto":
        return "auto"
    try:
        return _status(v)
    except ValueError:
        raise ValueError("auto, an exit status 0-255, or child") from None


def _nice(v: Any) -> int:
    n = _count(v)
    if n > 19:
        raise ValueError("a niceness from 0 to 19")
    return n


def _streams(v: Any) -> int:
    """Parallel copy streams: more than 64 only queues on the metadata servers it meant to spread over."""
    try:
        n = _count(v)
    except ValueError:
        n = 0
    if not 1 <= n <= 64:
        raise ValueError("a number of copy streams from 1 to 64")
    return n


def _choice(*options: str) -> Callable[[Any], str]:
    def convert(v: Any) -> str:
        if not isinstance(v, str) or v.strip().lower() not in options:
            raise ValueError("one of " + ", ".join(options))
        return v.strip().lower()
    return convert


_UNSET_VAR = re.compile(r"\$(\w+|\{[^}]*\})")


def _path(v: Any) -> Path:
    """A path with ``~`` and ``$VARIABLE``s expanded; a variable left unset is an error, not a
    directory literally named ``$LOCAL_DIR`` (os.path.expandvars leaves unknown ones as they are)."""
    if not isinstance(v, (str, os.PathLike)) or not str(v).strip():
        raise ValueError("a path")
    if "\0" in str(v):
        raise ValueError("a path without NUL bytes")
    expanded = os.path.expandvars(os.path.expanduser(str(v)))
    unset = _UNSET_VAR.search(expanded)
    if unset:
        name = unset.group(1).strip("{}")
        raise ValueError(f"a path whose variables are set: ${name} is not set in the environment "
                         f"(export {name}=… in the job script, or write the path out)")
    return Path(expanded)


def _urls(v: Any) -> tuple[str, ...]:
    items = v.split() if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)) or not all(isinstance(u, str) for u in items):
        raise ValueError("a list of http(s) URLs")
    for u in items:
        if not u.startswith(("http://", "https://", "@")):
            raise ValueError("http:// or https:// URLs, or @FILE with one a line (the URL itself is not shown: it may hold a token)")
    return tuple(items)


def _deadline(v: Any) -> float:
    """An absolute end time: ISO 8601 (local time unless it names a zone) or unix seconds."""
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.astimezone()).timestamp()
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        if s.replace(".", "", 1).isdigit():
            return float(s)
        try:
            dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return (dt if dt.tzinfo else dt.astimezone()).timestamp()
    raise ValueError("a time such as 2026-11-21T18:00:00 (local), 2026-11-21T18:00:00Z, or unix seconds")


def _future_deadline(v: Any) -> float:
    """A deadline still ahead and finite: one in the past would stop the training as it starts."""
    t = _deadline(v)
    if not math.isfinite(t) or t > time.time() + MAX_DURATION:
        raise ValueError("a time within the next ten years, such as 2026-11-21T18:00:00")
    if t <= time.time():
        raise ValueError("a time in the future (this one has passed)")
    return t


def _profile(v: Any) -> str:
    """A name; which names exist is the sync part's knowledge, checked by the plan (``Mirror.check``)."""
    if not isinstance(v, str) or not v.strip():
        raise ValueError("auto or a profile name")
    return v.strip()


def _run_dir(v: Any) -> Path:
    return _path(v)


def _opt_path(v: Any) -> Path | None:
    return None if v in (None, "", "none", "off") else _path(v)


def _nodes(v: Any) -> int:
    """How many nodes write parts of each checkpoint: a count, or ``auto`` (0 here; the job's
    node count once the plan knows the job, ``SyncPair.for_job``)."""
    if isinstance(v, str) and v.strip().lower() == "auto":
        return 0
    try:
        n = _count(v)
    except ValueError:
        n = 0
    if n < 1 or n > 100_000:
        raise ValueError("a node count from 1, or auto (the job's node count)")
    return n


def _peer_copies(v: Any) -> int:
    """How many other nodes keep a copy of each node's complete versions (the ring, docs/sync.md)."""
    n = _count(v)
    if n not in (0, 1):
        raise ValueError("0 (off) or 1 (the next node keeps a copy); more copies are not built yet")
    return n


@dataclass(frozen=True)
class Key:
    """One scalar setting: its TOML name (also ``SUPERVISE_<NAME>`` and ``--name``), how a
    value is read, its default, and the help line. The CLI, the TOML and environment readers,
    the Config's defaults and configs/example.toml's check all come from ``KEYS``."""

    name: str
    convert: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str | None = "VALUE"  # None: a switch (--name sets true)
    group: str = "run"
    shown: str | None = None  # the default as --help says it, when not the value itself

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_G_CHILD, _G_SYNC, _G_SAMPLE = "child and signals", "mirroring to persistent storage", "sampling"
_G_END, _G_NOTIFY = "time limit, preemption and requeue", "notifications"
KEYS: tuple[Key, ...] = (
    Key("run_dir", _run_dir, None, "where events.jsonl, gpu.csv, host.csv and supervise.log go; put it on persistent "
        "storage", "DIR", shown="./supervise-JOBID (the batch job's id), or a new timestamped directory"),
    Key("grace", _duration, 30.0, "stop signal → SIGKILL of every process the command started", "DURATION", _G_CHILD, "30s"),
    Key("stop_signal", _opt_signal, None, "what stops the command politely", "SIG", _G_CHILD,
        "the launcher's own: TERM (for srun to its tasks, through scancel --signal); a plain process gets the stop signal supervise got"),
    Key("forward", _choice(*FORWARD_POLICIES), "launcher", "where passed-on signals go: launcher (the launcher process) "
        "or group (its whole process group)", "POLICY", _G_CHILD),
    Key("launcher", _choice(*LAUNCHERS), "auto", "override launcher detection (" + ", ".join(LAUNCHERS) + ")", "NAME", _G_CHILD),
    Key("sync_every", _positive_duration, 600.0, "safety-net period; changes trigger a sync sooner", "DURATION", _G_SYNC, "10m"),
    Key("sync_backend", _choice("auto", "rsync", "python"), "auto", "auto (rsync if on PATH), rsync, or python", "NAME", _G_SYNC),
    Key("sync_nice", _nice, 10, "CPU niceness of copies (0-19)", "N", _G_SYNC),
    Key("sync_ionice", _choice("idle", "best-effort", "none"), "idle", "I/O class of copies: idle, best-effort or none",
        "CLASS", _G_SYNC),
    Key("sync_streams", _streams, 2, "parallel copy streams per checkpoint (1-64), each copying a share of its "
        "files; raise it on a parallel file system with many servers", "N", _G_SYNC),
    Key("gpu_every", _duration, 10.0, "GPU and host sampling period; 0 disables", "DURATION", _G_SAMPLE, "10s"),
    Key("gpu_backend", _choice("auto", "nvml", "dmon", "none"), "auto", "auto, nvml, dmon or none", "NAME", _G_SAMPLE),
    Key("dmon_log", _bool, False, "keep nvidia-smi dmon's raw output beside gpu.csv", None, _G_SAMPLE),
    Key("time_limit", _opt_duration, None, "the job ends this long after supervise starts (overrides the scheduler)",
        "DURATION", _G_END, "the scheduler's"),
    Key("deadline", _future_deadline, None, "the job ends at this time, e.g. 2026-11-21T18:00:00 (overrides the scheduler)",
        "TIME", _G_END, "the scheduler's"),
    Key("warn_before", _warn_before, None, "start the stop sequence this long before the end", "DURATION|auto", _G_END,
        "auto: learned from earlier attempts"),
    Key("checkpoint_signal", _opt_signal, None, "what 'checkpoint now' sends to the training", "SIG", _G_END, "per launcher"),
    Key("warn_signal", _opt_signal, signal.SIGUSR2, "a signal that means 'the end is near' (as sent by "
        "#SBATCH --signal=B:USR2@600); none to pass it on", "SIG", _G_END, "USR2"),
    Key("checkpoint_timeout", _positive_duration, 600.0, "how long to wait for the requested checkpoint", "DURATION", _G_END, "10m"),
    Key("requeue", _bool, False, "requeue the job after a deadline or a preemption", None, _G_END),
    Key("max_requeues", _count, 3, "stop requeueing after N requeues", "N", _G_END),
    Key("requeue_on_failure", _bool, False, "also requeue after the training failed", None, _G_END),
    Key("no_progress_attempts", _count, 2, "do not requeue when no new checkpoint was published in the last N "
        "attempts (exit status 3); 0: off", "N", _G_END),
    Key("stopped_status", _stopped_status, "auto", "the exit status when supervise stopped the training cleanly "
        "(checkpoint durable, no SIGKILL), whatever the launcher's; auto: 0 when the job is requeued, 75 when not (the "
        "training is unfinished: --dependency=afterok must not start the next stage; a stop that was not clean and "
        "left 0 exits 75 too); child: the launcher's own", "auto|STATUS|child", _G_END),
    Key("not_durable_status", _status, 74, "the exit status when the run ends with checkpoints or logs not on "
        "persistent storage (end.not_durable) and would otherwise look successful (a clean stop, or the training said "
        "0), unless requeued; child: the status it would have without them", "STATUS|child", _G_END),
    Key("max_restarts", _count, 0, "restart a crashed training in place up to N times", "N", _G_END),
    Key("spare_nodes", _count, 0, "keep N of the job's nodes as spares: the training runs on the others, and a "
        "node that dies is replaced by a spare inside the allocation, with no requeue (the job script needs "
        "#SBATCH --no-kill; docs/multinode.md, \"Spare nodes\")", "N", _G_END),
    Key("max_node_replacements", _opt_count, None, "replace at most N dead nodes inside the allocation, then "
        "requeue as without spares", "N", _G_END, "the spares"),
    Key("restart_backoff", _duration, 10.0, "wait before an in-place restart, doubled each time", "DURATION", _G_END, "10s"),
    Key("hang_after", _hang_after, None, "no checkpoint, no log growth (and idle GPUs) this long → hang; the "
        "upper bound of the learned one (5x the longest normal gap); auto: the learned one alone; off", "DURATION",
        _G_END, "auto"),
    Key("hang_floor", _positive_duration, 600.0, "the learned hang bound is never shorter than this", "DURATION",
        _G_END, "10m"),
    Key("hang_action", _choice("report", "stop"), "report", "report or stop", "ACTION", _G_END),
    Key("suspect_nodes", _opt_path, None, "a node list shared by the project's jobs (on persistent storage): a suspect "
        "node is added, and requeues leave out the nodes it lists (docs/slurm.md)", "FILE", _G_END),
    Key("suspect_nodes_ttl", _positive_duration, 86400.0, "how long an entry of the suspect-node list holds",
        "DURATION", _G_END, "24h"),
    Key("notify", _urls, (), "webhook to tell of start, warning, preemption, requeue, end; repeatable (never logged)",
        "URL", _G_NOTIFY, "none"),
    Key("notify_format", _choice("json", "slack", "teams", "ntfy"), "json", "json, slack, teams or ntfy", "FORMAT", _G_NOTIFY),
    Key("notify_timeout", _positive_duration, 5.0, "per-attempt deadline of a webhook post", "DURATION", _G_NOTIFY, "5s"),
)
AGENT_GROUPS = (_G_SYNC, _G_SAMPLE)  # what a node agent runs by, besides the pairs (agent_view)
SCALAR_KEYS: dict[str, Callable[[Any], Any]] = {k.name: k.convert for k in KEYS}
DEFAULT: dict[str, Any] = {k.name: k.default for k in KEYS}
SECRET_KEYS = frozenset({"notify"})
SYNC_KEYS = ("name", "kind", "from", "to", "markers", "every", "restore", "exclude", "keep_local", "settle", "fsync", "profile",
             "nodes", "peer_copies", *STORE_KEYS)
TOP_LEVEL_TABLES = ("sync",)


@dataclass(frozen=True)
class Config:
    """Everything one supervised run needs to know, validated."""

    command: tuple[str, ...] = ()
    run_dir: Path | None = DEFAULT["run_dir"]
    config_file: Path | None = None
    # child and signals
    grace: float = DEFAULT["grace"]
    stop_signal: signal.Signals | None = DEFAULT["stop_signal"]  # None: the launcher's own (launchers.py)
    forward: str = DEFAULT["forward"]
    launcher: str = DEFAULT["launcher"]
    # sync
    sync: tuple[SyncPair, ...] = ()
    sync_every: float = DEFAULT["sync_every"]
    sync_backend: str = DEFAULT["sync_backend"]
    sync_nice: int = DEFAULT["sync_nice"]
    sync_ionice: str = DEFAULT["sync_ionice"]
    sync_streams: int = DEFAULT["sync_streams"]
    # sampling
    gpu_every: float = DEFAULT["gpu_every"]
    gpu_backend: str = DEFAULT["gpu_backend"]
    dmon_log: bool = DEFAULT["dmon_log"]
    # deadline and stop
    time_limit: float | None = DEFAULT["time_limit"]
    deadline: float | None = DEFAULT["deadline"]
    warn_before: float | None = DEFAULT["warn_before"]  # None means "auto"
    checkpoint_signal: signal.Signals | None = DEFAULT["checkpoint_signal"]  # None: the launcher's default
    warn_signal: signal.Signals | None = DEFAULT["warn_signal"]  # "the end is near", e.g. --signal=B:USR2@600
    checkpoint_timeout: float = DEFAULT["checkpoint_timeout"]
    # requeue and restarts
    requeue: bool = DEFAULT["requeue"]
    max_requeues: int = DEFAULT["max_requeues"]
    requeue_on_failure: bool = DEFAULT["requeue_on_failure"]
    no_progress_attempts: int = DEFAULT["no_progress_attempts"]
    stopped_status: int | str | None = DEFAULT["stopped_status"]  # "auto"; None: the launcher's own status
    not_durable_status: int | None = DEFAULT["not_durable_status"]  # None: the status it would have
    max_restarts: int = DEFAULT["max_restarts"]
    spare_nodes: int = DEFAULT["spare_nodes"]
    max_node_replacements: int | None = DEFAULT["max_node_replacements"]  # None: as many as the spares
    restart_backoff: float = DEFAULT["restart_backoff"]
    hang_after: float | None = DEFAULT["hang_after"]  # None: learned alone; 0.0: off
    hang_floor: float = DEFAULT["hang_floor"]
    hang_action: str = DEFAULT["hang_action"]
    suspect_nodes: Path | None = DEFAULT["suspect_nodes"]
    suspect_nodes_ttl: float = DEFAULT["suspect_nodes_ttl"]
    # notifications (URLs are secrets: never logged)
    notify: tuple[str, ...] = DEFAULT["notify"]
    notify_format: str = DEFAULT["notify_format"]
    notify_timeout: float = DEFAULT["notify_timeout"]
    # logs
    verbosity: int = 0
    warnings: tuple[str, ...] = field(default=(), compare=False)



def _did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
    import difflib  # only for a mistake

    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _shown(key: str, value: Any) -> Any:
    return "<hidden>" if key in SECRET_KEYS else value


def _convert(key: str, value: Any, source: str) -> Any:
    try:
        return SCALAR_KEYS[key](value)
    except ValueError as e:
        raise ConfigError(key, _shown(key, value), f"expected {e}", source) from None


def load_toml(path: Path) -> dict[str, Any]:
    """Read a config file; unreadable or malformed files are usage errors."""
    if sys.version_info >= (3, 11):  # imported here: a run without --config does not pay for it
        import tomllib  # novermin - 3.11 and later
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("--config", str(path), "no such file") from None
    except IsADirectoryError:
        raise ConfigError("--config", str(path), "is a directory, expected a TOML file") from None
    except PermissionError:
        raise ConfigError("--config", str(path), "not readable (permission denied)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", str(path), f"not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError("--config", str(path), f"not UTF-8 text (byte {e.start}); TOML files are UTF-8") from None


def _from_file(data: Mapping[str, Any], path: Path) -> tuple[dict[str, Any], list[SyncPair]]:
    values: dict[str, Any] = {}
    pairs: list[SyncPair] = []
    source = str(path)
    for key, value in data.items():
        if key == "sync":
            if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
                raise ConfigError("sync", value, "expected [[sync]] tables", source)
            pairs.extend(_sync_table(t, i, path) for i, t in enumerate(value))
        elif key in SCALAR_KEYS:
            values[key] = _convert(key, value, source)
        elif isinstance(value, dict):
            raise ConfigError(key, "{...}", f"unknown table{_did_you_mean(key, TOP_LEVEL_TABLES)}", source)
        else:
            raise ConfigError(key, _shown(key, value), f"unknown key{_did_you_mean(key, list(SCALAR_KEYS) + list(TOP_LEVEL_TABLES))}", source)
    return values, pairs


_PAIR = SyncPair("", "checkpoint", Path(), Path())  # a pair's defaults, written once (in SyncPair)


def _sync_table(t: Mapping[str, Any], index: int, path: Path) -> SyncPair:
    where = f"sync[{index}]"
    source = str(path)
    for key in t:
        if key not in SYNC_KEYS:
            raise ConfigError(f"{where}.{key}", t[key], f"unknown key{_did_you_mean(key, SYNC_KEYS)}", source)
    for key in ("from", "to"):
        if key not in t:
            raise ConfigError(f"{where}.{key}", None, "missing: every [[sync]] table needs from and to", source)
    base = path.parent

    def conv(key: str, fn: Callable[[Any], Any], default: Any) -> Any:
        if key not in t:
            return default
        try:
            return fn(t[key])
        except ValueError as e:
            raise ConfigError(f"{where}.{key}", t[key], f"expected {e}", source) from None

    def globs(v: Any) -> tuple[str, ...]:
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(g, str) and g for g in v):
            raise ValueError("a list of glob patterns")
        return tuple(v)

    def keep(v: Any) -> int | None:
        n = _count(v)
        if n < 1:
            raise ValueError("1 or more (leave it out to keep every local checkpoint)")
        return n

    def settle(v: Any) -> float:
        return parse_duration(v)

    def patterns(v: Any) -> tuple[str, ...]:
        out = globs(v)
        for g in out:
            if not g.strip("/") or "\0" in g:
                raise ValueError(f"a file or directory pattern, not {g!r}")
        return out

    kind = conv("kind", _choice(*SYNC_KINDS), "checkpoint")
    src = conv("from", _path, None)
    store = conv("to", StoreSpec.parse, None) if is_store(t["to"]) else None
    dst = Path(store.url) if store is not None else conv("to", _path, None)
    src = src if src.is_absolute() else base / src
    dst = dst if dst.is_absolute() or store is not None else base / dst
    given = {k: t[k] for k in STORE_KEYS if k in t}
    for key, value in given.items():
        if store is None:
            raise ConfigError(f"{where}.{key}", "<hidden>" if "secret" in key else value,
                              "only for an object-store pair (to = \"s3://bucket/prefix\")", source)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}.{key}", "<hidden>" if "secret" in key else value, "a non-empty string", source)
    if store is not None:
        store = replace(store, **given)
    return SyncPair(
        name=conv("name", lambda v: v if isinstance(v, str) and v.strip() else (_ for _ in ()).throw(ValueError("a non-empty name")), ""),
        kind=kind, src=src, dst=dst,
        markers=conv("markers", globs, _PAIR.markers),
        every=conv("every", _opt_duration, _PAIR.every),
        restore=conv("restore", _bool, _PAIR.restore),
        exclude=conv("exclude", patterns, _PAIR.exclude),
        keep_local=conv("keep_local", keep, _PAIR.keep_local),
        settle=conv("settle", settle, _PAIR.settle),
        fsync=conv("fsync", _bool, _PAIR.fsync),
        nodes=conv("nodes", _nodes, _PAIR.nodes),
        peer_copies=conv("peer_copies", _peer_copies, _PAIR.peer_copies),
        profile=conv("profile", _profile, _PAIR.profile),
        origin=source,
        store=store,
    )


def _from_env(env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    warnings: list[str] = []
    known = {ENV_PREFIX + k.upper(): k for k in SCALAR_KEYS}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in childenv.NAMES or name == "SUPERVISE_CONFIG":
            continue
        key = known.get(name)
        if key is None:
            warnings.append(f"ignoring unknown variable {name}{_did_you_mean(name, list(known))}")
            continue
        values[key] = _convert(key, raw, f"environment {name}")
    return values, warnings


def _resolve_pairs(pairs: list[SyncPair]) -> tuple[SyncPair, ...]:
    """Absolute paths and a name for each pair; what a pair means (a known profile, unique
    names, sides that do not overlap, an ``exclude`` that keeps the markers) is checked by
    the plan (``check_pairs`` in supervisor/sync/_checks.py, through ``Mirror.check``), and ``nodes = "auto"``
    resolved there from the job (``SyncPair.for_job``)."""
    out: list[SyncPair] = []
    names = {p.name for p in pairs if p.name}
    for i, p in enumerate(pairs):
        src, dst = p.src.absolute(), p.dst if p.store is not None else p.dst.absolute()
        if p.nodes != 1 and p.kind != "checkpoint":
            raise ConfigError(f"sync {p.name or i}.nodes", p.nodes or "auto",
                              "only checkpoint pairs are mirrored per node; log pairs are the leader's", p.origin)
        name = p.name
        if not name:  # a name of our own never takes one the user gave
            base = name = src.name or f"pair{i}"
            n = 2
            while name in names:
                name, n = f"{base}-{n}", n + 1
            names.add(name)
        out.append(replace(p, name=name, src=src, dst=dst))
    return tuple(out)


def default_run_dir(job_id: str | None, cwd: Path) -> Path:
    """Stable across requeues of one job (so attempts append), unique per local run.
    ``job_id``: the batch job's, as its scheduler names run directories (``sched.run_dir_id``)."""
    if job_id:
        return cwd / f"supervise-{job_id}"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return cwd / f"supervise-{stamp}-{os.getpid()}"


def check_run_dir(path: Path) -> None:
    """Create the run directory and prove it writable, or raise one clear line."""
    from supervisor.journal import check_run_dir_safe, open_own_file

    unsafe = check_run_dir_safe(path)  # issue 14: others must not plant links in it
    if unsafe:
        raise ConfigError("run_dir", str(path), unsafe)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError("run_dir", str(path), "exists and is not a directory") from None
    except OSError as e:
        raise ConfigError("run_dir", str(path), f"cannot be created: {e.strerror}") from None
    probe = path / f".supervise-write-test-{os.getpid()}"
    try:
        os.close(open_own_file(probe, append=False))  # O_EXCL|O_NOFOLLOW: never a planted link
        probe.unlink()
    except OSError as e:
        raise ConfigError("run_dir", str(path), f"is not writable: {e.strerror}") from None


def build_config(
    *,
    flags: Mapping[str, Any],
    flag_pairs: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    command: tuple[str, ...] = (),
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    require_command: bool = True,
    create_run_dir: bool = True,
    flag_nodes: str | None = None,
    pair_flags: Mapping[str, Any] | None = None,
    job_id: str | None = None,
) -> Config:
    """Merge file < env < flags, validate everything, and return the frozen Config.

    ``flags`` holds only the flags the user gave (already typed by the CLI as raw strings);
    ``flag_pairs`` are ``(kind, local, persistent)`` from ``--checkpoints``/``--logs``;
    ``flag_nodes`` (``--nodes``) is the node count of the ``--checkpoints`` pairs, and
    ``pair_flags`` their other options (``restore``, ``markers``, ``settle``, ``profile``).
    ``job_id`` names the default run directory (the caller asks the scheduler: config knows none).
    """
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    config_file = config_file or (Path(env["SUPERVISE_CONFIG"]) if env.get("SUPERVISE_CONFIG") else None)
    values: dict[str, Any] = {}
    pairs: list[SyncPair] = []
    if config_file is not None:
        file_values, pairs = _from_file(load_toml(config_file), config_file)
        values.update(file_values)
    env_values, warnings = _from_env(env)
    values.update(env_values)
    for key, raw in flags.items():
        values[key] = _convert(key, raw, "--" + key.replace("_", "-"))
    nodes = 1
    if flag_nodes is not None:
        try:
            nodes = _nodes(flag_nodes)
        except ValueError as e:
            raise ConfigError("nodes", flag_nodes, f"expected {e}", "--nodes") from None
    extra = _checkpoint_flags(pair_flags or {})
    for kind, local, persistent in flag_pairs:
        store = _store_flag(kind, persistent)
        pairs.append(SyncPair(name="", kind=kind, src=_abs(local, cwd), dst=Path(store.url) if store else _abs(persistent, cwd),
                              store=store,
                              nodes=nodes if kind == "checkpoint" else 1, **(extra if kind == "checkpoint" else {})))

    if require_command and not command:
        raise ConfigError("command", "", "missing: put the training command after --, e.g. supervise -- python train.py")
    if "time_limit" in values and values.get("deadline") is not None and values["time_limit"] is not None:
        raise ConfigError("time_limit", values["time_limit"], "give --time-limit or --deadline, not both")
    if values.get("gpu_every", 10.0) and values.get("gpu_every", 10.0) < 0.1:
        raise ConfigError("gpu_every", values["gpu_every"], "expected 0 (off) or at least 0.1s")
    if values.get("grace", 30.0) > 24 * 3600:
        raise ConfigError("grace", values["grace"], "expected at most 24h")

    run_dir = values.pop("run_dir", None)
    run_dir = _abs(run_dir, cwd) if run_dir is not None else default_run_dir(job_id, cwd)
    cfg = Config(
        command=tuple(command),
        run_dir=run_dir,
        config_file=config_file,
        sync=_resolve_pairs(pairs),
        warnings=tuple(warnings),
        **values,
    )
    if create_run_dir:
        check_run_dir(run_dir)
    return cfg


LEADER_SOURCE = "the leader's configuration (--leader-config)"  # how errors name it
_FILE_NAMES = {"src": "from", "dst": "to"}  # SyncPair field → its key in a [[sync]] table


def _file_form(v: Any) -> Any:
    """A resolved value as a config file writes it, which its converter reads back the same."""
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, tuple):
        return [_file_form(x) for x in v]
    if isinstance(v, signal.Signals):
        return v.name
    return v


def agent_view(cfg: Config) -> dict[str, Any]:
    """The leader's resolved settings that its node agents run by (``AGENT_GROUPS``) and every
    pair, whole, in the config file's own form: the agent reads them with the file reader and
    its checks (``from_leader``), so what came from a file, ``SUPERVISE_*`` variables or flags
    reaches it alike, per pair, and a new key or pair field travels without a line here. No
    secret is in it (``notify`` is not what an agent runs by)."""
    out: dict[str, Any] = {k.name: _file_form(getattr(cfg, k.name)) for k in KEYS
                           if k.group in AGENT_GROUPS and getattr(cfg, k.name) is not None}
    out["sync"] = [pair_view(p) for p in cfg.sync]
    return out


def pair_view(p: SyncPair) -> dict[str, Any]:
    """One pair as a ``[[sync]]`` table (None: left out, the default); ``nodes = "auto"`` as such.
    An object store's URL as written, with its settings but never its secret key: this goes on
    the agents' command line, which every user of a node can read (``store_keys`` carries it)."""
    out = {_FILE_NAMES.get(f.name, f.name): _file_form(getattr(p, f.name)) for f in fields(p)
           if f.name not in ("origin", "store") and getattr(p, f.name) is not None}
    if p.nodes == 0:
        out["nodes"] = "auto"
    if p.store is not None:
        out["to"] = p.store.url
        out.update({k: getattr(p.store, k) for k in STORE_KEYS if k != "secret_access_key" and getattr(p.store, k)})
    return out


STORE_KEYS_FILE = "store-keys.json"  # RUN/nodes/: how the leader reached each object store (mode 0600; sync/_store.py)


def store_keys_path(run_dir: Path) -> Path:
    return run_dir / "nodes" / STORE_KEYS_FILE


def _with_store_keys(pairs: list[SyncPair], run_dir: Path) -> list[SyncPair]:
    """A node agent's pairs with the way in its leader resolved for each object store (endpoint,
    region, keys: ``Mirror.share_access``), where the pair sets none itself: the agent then
    needs no AWS variable (pbsdsh forwards none; no secret goes on a command line)."""
    if not any(p.store is not None for p in pairs):
        return pairs
    try:
        known = json.loads(store_keys_path(run_dir).read_text())
    except (OSError, ValueError):
        return pairs
    out = []
    for p in pairs:
        got = known.get(p.name) if p.store is not None and isinstance(known, dict) else None
        if p.store is not None and isinstance(got, dict):
            fill = {k: v for k, v in got.items() if k in (*STORE_KEYS, "session_token") and isinstance(v, str) and v
                    and not getattr(p.store, k, None)}
            p = replace(p, store=replace(p.store, **fill))
        out.append(p)
    return out


def from_leader(text: str, run_dir: Path, verbosity: int = 0) -> Config:
    """A node agent's Config from its leader's ``agent_view`` (conduct/fleet.py puts it on the
    agents' command line): read as a config file is, and nothing else. The ``SUPERVISE_*``
    variables srun hands the agent were the leader's, already applied there: read again here
    they would undo the leader's flags, which outrank them."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError("--leader-config", text[:80], f"not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError("--leader-config", text[:80], "expected a JSON object")
    values, pairs = _from_file(data, Path(LEADER_SOURCE))
    return Config(run_dir=run_dir, sync=_resolve_pairs(_with_store_keys(pairs, run_dir)), verbosity=verbosity, **values)


def _checkpoint_flags(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``--restore``, ``--marker``, ``--settle``, ``--profile``: fields of the ``--checkpoints`` pairs."""
    out: dict[str, Any] = {}
    for key, fn in (("restore", _bool), ("settle", _duration), ("profile", _profile)):
        if raw.get(key) is not None:
            try:
                out[key] = fn(raw[key])
            except ValueError as e:
                raise ConfigError(key, raw[key], f"expected {e}", "--" + key) from None
    if raw.get("markers"):
        out["markers"] = tuple(raw["markers"])
    return out


def _store_flag(kind: str, persistent: str) -> StoreSpec | None:
    """``--checkpoints LOCAL s3://bucket/prefix``: an object store, reached through the AWS variables."""
    if not is_store(persistent):
        return None
    try:
        return StoreSpec.parse(persistent)
    except ValueError as e:
        raise ConfigError(f"--{kind}s", persistent, f"expected {e}") from None


def _abs(p: str | Path, cwd: Path) -> Path:
    if "\0" in str(p):
        raise ConfigError("path", str(p).replace("\0", "\\0"), "contains a NUL byte")
    path = Path(os.path.expanduser(str(p)))
    return path if path.is_absolute() else cwd / path


def public_view(cfg: Config) -> dict[str, Any]:
    """The config as the journal records it: secrets hidden, types made plain."""
    out: dict[str, Any] = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if f.name in SECRET_KEYS:
            v = len(v)
        elif f.name == "sync":
            v = [{k: (str(x) if isinstance(x, Path) else x) for k, x in vars(p).items() if k != "origin"} for p in v]
        elif isinstance(v, Path):
            v = str(v)
        elif isinstance(v, signal.Signals):
            v = v.name
        out[f.name] = v
    return out
