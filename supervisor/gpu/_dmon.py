"""The fallback backend: ``nvidia-smi dmon`` as one long-lived subprocess.

Used when NVML cannot be loaded from Python but ``nvidia-smi`` works (a container with the
binary but not the library path, an odd driver install). One ``dmon`` process prints a
line per GPU per period; we read what has arrived at each tick. Columns vary by driver
and ``-s`` groups, so lines are parsed by the names in the last ``#`` header, never by
position; ``-`` means "not available".
"""

from __future__ import annotations

import os
import signal
import select as _select_mod
import shutil
import subprocess
import time
from typing import Any, Iterable, Iterator, Mapping

from supervisor.gpu._select import select
from supervisor.gpu._types import DeviceInfo, EnergyMeter, GpuSample, GpuUnavailable, Opened

DMON_GROUPS = "pucm"  # power/temp, utilisation, clocks, frame-buffer memory


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "-", "N/A", "[N/A]"


class DmonParser:
    """Turns dmon output lines into dicts keyed by header name (values as strings)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.units: list[str] = []

    def feed(self, line: str) -> dict[str, str] | None:
        line = line.strip()
        if not line:
            return None
        if line.startswith("#"):
            fields = line[1:].split()
            # The first header names columns, the second gives units; both start with '#'.
            if "gpu" in fields:
                self.names = fields
            else:
                self.units = fields
            return None
        values = line.split()
        if not self.names or len(values) != len(self.names):
            return None  # a line we cannot place (no header yet, or truncated)
        return dict(zip(self.names, values))


def parse_dmon(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    p = DmonParser()
    for line in lines:
        row = p.feed(line)
        if row is not None:
            yield row


def row_to_sample(row: Mapping[str, str], dev: DeviceInfo, t: float) -> GpuSample:
    """dmon columns → a GpuSample (``fb`` is MiB used; ``sm``/``mem`` are the NVML rates)."""
    fb = _num(row.get("fb", "-"))
    return GpuSample(
        t=t, index=dev.index, uuid=dev.uuid,
        util_gpu=_num(row.get("sm", "-")), util_mem=_num(row.get("mem", "-")),
        mem_used=int(fb * 2**20) if fb is not None else None, mem_total=dev.memory_total,
        power_w=_num(row.get("pwr", "-")), temp_c=_num(row.get("gtemp", row.get("temp", "-"))),
        sm_mhz=_num(row.get("pclk", "-")), mem_mhz=_num(row.get("mclk", "-")),
    )


QUERY_TIMEOUT = 10.0  # one --query-gpu; a wedged driver makes nvidia-smi hang for good
_live: set[subprocess.Popen[bytes]] = set()


class SmiHung(GpuUnavailable):
    """nvidia-smi did not answer in time: asking again with other fields would hang too."""  # every nvidia-smi of ours still running, for close()


def _query(smi: str, what: str, fields: str, timeout: float = QUERY_TIMEOUT) -> list[list[str]]:
    """One ``nvidia-smi --query-*`` run, killed by pid when ``timeout`` passes.

    It is started from the worker thread that waits for it, with a death signal (the
    thread lives until it returns, so the kernel kills it if supervise dies first, even
    when this call was abandoned), in its own group of our session, and never waited on
    past 2 s.
    """
    from supervisor.child import die_with_us

    argv = [smi, f"--query-{what}={fields}", "--format=csv,noheader,nounits"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=die_with_us(own_group=True))
    _live.add(proc)
    try:
        raw_out, raw_err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise SmiHung(f"nvidia-smi did not answer in {timeout:g}s: killed") from None
    finally:
        _live.discard(proc)
    out, err = raw_out.decode("utf-8", "replace"), raw_err.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise GpuUnavailable(f"nvidia-smi failed: {(out + err).strip()[:200]}")
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL its group; reap it if it goes within 2 s (one stuck in the driver may not)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass


class DmonBackend:
    """Samples through one ``nvidia-smi dmon`` child; ECC at start and end via ``--query-gpu``."""

    name = "dmon"

    def __init__(self, smi: str | None = None, every: float = 1.0, env: Mapping[str, str] | None = None) -> None:
        self._smi = smi
        self._every = every
        self._env = dict(os.environ if env is None else env)
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._parser = DmonParser()
        self._devs: dict[int, DeviceInfo] = {}
        self._energy: dict[int, EnergyMeter] = {}
        self._samples: dict[int, int] = {}
        self._start: dict[int, dict[str, Any]] = {}
        self._notes: list[tuple[str, dict[str, Any]]] = []
        self._restarts = 0

    def drain_notes(self) -> list[tuple[str, dict[str, Any]]]:
        out, self._notes = self._notes, []
        return out

    def open(self, env: Mapping[str, str]) -> Opened:
        smi = self._smi or shutil.which("nvidia-smi", path=self._env.get("PATH"))
        if smi is None:
            raise GpuUnavailable("nvidia-smi not found on PATH")
        self._smi = smi
        rows: list[list[str]] = []
        # Older drivers reject unknown field names (mig.mode.* came with R450): ask less then.
        for fields in ("index,uuid,name,memory.total,driver_version,mig.mode.current",
                       "index,uuid,name,memory.total,driver_version"):
            try:
                rows = _query(smi, "gpu", fields)
                break
            except SmiHung:
                raise
            except GpuUnavailable as e:
                error = str(e)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise GpuUnavailable(f"nvidia-smi failed: {e}") from None
        else:
            raise GpuUnavailable(error)
        found = []
        driver = ""
        for r in rows:
            if len(r) < 5 or not r[0].isdigit():
                continue
            total = _num(r[3])
            driver = r[4]
            found.append(DeviceInfo(index=int(r[0]), uuid=r[1], name=r[2], mig=len(r) > 5 and r[5] == "Enabled",
                                    memory_total=int(total * 2**20) if total is not None else None))
        if not found:
            raise GpuUnavailable("nvidia-smi lists no GPU")
        chosen, source = select(env, found)
        if not chosen:
            raise GpuUnavailable(f"{source}={env.get(source, '')!r} names none of this node's GPUs")
        self._devs = {d.index: d for d in chosen}
        self._energy = {i: EnergyMeter() for i in self._devs}
        self._samples = {i: 0 for i in self._devs}
        self._start = self._counters()
        self._spawn()
        return Opened(devices=chosen, source=source, driver=driver, xid=False)

    def _spawn(self) -> None:
        assert self._smi is not None
        argv = [self._smi, "dmon", "-s", DMON_GROUPS, "-o", "DT", "-d", str(max(1, round(self._every))),
                "-i", ",".join(str(i) for i in sorted(self._devs))]
        # No death signal here: we may be on a worker thread that exits while dmon runs on.
        # If supervise dies, dmon's next line hits a closed pipe (SIGPIPE) and it ends.
        from supervisor.child import die_with_us

        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                      preexec_fn=die_with_us(None, own_group=True))
        _live.add(self._proc)
        os.set_blocking(self._proc.stdout.fileno(), False)  # type: ignore[union-attr]
        self._buf = b""

    def _read_lines(self) -> list[str]:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        eof = False
        while _select_mod.select([fd], [], [], 0)[0]:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        if eof or self._proc.poll() is not None:
            self._proc.wait()
            self._notes.append(("gpu-error", {"metric": "dmon", "error": f"nvidia-smi dmon exited with status {self._proc.returncode}"}))
            self._proc = None
        return [line.decode("utf-8", "replace") for line in lines]

    def sample(self, tree: set[int]) -> list[GpuSample]:
        if self._proc is None:
            if self._restarts >= 3:
                return []
            self._restarts += 1
            self._spawn()
        latest: dict[int, dict[str, str]] = {}
        for line in self._read_lines():
            row = self._parser.feed(line)
            if row is not None and row.get("gpu", "").isdigit() and int(row["gpu"]) in self._devs:
                latest[int(row["gpu"])] = row
        t = time.time()
        out = []
        for i, row in sorted(latest.items()):
            s = row_to_sample(row, self._devs[i], t)
            s.energy_j = self._energy[i].update(t, None, s.power_w)
            self._samples[i] += 1
            out.append(s)
        return out

    def wait_xid(self, timeout_s: float) -> list[tuple[DeviceInfo, int]]:
        time.sleep(timeout_s)
        return []

    def _counters(self) -> dict[int, dict[str, Any]]:
        assert self._smi is not None
        fields = "index,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total"
        try:
            rows = _query(self._smi, "gpu", fields)
        except (GpuUnavailable, OSError, subprocess.TimeoutExpired):
            return {}
        out: dict[int, dict[str, Any]] = {}
        for r in rows:
            if len(r) >= 3 and r[0].isdigit():
                c, u = _num(r[1]), _num(r[2])
                out[int(r[0])] = {"ecc_corrected": None if c is None else int(c),
                                  "ecc_uncorrected": None if u is None else int(u)}
        return out

    def end_stats(self) -> list[dict[str, Any]]:
        end = self._counters()
        out = []
        for i, dev in sorted(self._devs.items()):
            energy, source = self._energy[i].total()
            row: dict[str, Any] = {"index": i, "uuid": dev.uuid, "samples": self._samples[i], "lost": False,
                                   "energy_j": None if energy is None else round(energy, 1), "energy_source": source}
            for key in ("ecc_corrected", "ecc_uncorrected"):
                a, b = self._start.get(i, {}).get(key), end.get(i, {}).get(key)
                row[key] = b
                row[key + "_delta"] = b - a if a is not None and b is not None else None
            row["remapped_rows"] = None
            out.append(row)
        return out

    def close(self) -> None:
        """End dmon and any query still running (a hung one too), each bounded."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                _kill(self._proc)
        for proc in list(_live):
            if proc.poll() is None:
                _kill(proc)
            _live.discard(proc)
        self._proc = None
