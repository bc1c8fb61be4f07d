"""Notifier against a real HTTP server on 127.0.0.1 (stdlib http.server in a thread).

Paths pick the server's behaviour: /ok/… answers 200, /fail/… 500, /hang/… never answers
(until the fixture shuts it down), /bad/… 400.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor.journal import Journal, read_journal
from supervisor.notify import EVENTS, Notifier, render, resolve_urls
from tests.support.webhook import TOKEN, Server


class Events:
    """An Emit that keeps what it is given, as the journal would write it."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, kind: str, /, *, durable: bool = False, **fields: Any) -> dict[str, Any]:
        e = {"kind": kind, **fields}
        self.events.append(e)
        return e

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]

    def text(self) -> str:
        return json.dumps(self.events, default=str)


def deliver(n: Notifier, timeout: float = 10.0) -> float:
    async def main() -> float:
        t0 = time.monotonic()
        await n.drain(timeout)
        return time.monotonic() - t0
    return anyio.run(main)


# --- formats ---

def test_json_payload(server: Server) -> None:
    ev = Events()
    n = Notifier([server.url("ok")], fmt="json", emit=ev, job_label="gpt-small 1234")
    n.post("preempted", reason="SIGTERM", step=71, attempt=2)
    deliver(n)
    [req] = server.hits("ok")
    assert req["headers"]["content-type"] == "application/json"
    obj = json.loads(req["body"])
    assert obj["event"] == "preempted" and obj["job"] == "gpt-small 1234" and obj["source"] == "supervise"
    assert obj["facts"] == {"reason": "SIGTERM", "step": 71, "attempt": 2}
    assert obj["time"].endswith("+00:00") and obj["host"]
    [ok] = ev.kinds("notify")
    assert ok["event"] == "preempted" and ok["target"] == 1 and ok["status"] == 200 and ok["seconds"] >= 0


def test_slack_payload_is_an_incoming_webhook_text(server: Server) -> None:
    n = Notifier([server.url("ok")], fmt="slack", emit=Events(), job_label="job 7")
    n.post("failed", exit_status=137)
    deliver(n)
    obj = json.loads(server.hits("ok")[0]["body"])
    assert list(obj) == ["text"]
    assert obj["text"].startswith("*job 7: training failed*") and "exit_status: 137" in obj["text"]


def test_teams_payload_is_an_adaptive_card_message(server: Server) -> None:
    n = Notifier([server.url("ok")], fmt="teams", emit=Events(), job_label="job 7")
    n.post("warning", minutes_left=5)
    deliver(n)
    obj = json.loads(server.hits("ok")[0]["body"])
    assert obj["type"] == "message"
    [att] = obj["attachments"]
    assert att["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = att["content"]
    assert card["type"] == "AdaptiveCard" and card["body"][0]["text"] == "job 7: time limit approaching"
    assert {"title": "minutes_left", "value": "5"} in card["body"][1]["facts"]


def test_ntfy_payload_is_text_with_headers(server: Server) -> None:
    n = Notifier([server.url("ok")], fmt="ntfy", emit=Events(), job_label="job 7")
    n.post("finished", steps=1000)
    deliver(n)
    req = server.hits("ok")[0]
    assert req["headers"]["title"] == "job 7: training finished"
    assert req["headers"]["tags"] == "white_check_mark" and req["headers"]["priority"] == "3"
    assert "steps: 1000" in req["body"].decode()


def test_a_host_fact_is_not_repeated() -> None:
    body, _ = render("ntfy", "start", {"host": "node7"}, job="j", host="login1")
    assert body.decode().count("host:") == 1 and "node7" in body.decode()


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("fmt", ["json", "slack", "teams", "ntfy"])
def test_every_event_renders_in_every_format(fmt: str, event: str) -> None:
    body, headers = render(fmt, event, {"x": 1.5, "names": ["a", "b"]}, job="j", host="h", t=0)
    assert body and "content-type" in headers
    if fmt != "ntfy":
        json.loads(body)


# --- secrets ---

def test_url_appears_nowhere_in_events_journal_or_log(server: Server, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    with Journal(tmp_path, attempt=1) as j:
        urls = [server.url("ok"), server.url("fail"), "http://127.0.0.1:9/" + TOKEN]  # port 9: refused
        n = Notifier(urls, emit=j.emit, retries=0, timeout=2, add_secret=j.add_secret)
        n.post("start", command="python train.py")
        deliver(n)
        j.emit("oops", text=f"someone printed {urls[0]}")  # the journal redacts a registered URL
    raw = (tmp_path / "events.jsonl").read_text()
    assert TOKEN not in raw and TOKEN not in caplog.text
    events = read_journal(tmp_path).events
    assert sorted((e["kind"], e["target"]) for e in events if e["kind"].startswith("notify")) == \
        [("notify", 1), ("notify-failed", 2), ("notify-failed", 3)]
    assert "<redacted>" in raw
    assert "webhook 2 of 3" in caplog.text


def test_resolve_urls_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "hooks"
    f.write_text("# team channel\nhttps://hooks.example/a/" + TOKEN + "\n\n  https://ntfy.example/b  \n")
    assert resolve_urls([f"@{f}", "https://x.example/c", "https://ntfy.example/b"]) == \
        ["https://hooks.example/a/" + TOKEN, "https://ntfy.example/b", "https://x.example/c"]
    f.write_text("hooks.example/" + TOKEN + "\n")
    with pytest.raises(ValueError) as e:
        resolve_urls([f"@{f}"])
    assert TOKEN not in str(e.value) and "URL 1" in str(e.value)
    with pytest.raises(ValueError, match="cannot read"):
        resolve_urls(["@" + str(tmp_path / "missing")])


# --- failures never hold up the stop sequence ---

def test_server_error_is_retried_then_given_up_within_bounds(server: Server) -> None:
    ev = Events()
    n = Notifier([server.url("fail")], emit=ev, retries=2, timeout=2)
    n.post("failed", exit_status=1)
    took = deliver(n, timeout=10)
    assert len(server.hits("fail")) == 3                     # 1 + 2 retries
    [f] = ev.kinds("notify-failed")
    assert f["error"] == "HTTP 500" and f["attempts"] == 3 and f["target"] == 1
    assert took < 0.5 * 1.2 + 1.0 * 1.2 + 2                  # two backoffs, fast answers
    gaps = [b["t"] - a["t"] for a, b in zip(server.hits("fail"), server.hits("fail")[1:])]
    assert gaps[0] >= 0.35 and gaps[1] >= 0.75               # backoff happened


def test_client_error_is_not_retried(server: Server) -> None:
    ev = Events()
    n = Notifier([server.url("bad")], emit=ev, retries=3, timeout=2)
    n.post("failed")
    deliver(n)
    assert len(server.hits("bad")) == 1 and ev.kinds("notify-failed")[0]["error"] == "HTTP 400"


def test_500_endpoint_delays_drain_by_at_most_its_timeout(server: Server) -> None:
    n = Notifier([server.url("fail")], emit=Events(), retries=10, timeout=5)
    n.post("preempted")
    took = deliver(n, timeout=1.0)
    assert 0.9 <= took < 1.5, took


def test_hanging_endpoint_delays_drain_by_at_most_its_timeout_and_does_not_block_others(server: Server) -> None:
    ev = Events()
    n = Notifier([server.url("hang"), server.url("ok")], emit=ev, retries=2, timeout=30)
    n.post("preempted", reason="deadline")
    took = deliver(n, timeout=1.0)
    assert 0.9 <= took < 1.5, took
    assert len(server.hits("hang")) == 1 and len(server.hits("ok")) == 1
    assert [e["target"] for e in ev.kinds("notify")] == [2]   # the healthy one got it meanwhile


def test_per_attempt_timeout_on_a_hanging_endpoint(server: Server) -> None:
    ev = Events()
    n = Notifier([server.url("hang")], emit=ev, retries=1, timeout=0.5)
    n.post("hang", idle_s=600)
    took = deliver(n, timeout=10)
    assert len(server.hits("hang")) == 2
    [f] = ev.kinds("notify-failed")
    assert f["error"] == "no answer within 0.5s" and f["attempts"] == 2
    assert took < 0.5 * 2 + 0.6 + 1.0, took


# --- background delivery and the bounded queue ---

def test_run_delivers_in_the_background_until_cancelled(server: Server) -> None:
    ev = Events()
    n = Notifier([server.url("ok")], emit=ev)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(n.run)
            n.post("start")
            n.post("warning", minutes_left=10)
            with anyio.fail_after(10):
                while len(ev.kinds("notify")) < 2:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert [json.loads(r["body"])["event"] for r in server.hits("ok")] == ["start", "warning"]


def test_queue_is_bounded_and_drops_the_oldest_with_a_note(server: Server) -> None:
    ev = Events()
    n = Notifier([server.url("ok")], emit=ev, queue_size=2)
    for i in range(5):
        n.post("warning", n=i)
    deliver(n)
    assert [json.loads(r["body"])["facts"]["n"] for r in server.hits("ok")] == [3, 4]
    dropped = ev.kinds("notify-failed")
    assert len(dropped) == 3 and all("queue full" in d["error"] for d in dropped)


def test_no_urls_means_nothing_happens() -> None:
    ev = Events()
    n = Notifier([], emit=ev)
    n.post("start")
    assert deliver(n, timeout=1) < 0.5 and ev.events == []


def test_unknown_event_and_format_are_errors() -> None:
    with pytest.raises(ValueError, match="format"):
        Notifier(["http://127.0.0.1:9/x"], fmt="xml", emit=Events())
    with pytest.raises(ValueError, match="unknown notify event"):
        Notifier(["http://127.0.0.1:9/x"], emit=Events()).post("exploded")
