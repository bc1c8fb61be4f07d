"""Webhook notifications over httpx: start, warning, preempted, requeued, failed, finished, hang, a stalled sync.

Rules that shape this module:

* Webhook URLs are secrets (the token is in the path): they are never logged, journaled or
  reported. Targets are named "webhook 1 of 2"; every URL is handed to the journal's
  ``add_secret`` so that even an accident is redacted; error texts are scrubbed.
* Notifications are the least important thing we do. ``post()`` never blocks (a bounded
  queue, the oldest dropped with a journal note); each attempt has a deadline; retries are
  few, with backoff; targets are tried concurrently, so one dead endpoint does not hold up
  another; and ``drain(timeout)`` gives up after ``timeout`` in total, so a dead or hanging
  endpoint never delays the stop sequence.

Formats (docs/notify.md): ``json`` (our own object), ``slack`` (incoming webhook
``{"text": …}``), ``teams`` (an Adaptive Card in a ``message``, as Teams workflow webhooks
take it), ``ntfy`` (plain text body with ``Title``/``Tags``/``Priority`` headers).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import anyio
from anyio.abc import TaskStatus
import httpx

from supervisor.journal import Emit

log = logging.getLogger("supervise.notify")

EVENTS = ("start", "warning", "preempted", "requeued", "failed", "finished", "hang", "no-progress", "sync-stalled",
          "sync-resumed")
FORMATS = ("json", "slack", "teams", "ntfy")
_TITLES = {
    "start": "training started", "warning": "time limit approaching", "preempted": "preempted",
    "requeued": "requeued", "failed": "training failed", "finished": "training finished",
    "hang": "training looks hung", "no-progress": "not requeued: no checkpoint progress",
    "sync-stalled": "persistent storage stalled", "sync-resumed": "persistent storage moving again",
}
_NTFY = {  # event → (tags, priority 1..5)
    "start": ("rocket", 2), "warning": ("warning", 4), "preempted": ("stop_sign", 4),
    "requeued": ("repeat", 3), "failed": ("x", 5), "finished": ("white_check_mark", 3), "hang": ("zzz", 4),
    "no-progress": ("no_entry", 5), "sync-stalled": ("hourglass", 4), "sync-resumed": ("arrow_forward", 3),
}
_BACKOFF_FIRST, _BACKOFF_MAX = 0.5, 5.0


class _RedactFilter(logging.Filter):
    """httpx logs every request at INFO *with its URL*: the token would reach supervise.log."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            msg = record.getMessage()
            if any(s in msg for s in self.secrets):
                for s in self.secrets:
                    msg = msg.replace(s, "<webhook>")
                record.msg, record.args = msg, ()
        return True


_REDACT = _RedactFilter()
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).addFilter(_REDACT)


def resolve_urls(entries: Sequence[str]) -> list[str]:
    """URLs from ``--notify`` / config entries; ``@/path`` reads one URL a line from a file
    (blank lines and ``#`` comments skipped), which keeps tokens out of job scripts.

    Raises ValueError naming the entry's position, never the URL itself.
    """
    urls: list[str] = []
    for i, entry in enumerate(entries, 1):
        entry = entry.strip()
        if entry.startswith("@"):
            path = Path(entry[1:]).expanduser()
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except OSError as e:
                raise ValueError(f"notify entry {i}: cannot read {path}: {e.strerror}") from None
            found = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
            for n, u in enumerate(found, 1):
                if not u.startswith(("http://", "https://")):
                    raise ValueError(f"notify file {path}, URL {n}: expected http:// or https:// (not shown: it may hold a token)")
            urls.extend(found)
        elif entry.startswith(("http://", "https://")):
            urls.append(entry)
        else:
            raise ValueError(f"notify entry {i}: expected an http(s) URL or @FILE (not shown: it may hold a token)")
    return list(dict.fromkeys(urls))  # the same URL twice would notify twice


@dataclass
class _Item:
    event: str
    facts: dict[str, Any]
    t: float = field(default_factory=time.time)


class Notifier:
    """Delivers notifications to every configured webhook, off the critical path."""

    def __init__(self, urls: Sequence[str], *, fmt: str = "json", timeout: float = 5.0, retries: int = 2,
                 emit: Emit, job_label: str = "", add_secret: Callable[[str], None] | None = None,
                 queue_size: int = 64) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"notify format {fmt!r}: expected one of {', '.join(FORMATS)}")
        self._urls = tuple(urls)
        self._fmt = fmt
        self._timeout = float(timeout)
        self._retries = max(0, int(retries))
        self._emit = emit
        self._job = job_label
        self._host = socket.gethostname()
        self._queue: deque[_Item] = deque()
        self._queue_size = max(1, queue_size)
        self._wake = anyio.Event()
        self._lock = anyio.Lock()
        for u in self._urls:
            _REDACT.secrets.add(u)
            if add_secret is not None:
                add_secret(u)

    @property
    def targets(self) -> int:
        return len(self._urls)

    def post(self, event: str, **facts: Any) -> None:
        """Queue one notification and return at once. Call from the event loop thread."""
        if not self._urls:
            return
        if event not in EVENTS:
            raise ValueError(f"unknown notify event {event!r}; one of {', '.join(EVENTS)}")
        if len(self._queue) >= self._queue_size:
            dropped = self._queue.popleft()
            self._emit("notify-failed", event=dropped.event, target=None, targets=len(self._urls),
                       error="dropped: notification queue full")
        self._queue.append(_Item(event, facts))
        self._wake.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Deliver until cancelled."""
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self._deliver_queued()

    async def drain(self, timeout: float) -> None:
        """Deliver what is queued (and wait for what is in flight); give up after ``timeout``."""
        with anyio.move_on_after(timeout) as scope:
            await self._deliver_queued()
        if scope.cancelled_caught:
            left = len(self._queue)
            self._queue.clear()
            log.warning("notifications: gave up after %.1fs, %d undelivered", timeout, left)

    async def _deliver_queued(self) -> None:
        async with self._lock:
            if not self._queue:
                return
            async with httpx.AsyncClient(timeout=self._timeout, follow_redirects=False) as client:
                while self._queue:
                    item = self._queue.popleft()
                    async with anyio.create_task_group() as tg:
                        for i in range(len(self._urls)):
                            tg.start_soon(self._deliver, client, item, i)

    async def _deliver(self, client: httpx.AsyncClient, item: _Item, index: int) -> None:
        url, n = self._urls[index], len(self._urls)
        name = f"webhook {index + 1} of {n}"
        body, headers = render(self._fmt, item.event, item.facts, job=self._job, host=self._host, t=item.t)
        t0 = time.monotonic()
        error = ""
        for attempt in range(1, self._retries + 2):
            retry_after: float | None = None
            try:
                with anyio.fail_after(self._timeout):
                    r = await client.post(url, content=body, headers=headers)
            except TimeoutError:
                error = f"no answer within {self._timeout:g}s"
            except httpx.HTTPError as e:
                error = self._scrub(f"{type(e).__name__}: {e}", url)
            else:
                if r.is_success:
                    self._emit("notify", event=item.event, target=index + 1, targets=n, status=r.status_code,
                               seconds=round(time.monotonic() - t0, 3), attempts=attempt)
                    log.info("notified %s of %s", name, item.event)
                    return
                error = f"HTTP {r.status_code}"
                if not (r.status_code >= 500 or r.status_code in (408, 429)):
                    break  # the request itself is wrong: retrying will not help
                retry_after = _retry_after(r)
            if attempt <= self._retries:
                delay = min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2)
                await anyio.sleep(min(_BACKOFF_MAX, max(delay, retry_after or 0.0)))
        self._emit("notify-failed", event=item.event, target=index + 1, targets=n, error=error,
                   seconds=round(time.monotonic() - t0, 3), attempts=attempt)
        log.warning("could not notify %s of %s: %s", name, item.event, error)

    @staticmethod
    def _scrub(text: str, url: str) -> str:
        """httpx errors may quote the URL; the URL is a secret."""
        parsed = httpx.URL(url)
        for secret in (url, str(parsed), parsed.raw_path.decode("ascii", "replace")):
            if len(secret) > 1:
                text = text.replace(secret, "<webhook>")
        return text


def _retry_after(r: httpx.Response) -> float | None:
    try:
        return float(r.headers.get("retry-after", ""))
    except ValueError:
        return None


# --- payloads ---

def _summary(event: str, facts: dict[str, Any], job: str, host: str) -> tuple[str, list[tuple[str, str]]]:
    title = f"{job}: {_TITLES[event]}" if job else _TITLES[event].capitalize()
    pairs = [] if "host" in facts else [("host", host)]
    pairs += [(str(k), _plain(v)) for k, v in facts.items()]
    return title, pairs


def _plain(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple, set)):
        return ", ".join(map(str, v))
    return str(v)


def render(fmt: str, event: str, facts: dict[str, Any], *, job: str = "", host: str = "",
           t: float | None = None) -> tuple[bytes, dict[str, str]]:
    """The request body and headers for one notification in format ``fmt``."""
    t = time.time() if t is None else t
    when = datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")
    title, pairs = _summary(event, facts, job, host)
    text = "\n".join(f"{k}: {v}" for k, v in pairs)
    if fmt == "json":
        obj = {"source": "supervise", "event": event, "job": job, "host": str(facts.get("host", host)), "time": when,
               "title": title, "facts": {k: _jsonable(v) for k, v in facts.items()}}
        return _json(obj), {"content-type": "application/json"}
    if fmt == "slack":
        lines = "\n".join(f"• {k}: {v}" for k, v in pairs)
        return _json({"text": f"*{title}*\n{lines}"}), {"content-type": "application/json"}
    if fmt == "teams":
        card = {
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "type": "AdaptiveCard", "version": "1.4",
            "body": [
                {"type": "TextBlock", "text": title, "weight": "Bolder", "size": "Medium", "wrap": True},
                {"type": "FactSet", "facts": [{"title": k, "value": v} for k, v in pairs]},
            ],
        }
        msg = {"type": "message", "summary": title,
               "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None,
                                "content": card}]}
        return _json(msg), {"content-type": "application/json"}
    if fmt == "ntfy":
        tags, priority = _NTFY[event]
        return text.encode("utf-8"), {"content-type": "text/plain; charset=utf-8", "Title": _header(title),
                                      "Tags": tags, "Priority": str(priority)}
    raise ValueError(f"notify format {fmt!r}: expected one of {', '.join(FORMATS)}")


def _json(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def _header(value: str) -> str:
    """HTTP headers are Latin-1; ntfy decodes RFC 2047 for anything else (a job name in UTF-8)."""
    try:
        value.encode("ascii")
        return value
    except UnicodeEncodeError:
        return "=?UTF-8?B?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="
