"""One frozen, validated Config from a TOML file, ``SUPERVISE_*`` variables and flags.

Precedence is file < environment < flags. Everything is checked here, before anything is
started, and every failure is one ``ConfigError`` line naming the key, the value and
what would be right (exit status 2). Keys are documented in ``configs/example.toml``.
"""

from __future__ import annotations

import difflib
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from supervisor._units import MAX_DURATION, parse_duration, parse_positive_duration, parse_signal
from supervisor.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ENV_PREFIX = "SUPERVISE_"
# Variables supervise itself sets for the child; never read as configuration.
CHILD_ENV = frozenset({"SUPERVISE_RUN_DIR_ACTIVE", "SUPERVISE_ATTEMPT", "SUPERVISE_CHECKPOINT_REQUEST",
                       "SUPERVISE_RESTORED_FROM", "SUPERVISE_CHECKPOINT_SIGNAL", "SUPERVISE_NODE_RANK"})
FORWARD_POLICIES = ("launcher", "group")
SYNC_KINDS = ("checkpoint", "log")
LAUNCHERS = ("auto", "horovodrun", "mpiexec", "srun", "torchrun", "deepspeed", "csrun", "python", "generic")


@dataclass(frozen=True)
class SyncPair:
    """One local → persistent mirror. ``kind`` decides the semantics (docs/sync.md)."""

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
    nodes: int = 1  # > 1: every node writes its own part; published once all parts are durable (0: auto, resolved)
    profile: str = "auto"  # the framework's layout (supervisor/sync/_profiles.py), or auto: detected


@dataclass(frozen=True)
class Config:
    """Everything one supervised run needs to know, validated."""

    command: tuple[str, ...] = ()
    run_dir: Path | None = None
    config_file: Path | None = None
    # child and signals
    grace: float = 30.0
    stop_signal: signal.Signals = signal.SIGTERM
    forward: str = "launcher"
    launcher: str = "auto"
    # sync
    sync: tuple[SyncPair, ...] = ()
    sync_every: float = 600.0
    sync_backend: str = "auto"
    sync_nice: int = 10
    sync_ionice: str = "idle"
    # sampling
    gpu_every: float = 10.0
    gpu_backend: str = "auto"
    dmon_log: bool = False
    # deadline and stop
    time_limit: float | None = None
    deadline: float | None = None
    warn_before: float | None = None  # None means "auto"
    checkpoint_signal: signal.Signals | None = None  # None: the launcher's default
    warn_signal: signal.Signals | None = signal.SIGUSR2  # "the end is near", e.g. --signal=B:USR2@600
    checkpoint_timeout: float = 600.0
    # requeue and restarts
    requeue: bool = False
    max_requeues: int = 3
    requeue_on_failure: bool = False
    max_restarts: int = 0
    restart_backoff: float = 10.0
    hang_after: float | None = None
    hang_action: str = "report"
    # notifications (URLs are secrets: never logged)
    notify: tuple[str, ...] = ()
    notify_format: str = "json"
    notify_timeout: float = 5.0
    # logs
    verbosity: int = 0
    warnings: tuple[str, ...] = field(default=(), compare=False)


# --- converters: each returns the typed value or raises ValueError(what would be right) ---

def _duration(v: Any) -> float:
    return parse_duration(v)


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


def _warn_before(v: Any) -> float | None:
    if isinstance(v, str) and v.strip().lower() == "auto":
        return None
    try:
        return parse_duration(v)
    except ValueError:
        raise ValueError("a duration such as 5m, or auto") from None


def _signal(v: Any) -> signal.Signals:
    return parse_signal(v)


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


def _nice(v: Any) -> int:
    n = _count(v)
    if n > 19:
        raise ValueError("a niceness from 0 to 19")
    return n


def _choice(*options: str) -> Callable[[Any], str]:
    def convert(v: Any) -> str:
        if not isinstance(v, str) or v.strip().lower() not in options:
            raise ValueError("one of " + ", ".join(options))
        return v.strip().lower()
    return convert


def _path(v: Any) -> Path:
    if not isinstance(v, (str, os.PathLike)) or not str(v).strip():
        raise ValueError("a path")
    return Path(os.path.expandvars(os.path.expanduser(str(v))))


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
    from supervisor.sync._profiles import NAMES

    if not isinstance(v, str) or v not in ("auto", *NAMES):
        raise ValueError("auto or one of " + ", ".join(NAMES))
    return v


def _run_dir(v: Any) -> Path:
    return _path(v)


def _nodes(v: Any) -> int:
    """How many nodes write parts of each checkpoint: a count, or ``auto`` (0 here; the job's
    node count once the environment is known, in ``build_config``)."""
    if isinstance(v, str) and v.strip().lower() == "auto":
        return 0
    try:
        n = _count(v)
    except ValueError:
        n = 0
    if n < 1 or n > 100_000:
        raise ValueError("a node count from 1, or auto (the job's node count)")
    return n


# Scalar keys: TOML name → (converter, Config field). Flags and SUPERVISE_* use the same names.
SCALAR_KEYS: dict[str, Callable[[Any], Any]] = {
    "run_dir": _run_dir,
    "grace": _duration,
    "stop_signal": _signal,
    "forward": _choice(*FORWARD_POLICIES),
    "launcher": _choice(*LAUNCHERS),
    "sync_every": _positive_duration,
    "sync_backend": _choice("auto", "rsync", "python"),
    "sync_nice": _nice,
    "sync_ionice": _choice("idle", "best-effort", "none"),
    "gpu_every": _duration,
    "gpu_backend": _choice("auto", "nvml", "dmon", "none"),
    "dmon_log": _bool,
    "time_limit": _opt_duration,
    "deadline": _future_deadline,
    "warn_before": _warn_before,
    "checkpoint_signal": _opt_signal,
    "warn_signal": _opt_signal,
    "checkpoint_timeout": _positive_duration,
    "requeue": _bool,
    "max_requeues": _count,
    "requeue_on_failure": _bool,
    "max_restarts": _count,
    "restart_backoff": _duration,
    "hang_after": _opt_duration,
    "hang_action": _choice("report", "stop"),
    "notify": _urls,
    "notify_format": _choice("json", "slack", "teams", "ntfy"),
    "notify_timeout": _positive_duration,
}
SECRET_KEYS = frozenset({"notify"})
SYNC_KEYS = ("name", "kind", "from", "to", "markers", "every", "restore", "exclude", "keep_local", "settle", "fsync", "profile",
             "nodes")
TOP_LEVEL_TABLES = ("sync",)


def _did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
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
        from supervisor.sync._exclude import check_pattern

        out = globs(v)
        for g in out:
            check_pattern(g)
        return out

    kind = conv("kind", _choice(*SYNC_KINDS), "checkpoint")
    src = conv("from", _path, None)
    dst = conv("to", _path, None)
    src = src if src.is_absolute() else base / src
    dst = dst if dst.is_absolute() else base / dst
    return SyncPair(
        name=conv("name", lambda v: v if isinstance(v, str) and v.strip() else (_ for _ in ()).throw(ValueError("a non-empty name")), ""),
        kind=kind, src=src, dst=dst,
        markers=conv("markers", globs, ()),
        every=conv("every", _opt_duration, None),
        restore=conv("restore", _bool, False),
        exclude=conv("exclude", patterns, ()),
        keep_local=conv("keep_local", keep, None),
        settle=conv("settle", settle, 5.0),
        fsync=conv("fsync", _bool, False),
        nodes=conv("nodes", _nodes, 1),
        profile=conv("profile", _profile, "auto"),
    )


def _from_env(env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    warnings: list[str] = []
    known = {ENV_PREFIX + k.upper(): k for k in SCALAR_KEYS}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in CHILD_ENV or name == "SUPERVISE_CONFIG":
            continue
        key = known.get(name)
        if key is None:
            warnings.append(f"ignoring unknown variable {name}{_did_you_mean(name, list(known))}")
            continue
        values[key] = _convert(key, raw, f"environment {name}")
    return values, warnings


def job_nodes(env: Mapping[str, str]) -> int:
    """The job's node count (``nodes = "auto"``): from the scheduler's environment, 1 outside one."""
    from supervisor.job import detect_job

    try:
        return max(1, detect_job(env).num_nodes)
    except Exception:  # noqa: BLE001 - an unreadable nodefile means one node, not a crash
        return 1


def _resolve_pairs(pairs: list[SyncPair], env: Mapping[str, str] | None = None) -> tuple[SyncPair, ...]:
    """Absolute paths, unique names, node counts, and no pair that would copy into itself."""
    out: list[SyncPair] = []
    names: set[str] = set()
    for i, p in enumerate(pairs):
        src, dst = p.src.absolute(), p.dst.absolute()
        key = f"sync {p.name or i}"
        if p.nodes != 1 and p.kind != "checkpoint":
            raise ConfigError(f"{key}.nodes", p.nodes or "auto",
                              "only checkpoint pairs are mirrored per node; log pairs are the leader's")
        if p.nodes == 0:
            p = replace(p, nodes=job_nodes(os.environ if env is None else env))
        if p.kind == "checkpoint" and p.exclude:
            _check_markers_kept(p, key)
        if os.path.realpath(src) == os.path.realpath(dst):
            raise ConfigError(key, f"{src} -> {dst}", "local and persistent sides are the same path")
        rs, rd = Path(os.path.realpath(src)), Path(os.path.realpath(dst))
        if rd.is_relative_to(rs) or rs.is_relative_to(rd):
            raise ConfigError(key, f"{src} -> {dst}", "one side is inside the other; mirror into a separate directory")
        name = p.name or src.name or f"pair{i}"
        base, n = name, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        if p.name and p.name in names:
            raise ConfigError(key, p.name, "names of [[sync]] pairs must be unique")
        names.add(name)
        out.append(replace(p, name=name, src=src, dst=dst))
    return tuple(out)


def _check_markers_kept(p: SyncPair, key: str) -> None:
    """An ``exclude`` that hides a profile's marker would keep every checkpoint unpublished."""
    from supervisor.sync._exclude import excluded_path
    from supervisor.sync._profiles import marker_examples

    for profile, path in marker_examples(p.profile, p.markers):
        for pattern in p.exclude:
            if excluded_path(path, (pattern,)):
                hint = "" if p.profile != "auto" else f"; set profile = \"{profile}\" if only that one applies"
                raise ConfigError(f"{key}.exclude", pattern,
                                  f"would exclude {path}, the {profile} marker, and nothing would ever be published "
                                  f"(anchor it: /{pattern.lstrip('/')} matches only the pair's top level{hint})")


def default_run_dir(env: Mapping[str, str], cwd: Path) -> Path:
    """Stable across requeues of one job (so attempts append), unique per local run."""
    job = env.get("SLURM_JOB_ID") or env.get("PBS_JOBID", "").split(".")[0]
    if job:
        return cwd / f"supervise-{job}"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return cwd / f"supervise-{stamp}-{os.getpid()}"


def check_persistent_sides(pairs: tuple[SyncPair, ...]) -> None:
    """A persistent side others can plant links in (writable by all, not sticky and ours) is
    refused: staging and temp names are created there."""
    from supervisor.journal import check_run_dir_safe

    for p in pairs:
        unsafe = check_run_dir_safe(p.dst)
        if unsafe:
            raise ConfigError(f"sync {p.name}.to", str(p.dst), f"persistent side {unsafe}")


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
) -> Config:
    """Merge file < env < flags, validate everything, and return the frozen Config.

    ``flags`` holds only the flags the user gave (already typed by the CLI as raw strings);
    ``flag_pairs`` are ``(kind, local, persistent)`` from ``--checkpoints``/``--logs``;
    ``flag_nodes`` (``--nodes``) is the node count of the ``--checkpoints`` pairs, and
    ``pair_flags`` their other options (``restore``, ``markers``, ``settle``, ``profile``).
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
        pairs.append(SyncPair(name="", kind=kind, src=_abs(local, cwd), dst=_abs(persistent, cwd),
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
    run_dir = _abs(run_dir, cwd) if run_dir is not None else default_run_dir(env, cwd)
    cfg = Config(
        command=tuple(command),
        run_dir=run_dir,
        config_file=config_file,
        sync=_resolve_pairs(pairs, env),
        warnings=tuple(warnings),
        **values,
    )
    if create_run_dir:
        check_persistent_sides(cfg.sync)  # issue 14: before anything is created
        check_run_dir(run_dir)
    return cfg


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


def _abs(p: str | Path, cwd: Path) -> Path:
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
            v = [{k: (str(x) if isinstance(x, Path) else x) for k, x in vars(p).items()} for p in v]
        elif isinstance(v, Path):
            v = str(v)
        elif isinstance(v, signal.Signals):
            v = v.name
        out[f.name] = v
    return out
