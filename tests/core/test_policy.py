"""Every pure decision of supervisor/policy.py, one table each: inputs → the documented answer.

The expected values are written by hand from the rules in docs/slurm.md, docs/design.md,
docs/journal.md, the functions' docstrings and the module's constants (SAFETY 5 s, NEAR_END
300 s, PERIODIC_TOLERANCE 0.15, HANG_FACTOR 5, HANG_MIN_GAPS 5, a 10 s floor passed to hang_bound, GATE_HELD
256 MiB), never by calling the function. Each table covers its function's branches and bounds
(exactly at a bound, just inside, just outside; None for an unknown end or kill; every Reason
where the reason matters). ``test_every_public_function_has_a_table`` fails when policy.py
gains a public function without one here.

Where the docstring or the docs and the code disagree, the row says what the docs say and is
marked ``disputed`` (a strict xfail) until one of them is settled. The first table-writing found
three (a KillWait kill after the end, a hang stop's status, a save landing right after the
request); each was settled in the code or the docs.
"""

from __future__ import annotations

import inspect
import math
import signal
from typing import Any, Callable

import pytest

from supervisor import policy
from supervisor.policy import Reason, Trigger

S = signal.Signals
P = pytest.param
BASE_CAUGHT = {S.SIGTERM, S.SIGINT, S.SIGQUIT, S.SIGHUP, S.SIGUSR1, S.SIGUSR2, S.SIGCONT}
MIB = 2**20


def disputed(why: str) -> pytest.MarkDecorator:
    """A row written from the docs where policy.py's code says otherwise (reported to the lead,
    issue 23): strict, so fixing either side makes it fail until the row or the mark is settled."""
    return pytest.mark.xfail(strict=True, reason=f"docstring/docs and code disagree: {why}")


def _covers_every_reason(rows: list[Any]) -> None:
    """A table said to cover every Reason must name each one (a new Reason needs a row)."""
    seen = {v for row in rows for v in row.values if isinstance(v, Reason)}
    assert seen == set(Reason), f"rows missing for {set(Reason) - seen}"


# ---------------------------------------------------------------- signals

CAUGHT_SIGNALS = [
    P(S.SIGUSR2, S.SIGUSR1, BASE_CAUGHT, id="default warn USR2 and checkpoint USR1 are already caught"),
    P(None, None, BASE_CAUGHT, id="no warn nor checkpoint signal: stop, pass-on signals and SIGCONT"),
    P(S.SIGALRM, None, BASE_CAUGHT | {S.SIGALRM}, id="an ALRM warn signal is caught too (ALRM would kill us)"),
    P(None, S.SIGPWR, BASE_CAUGHT | {S.SIGPWR}, id="a PWR checkpoint signal is caught too"),
    P(S.SIGVTALRM, S.SIGURG, BASE_CAUGHT | {S.SIGVTALRM, S.SIGURG}, id="both configured signals are caught"),
    P(S.SIGTERM, None, BASE_CAUGHT, id="TERM as the warn signal adds nothing"),
]


@pytest.mark.parametrize(("warn", "checkpoint", "expected"), CAUGHT_SIGNALS)
def test_caught_signals(warn: S | None, checkpoint: S | None, expected: set[S]) -> None:
    assert policy.caught_signals(warn, checkpoint) == expected


# end 1000: "deadline within 10 s of the end" (2 × SAFETY), docs/slurm.md "Warning signals".
CLASSIFY_SIGNAL = [
    P(S.SIGUSR2, S.SIGUSR2, None, 0.0, Reason.DEADLINE, id="the warn signal with no end known is the deadline"),
    P(S.SIGUSR2, S.SIGUSR2, 1000.0, 0.0, Reason.DEADLINE, id="the warn signal far from the end is the deadline"),
    P(S.SIGTERM, S.SIGTERM, 1000.0, 0.0, Reason.DEADLINE, id="TERM configured as the warn signal is the deadline"),
    P(S.SIGINT, S.SIGUSR2, 1000.0, 0.0, Reason.CANCELLED, id="INT is a person cancelling"),
    P(S.SIGQUIT, S.SIGUSR2, None, 0.0, Reason.CANCELLED, id="QUIT is a person cancelling"),
    P(S.SIGINT, S.SIGUSR2, 1000.0, 999.0, Reason.CANCELLED, id="INT at the very end is still a person"),
    P(S.SIGTERM, S.SIGUSR2, None, 0.0, Reason.PREEMPTED, id="TERM with no end known is a preemption"),
    P(S.SIGTERM, None, None, 0.0, Reason.PREEMPTED, id="TERM with no warn signal and no end is a preemption"),
    P(S.SIGTERM, S.SIGUSR2, 1000.0, 0.0, Reason.PREEMPTED, id="TERM long before the end is a preemption"),
    P(S.SIGTERM, S.SIGUSR2, 1000.0, 989.9, Reason.PREEMPTED, id="TERM just over 10 s before the end is a preemption"),
    P(S.SIGTERM, S.SIGUSR2, 1000.0, 990.0, Reason.DEADLINE, id="TERM exactly 10 s before the end is the time limit"),
    P(S.SIGTERM, S.SIGUSR2, 1000.0, 995.0, Reason.DEADLINE, id="TERM 5 s before the end is the time limit"),
    P(S.SIGTERM, S.SIGUSR2, 1000.0, 1029.0, Reason.DEADLINE, id="TERM 29 s after the end is the time limit (late check)"),
]


@pytest.mark.parametrize(("sig", "warn", "end", "now", "expected"), CLASSIFY_SIGNAL)
def test_classify_signal(sig: S, warn: S | None, end: float | None, now: float, expected: Reason) -> None:
    assert policy.classify_signal(sig, warn_signal=warn, end=end, now=now) == expected


# warn USR2, checkpoint USR1, now 0. With lead 60 the "near" window is max(300, 120) = 300 s and a
# stop is deferred when the end is further than lead + 1 = 61 s (docs/slurm.md's table).
SIGNAL_ACTION = [
    P(S.SIGUSR2, S.SIGUSR2, None, 60.0, "stop", id="warn signal, no end known: stop now"),
    P(S.SIGUSR2, S.SIGUSR2, 10_000.0, 60.0, "defer", id="warn signal, end far: defer to end - lead"),
    P(S.SIGUSR2, S.SIGUSR2, 61.001, 60.0, "defer", id="warn signal, end just over lead + 1 s: defer"),
    P(S.SIGUSR2, S.SIGUSR2, 61.0, 60.0, "stop", id="warn signal, end exactly lead + 1 s: stop"),
    P(S.SIGUSR2, S.SIGUSR2, 30.0, 60.0, "stop", id="warn signal, end within the lead: stop"),
    P(S.SIGUSR2, S.SIGUSR2, -5.0, 60.0, "stop", id="warn signal, end already past: stop"),
    P(S.SIGUSR1, S.SIGUSR2, None, 60.0, "checkpoint", id="checkpoint signal, no end known: a checkpoint request"),
    P(S.SIGUSR1, S.SIGUSR2, 10_000.0, 60.0, "checkpoint", id="checkpoint signal far from the end: a checkpoint request"),
    P(S.SIGUSR1, S.SIGUSR2, 300.001, 60.0, "checkpoint", id="checkpoint signal just over 5 min from the end: a request"),
    P(S.SIGUSR1, S.SIGUSR2, 300.0, 60.0, "defer", id="checkpoint signal exactly 5 min from the end: end is near, defer"),
    P(S.SIGUSR1, S.SIGUSR2, 120.0, 60.0, "defer", id="checkpoint signal 2 min from the end (B:USR1@120): defer"),
    P(S.SIGUSR1, S.SIGUSR2, 61.0, 60.0, "stop", id="checkpoint signal exactly lead + 1 s from the end: stop"),
    P(S.SIGUSR1, S.SIGUSR2, 30.0, 60.0, "stop", id="checkpoint signal within the lead: stop"),
    P(S.SIGUSR1, S.SIGUSR2, 400.0, 200.0, "defer", id="checkpoint signal exactly twice a long lead from the end: defer"),
    P(S.SIGUSR1, S.SIGUSR2, 400.5, 200.0, "checkpoint", id="checkpoint signal just over twice a long lead: a request"),
    P(S.SIGUSR1, None, 120.0, 60.0, "defer", id="checkpoint signal near the end with no warn signal: defer"),
    P(S.SIGUSR2, None, 120.0, 60.0, "forward", id="USR2 with no warn signal configured is forwarded"),
    P(S.SIGHUP, S.SIGUSR2, 30.0, 60.0, "forward", id="HUP is forwarded, even near the end"),
]


@pytest.mark.parametrize(("sig", "warn", "end", "lead", "expected"), SIGNAL_ACTION)
def test_signal_action(sig: S, warn: S | None, end: float | None, lead: float, expected: str) -> None:
    assert policy.signal_action(sig, warn_signal=warn, checkpoint_signal=S.SIGUSR1, end=end, now=0.0,
                                lead=lead) == expected


STOP_SIGNAL_FOR = [
    P(S.SIGUSR2, S.SIGTERM, True, S.SIGINT, S.SIGUSR2, id="--stop-signal wins over the person's INT"),
    P(S.SIGINT, S.SIGTERM, False, None, S.SIGINT, id="--stop-signal wins over the launcher's"),
    P(None, S.SIGTERM, True, S.SIGINT, S.SIGINT, id="a plain process gets the person's INT"),
    P(None, S.SIGTERM, True, S.SIGQUIT, S.SIGQUIT, id="a plain process gets the person's QUIT"),
    P(None, S.SIGINT, True, S.SIGTERM, S.SIGTERM, id="a plain process gets the scheduler's TERM"),
    P(None, S.SIGINT, True, S.SIGUSR2, S.SIGINT, id="a plain process stopped by the warn signal gets the default"),
    P(None, S.SIGINT, True, None, S.SIGINT, id="a plain process stopped without a signal gets the default"),
    P(None, S.SIGTERM, False, S.SIGINT, S.SIGTERM, id="a launcher gets its profile's signal, not the person's INT"),
    P(None, S.SIGINT, False, None, S.SIGINT, id="a launcher stopped without a signal gets its profile's signal"),
]


@pytest.mark.parametrize(("configured", "launcher", "plain", "trigger", "expected"), STOP_SIGNAL_FOR)
def test_stop_signal_for(configured: S | None, launcher: S, plain: bool, trigger: S | None, expected: S) -> None:
    assert policy.stop_signal_for(configured=configured, launcher_signal=launcher, plain=plain,
                                  trigger_signal=trigger) == expected


SIGNAL_CHECKPOINT = [
    P(False, True, id="the checkpoint signal goes to the ranks when only we were signalled"),
    P(True, False, id="no checkpoint signal after the scheduler's TERM to every process (exit 138)"),
]


@pytest.mark.parametrize(("signalled_all", "expected"), SIGNAL_CHECKPOINT)
def test_signal_checkpoint(signalled_all: bool, expected: bool) -> None:
    assert policy.signal_checkpoint(scheduler_signalled_all=signalled_all) is expected


# ---------------------------------------------------------------- time

# The trigger came at monotonic 100; now is monotonic 103 and unix 5003, so it came at unix 5000.
KILLED_AT = [
    P(None, True, 30.0, 103.0, None, id="no trigger: no kill known"),
    P(Trigger(Reason.PREEMPTED, at=100.0), True, None, 103.0, None, id="KillWait unknown: no kill known"),
    P(Trigger(Reason.PREEMPTED, at=100.0), False, 30.0, 103.0, None, id="only we were signalled: no KillWait kill"),
    P(Trigger(Reason.PREEMPTED, at=100.0), True, 30.0, 103.0, 5030.0, id="KillWait after the job-wide TERM, in unix time"),
    P(Trigger(Reason.PREEMPTED, at=103.0), True, 30.0, 103.0, 5033.0, id="a TERM this instant: KillWait from now"),
    P(Trigger(Reason.CANCELLED, at=100.0), True, 5.0, 103.0, 5005.0, id="the test cluster's KillWait 5"),
    P(Trigger(Reason.PREEMPTED, at=100.0), True, 0.0, 103.0, 5000.0, id="KillWait 0: the kill came with the TERM"),
]


@pytest.mark.parametrize(("trigger", "signalled_all", "kill_wait", "mono", "expected"), KILLED_AT)
def test_killed_at(trigger: Trigger | None, signalled_all: bool, kill_wait: float | None, mono: float,
                   expected: float | None) -> None:
    got = policy.killed_at(trigger, scheduler_signalled_all=signalled_all, kill_wait=kill_wait, now=5003.0, mono=mono)
    assert got == (None if expected is None else pytest.approx(expected))


# A KillWait kill *after* the job's end (the time limit's TERM comes up to ~30 s after the end,
# docs/slurm.md: "bounded by KillWait, not by the job's end"; "past the end" is not "already killed").
HARD_KILL = [
    P(None, None, None, id="no end and no kill: never killed"),
    P(None, 50.0, 50.0, id="no end known: the KillWait kill"),
    P(100.0, None, 100.0, id="no job-wide TERM: the job's end"),
    P(100.0, 50.0, 50.0, id="a KillWait kill before the end"),
    P(100.0, 99.9, 99.9, id="a KillWait kill just before the end"),
    P(100.0, 100.0, 100.0, id="a KillWait kill exactly at the end"),
    P(100.0, 130.0, 130.0, id="a KillWait kill after the end (a late time-limit TERM)"),
]


@pytest.mark.parametrize(("end", "kill", "expected"), HARD_KILL)
def test_hard_kill(end: float | None, kill: float | None, expected: float | None) -> None:
    assert policy.hard_kill(end=end, kill=kill) == expected


KILL_FIELDS = [
    P(100.0, None, 30.0, 20.0, {}, id="no kill known: no fields"),
    P(None, None, None, 20.0, {}, id="no end and no kill: no fields"),
    P(100.0, 50.0, 30.0, 20.0, {"kill_in_s": 30.0, "kill_by": "kill-wait", "kill_wait_s": 30.0},
      id="a KillWait kill before the end"),
    P(None, 50.0, 5.0, 20.0, {"kill_in_s": 30.0, "kill_by": "kill-wait", "kill_wait_s": 5.0},
      id="a KillWait kill with no end known"),
    P(100.0, 100.0, 30.0, 40.0, {"kill_in_s": 60.0, "kill_by": "time-limit"}, id="the kill is the job's end"),
    P(100.0, 50.0, 30.0, 10.1234, {"kill_in_s": 39.877, "kill_by": "kill-wait", "kill_wait_s": 30.0},
      id="seconds to the kill rounded to ms"),
]


@pytest.mark.parametrize(("end", "kill", "kill_wait", "now", "expected"), KILL_FIELDS)
def test_kill_fields(end: float | None, kill: float | None, kill_wait: float | None, now: float,
                     expected: dict[str, object]) -> None:
    assert policy.kill_fields(end=end, kill=kill, kill_wait=kill_wait, now=now) == expected


# In hand: min(SAFETY 5 s, a fifth of KillWait) before a KillWait kill (docs/slurm.md), min(5 s,
# a tenth of the lead) before the job's end. Disputed, as for hard_kill: a kill after the end.
TIME_LEFT = [
    P(None, None, 60.0, None, 0.0, math.inf, id="no end and no kill: never killed"),
    P(1000.0, None, 100.0, None, 900.0, 95.0, id="to the end, 5 s in hand"),
    P(1000.0, None, 20.0, None, 990.0, 8.0, id="a short lead keeps a tenth of it in hand"),
    P(1000.0, None, 50.0, None, 990.0, 5.0, id="a lead of 50 s keeps exactly 5 s"),
    P(1000.0, None, 100.0, None, 998.0, 0.0, id="less than the margin to the end: nothing left"),
    P(1000.0, None, 100.0, None, 1010.0, 0.0, id="past the end: nothing left, never negative"),
    P(1000.0, 1000.0, 100.0, 30.0, 900.0, 95.0, id="a kill at the end itself counts as the end"),
    P(1000.0, 130.0, 100.0, 30.0, 100.0, 25.0, id="KillWait 30 before the end: 5 s in hand"),
    P(1000.0, 110.0, 100.0, 5.0, 100.0, 9.0, id="KillWait 5: a fifth of it (1 s) in hand"),
    P(None, 110.0, 100.0, 30.0, 100.0, 5.0, id="a KillWait kill with no end known"),
    P(None, 110.0, 100.0, None, 100.0, 10.0, id="a kill with KillWait unknown keeps nothing in hand"),
    P(1000.0, 102.0, 100.0, 30.0, 100.0, 0.0, id="a KillWait kill closer than the margin: nothing left"),
    P(1000.0, 1030.0, 100.0, 30.0, 1010.0, 15.0,
      id="10 s after a time-limit TERM at the end: the KillWait left, less 5 s in hand"),
]


@pytest.mark.parametrize(("end", "kill", "lead", "kill_wait", "now", "expected"), TIME_LEFT)
def test_time_left(end: float | None, kill: float | None, lead: float, kill_wait: float | None, now: float,
                   expected: float) -> None:
    assert policy.time_left(end=end, kill=kill, lead=lead, kill_wait=kill_wait, now=now) == pytest.approx(expected)


# issue 22: the time a stop a signal started has: the known end, else the kill delay, else 30 s.
STOP_BUDGET = [
    P(1000.0, 30.0, 990.0, 10.0, id="the known end wins over KillWait"),
    P(1000.0, None, 1010.0, 0.0, id="past the end: nothing, never negative"),
    P(None, 12.0, 0.0, 12.0, id="no end: the scheduler's kill delay"),
    P(None, None, 0.0, 30.0, id="neither: the documented 30 s"),
]


@pytest.mark.parametrize(("end", "kill_wait", "now", "expected"), STOP_BUDGET)
def test_stop_budget(end: float | None, kill_wait: float | None, now: float, expected: float) -> None:
    assert policy.stop_budget(end=end, kill_wait=kill_wait, now=now) == pytest.approx(expected)


# issue 30: a stop a signal or the training's own exit started is bounded by the stop budget.
HAS_STOP_BUDGET = [
    P(Reason.PREEMPTED, S.SIGTERM, True, id="a stop signal: a SIGKILL follows it"),
    P(Reason.CANCELLED, S.SIGINT, True, id="a person's INT"),
    P(Reason.CHILD_EXIT, None, True, id="the training's own exit 0: a hung copier must not hold the job"),
    P(Reason.CHILD_FAILED, None, True, id="the training's own exit 4"),
    P(Reason.DEADLINE, None, False, id="the deadline watch: the end is known"),
    P(Reason.HANG, None, False, id="a hang: bounded by the known end alone"),
]


@pytest.mark.parametrize(("reason", "sig", "expected"), HAS_STOP_BUDGET)
def test_has_stop_budget(reason: Reason, sig: signal.Signals | None, expected: bool) -> None:
    assert policy.has_stop_budget(Trigger(reason, "", sig)) is expected


# time_left after a stop signal with no end known: the budget less the time since, 5 s in hand.
SIGNALLED_TIME_LEFT = [
    P(None, 10.0, 15.0, id="30 s budget, 10 s gone, 5 s in hand"),
    P(20.0, 2.0, 14.0, id="KillWait 20: a fifth (4 s) in hand"),
    P(None, 40.0, 0.0, id="budget spent: nothing, never negative"),
]


@pytest.mark.parametrize(("kill_wait", "since", "expected"), SIGNALLED_TIME_LEFT)
def test_time_left_after_a_stop_signal(kill_wait: float | None, since: float, expected: float) -> None:
    assert policy.time_left(end=None, kill=None, lead=0.0, kill_wait=kill_wait, now=0.0,
                            signalled_for=since) == pytest.approx(expected)


# issue 22: the answer to a request started after it: never one being written at the request.
STARTED_AFTER_REQUEST = [
    P(("step_40", 11), frozenset({("step_40", 11)}), False, id="being written at the request"),
    P(("checkpoint-40", 11), frozenset({("tmp-checkpoint-40", 11)}), False, id="renamed into place: same inode"),
    P(("step_41", 12), frozenset({("step_40", 11)}), True, id="begun after the request"),
    P(("step_41", 12), frozenset(), True, id="nothing was being written"),
    P(None, frozenset({("step_40", 11)}), True, id="no identity (a multi-node part): no evidence against"),
]


@pytest.mark.parametrize(("ident", "in_progress", "expected"), STARTED_AFTER_REQUEST)
def test_started_after_request(ident: tuple[str, int] | None, in_progress: frozenset, expected: bool) -> None:
    assert policy.started_after_request(ident, in_progress) is expected


# The checkpoint gets what is left less the grace (docs/slurm.md), but keeps at most a quarter
# of a short window for the stop; checkpoint_timeout bounds it.
CHECKPOINT_BOUND = [
    P(60.0, 100.0, 10.0, 60.0, id="the timeout is the tighter bound"),
    P(120.0, 100.0, 10.0, 90.0, id="time left less the grace"),
    P(90.0, 100.0, 10.0, 90.0, id="timeout exactly the time left less the grace"),
    P(120.0, 40.0, 10.0, 30.0, id="the grace exactly a quarter of the time left"),
    P(120.0, 20.0, 10.0, 15.0, id="a short window keeps a quarter of it, not the whole grace"),
    P(120.0, 100.0, 0.0, 100.0, id="no grace: all the time left"),
    P(60.0, math.inf, 10.0, 60.0, id="no end: the timeout"),
    P(60.0, 0.0, 10.0, 0.0, id="no time left: no wait"),
]


@pytest.mark.parametrize(("timeout", "left", "grace", "expected"), CHECKPOINT_BOUND)
def test_checkpoint_bound(timeout: float, left: float, grace: float, expected: float) -> None:
    assert policy.checkpoint_bound(timeout, left, grace) == pytest.approx(expected)


FLUSH_BOUND = [
    P(100.0, 10.0, True, 90.0, id="before the stop: time left less the grace"),
    P(40.0, 10.0, True, 30.0, id="before the stop: the grace exactly a quarter"),
    P(20.0, 10.0, True, 15.0, id="before the stop, a short window: a quarter kept"),
    P(100.0, 10.0, False, 100.0, id="the final flush takes all the time left"),
    P(math.inf, 10.0, False, math.inf, id="the final flush with no end: unbounded"),
    P(0.0, 10.0, True, 0.0, id="no time left: no flush time"),
    P(math.inf, 10.0, False, 15.0, True, id="a node died, a spare waits: the nodes' copies keep the rest"),
    P(100.0, 10.0, True, 15.0, True, id="a node died, a spare waits, before the stop"),
    P(12.0, 10.0, False, 12.0, True, id="a node died, a spare waits, less time left than the cap"),
]


@pytest.mark.parametrize(("left", "grace", "running", "expected", "spare"),
                         [p if len(p.values) == 5 else P(*p.values, False, id=p.id) for p in FLUSH_BOUND])
def test_flush_bound(left: float, grace: float, running: bool, expected: float, spare: bool) -> None:
    assert policy.flush_bound(left, grace, child_running=running, spare=spare) == pytest.approx(expected)


GRACE_FOR = [
    P(10.0, 100.0, False, 0.0, 10.0, id="--grace when there is time"),
    P(10.0, 10.0, False, 0.0, 10.0, id="time left exactly the grace"),
    P(10.0, 4.0, False, 0.0, 4.0, id="no more than the time left"),
    P(10.0, 0.5, False, 0.0, 1.0, id="at least 1 s however little is left"),
    P(10.0, 0.0, False, 0.0, 1.0, id="at least 1 s with nothing left"),
    P(0.5, 100.0, False, 0.0, 0.5, id="a --grace under 1 s is kept"),
    P(10.0, 3.14159, False, 0.0, 3.142, id="rounded to ms"),
    P(10.0, 100.0, True, 0.0, 10.0, id="scheduler's TERM this instant: the whole grace"),
    P(10.0, 100.0, True, 3.0, 7.0, id="scheduler's TERM 3 s ago: what is left of the grace"),
    P(10.0, 100.0, True, 10.0, 0.0, id="scheduler's TERM exactly a grace ago: none left"),
    P(10.0, 100.0, True, 12.0, 0.0, id="scheduler's TERM longer ago than the grace: none, never negative"),
    P(10.0, 4.0, True, 3.0, 4.0, id="scheduler's TERM: still no more than the time left"),
]


@pytest.mark.parametrize(("grace", "left", "signalled", "since", "expected"), GRACE_FOR)
def test_grace_for(grace: float, left: float, signalled: bool, since: float, expected: float) -> None:
    assert policy.grace_for(grace, left, already_signalled=signalled, since_trigger=since) == expected


# The hang bound: 5 × the longest gap (EWMA across attempts, oldest first, α = ½), at least
# the floor (hang_floor; 10 s in these rows unless a fifth value says otherwise), at most
# hang_after, which wins over a larger floor; unset, no upper bound (docs/slurm.md "Hangs").
HANG_BOUND = [
    P(600.0, [], [], (600.0, None), id="nothing learned: hang_after"),
    P(600.0, [1.0, 2.0, 3.0, 4.0], [], (600.0, None), id="4 gaps this attempt: not enough to learn"),
    P(600.0, [1.0, 2.0, 3.0, 4.0, 5.0], [], (25.0, 25.0), id="5 gaps: 5 x the longest"),
    P(600.0, [5.0, 4.0, 3.0, 2.0, 1.0, 0.5], [], (25.0, 25.0), id="the longest gap, wherever it is"),
    P(600.0, [2.0] * 5, [], (10.0, 10.0), id="learned exactly the floor"),
    P(600.0, [1.9] * 5, [], (10.0, 9.5), id="learned just under the floor: 10 s"),
    P(600.0, [1.0] * 5, [], (10.0, 5.0), id="learned under the floor: 10 s"),
    P(20.0, [5.0] * 5, [], (20.0, 25.0), id="learned over hang_after: hang_after"),
    P(25.0, [5.0] * 5, [], (25.0, 25.0), id="learned exactly hang_after"),
    P(600.0, [], [4.0], (20.0, 20.0), id="an earlier attempt taught it"),
    P(600.0, [1.0, 2.0, 3.0, 9.0], [4.0], (20.0, 20.0), id="earlier attempt, this one under 5 gaps: earlier only"),
    P(600.0, [], [2.0, 6.0, 10.0], (35.0, 35.0), id="EWMA oldest first: 2, 6, 10 smooth to 7"),
    P(600.0, [], [10.0, 6.0, 2.0], (25.0, 25.0), id="EWMA oldest first: 10, 6, 2 smooth to 5"),
    P(600.0, [8.0] * 5, [2.0, 4.0], (27.5, 27.5), id="earlier attempts, then this one's longest last"),
    P(600.0, [1.23456] * 5, [], (10.0, 6.173), id="the learned part rounded to ms"),
    # issue 22: hang_after unset (the default) and the hang_floor key (10 min by default)
    P(None, [1.0] * 4, [], (math.inf, None), id="auto, nothing learned: never a hang"),
    P(None, [1.0] * 5, [], (600.0, 5.0), 600.0, id="auto, learned under the 10 min floor: the floor"),
    P(None, [3600.0] * 5, [], (18000.0, 18000.0), 600.0, id="auto, hourly checkpoints: 5 h, no upper bound"),
    P(300.0, [1.0] * 5, [], (300.0, 5.0), 600.0, id="hang_after under the floor: hang_after wins"),
]


@pytest.mark.parametrize(("hang_after", "gaps", "earlier", "expected", "floor"),
                         [P(*p.values, *(() if len(p.values) == 5 else (10.0,)), id=p.id, marks=p.marks)
                          for p in HANG_BOUND])
def test_hang_bound(hang_after: float | None, gaps: list[float], earlier: list[float],
                    expected: tuple[float, float | None], floor: float) -> None:
    bound, learned = policy.hang_bound(hang_after, gaps, earlier, floor)
    assert (bound, learned) == (pytest.approx(expected[0]), expected[1] if expected[1] is None
                                else pytest.approx(expected[1]))


# ---------------------------------------------------------------- checkpoints

IS_REQUESTED = [
    P(None, 100.0, False, id="no checkpoint completed"),
    P(50.0, 100.0, False, id="completed before the request"),
    P(99.9, 100.0, False, id="completed just before the request"),
    P(100.0, 100.0, True, id="completed at the request's instant counts"),
    P(100.1, 100.0, True, id="completed just after the request"),
]


@pytest.mark.parametrize(("done_at", "requested_at", "expected"), IS_REQUESTED)
def test_is_requested(done_at: float | None, requested_at: float, expected: bool) -> None:
    assert policy.is_requested(done_at, requested_at) is expected


# docs/journal.md "Stop reasons" and NO_CHECKPOINT: a hung training cannot answer; a person's
# stop and the child's own end ask for none; a supervisor error stops the child safely.
WANTS_CHECKPOINT = [
    P(Reason.DEADLINE, True, id="deadline: checkpoint"),
    P(Reason.PREEMPTED, True, id="preempted: checkpoint"),
    P(Reason.ERROR, True, id="supervisor error: checkpoint, the child is stopped safely"),
    P(Reason.CANCELLED, False, id="cancelled by a person: none"),
    P(Reason.CHILD_EXIT, False, id="the training finished: none"),
    P(Reason.CHILD_FAILED, False, id="the training failed: none"),
    P(Reason.SPAWN_FAILED, False, id="never started: none"),
    P(Reason.HANG, False, id="hung: none, it cannot answer"),
    P(Reason.NODE_FAILED, False, id="a node died: none, the collective lost a member"),
]


@pytest.mark.parametrize(("reason", "expected"), WANTS_CHECKPOINT)
def test_wants_checkpoint(reason: Reason, expected: bool) -> None:
    assert policy.wants_checkpoint(reason) is expected


# Saves every 10 s at 0, 10, 20: the period is 10 s, the tolerance max(0.15 × 10, 0.2) = 1.5 s.
# Disputed: a save at the due time landing within the tolerance *after* the request (saves
# [0, 10, 20], asked 29, done 30): the docstring calls that "the next periodic save, due then
# anyway" (False); the code says answered (True) when it came within the tolerance of the request.
ANSWERED_REQUEST = [
    P([0.0, 10.0, 20.0], 25.0, None, None, id="nothing completed: unknown"),
    P([], 25.0, 26.0, None, id="no earlier saves: no rhythm known"),
    P([10.0], 25.0, 26.0, None, id="one save before the request: no rhythm known"),
    P([10.0, 26.0], 25.0, 26.0, None, id="saves after the request teach no rhythm"),
    P([0.0, 10.0, 20.0], 25.0, 30.0, False, id="exactly the next periodic save: not answered"),
    P([0.0, 10.0, 20.0], 25.0, 28.5, False, id="periodic save exactly the tolerance early: not answered"),
    P([0.0, 10.0, 20.0], 25.0, 31.5, False, id="periodic save exactly the tolerance late: not answered"),
    P([0.0, 10.0, 20.0], 25.0, 28.4, True, id="just over the tolerance before the due save: answered"),
    P([0.0, 10.0, 20.0], 25.0, 31.6, True, id="just over the tolerance after the due save: answered"),
    P([0.0, 10.0, 20.0], 25.0, 27.0, True, id="well before the next periodic save: answered"),
    P([0.0, 10.0, 20.0], 45.0, 50.0, False, id="a skipped save: the one after it is still periodic"),
    P([0.0, 10.0, 20.0], 45.0, 47.0, True, id="a skipped save, answered in between"),
    P([0.0, 10.0, 20.0, 50.0], 55.0, 60.0, False, id="the period is the median gap: one long pause does not stretch it"),
    P([0.0, 1.0, 2.0], 2.5, 3.18, False, id="fast saves: 0.18 s from the due save is periodic (tolerance at least 0.2 s)"),
    P([0.0, 1.0, 2.0], 2.5, 3.3, True, id="fast saves: just over 0.2 s from the due save, answered"),
    P([0.0, 10.0, 20.0], 29.0, 30.0, True,
      id="done within the tolerance of the request, also the due save: a prompt answer by time, answered"),
]


@pytest.mark.parametrize(("saves", "asked_at", "done_at", "expected"), ANSWERED_REQUEST)
def test_answered_request(saves: list[float], asked_at: float, done_at: float | None, expected: bool | None) -> None:
    assert policy.answered_request(saves, asked_at, done_at) is expected


# ---------------------------------------------------------------- the end

# Default inputs: the reason allows it, --requeue, Slurm, restart 0 of 3.
REQUEUE_DECISION = [
    P(Reason.DEADLINE, {}, (True, ""), id="deadline: requeued"),
    P(Reason.PREEMPTED, {}, (True, ""), id="preempted: requeued"),
    P(Reason.HANG, {}, (True, ""), id="hang: requeued"),
    P(Reason.CANCELLED, {}, (False, "not after cancelled"), id="cancelled: not requeued"),
    P(Reason.CHILD_EXIT, {}, (False, "not after child-exit"), id="finished: not requeued"),
    P(Reason.CHILD_FAILED, {}, (False, "not after child-failed"), id="failed without --requeue-on-failure: not requeued"),
    P(Reason.SPAWN_FAILED, {}, (False, "not after spawn-failed"), id="spawn failed: not requeued"),
    P(Reason.ERROR, {}, (False, "not after supervisor-error"), id="supervisor error: not requeued"),
    P(Reason.CHILD_FAILED, {"on_failure": True}, (True, ""), id="failed with --requeue-on-failure: requeued"),
    P(Reason.CHILD_FAILED, {"suspect": True}, (True, ""), id="failed on a suspect node: requeued elsewhere"),
    P(Reason.CHILD_EXIT, {"on_failure": True, "suspect": True}, (False, "not after child-exit"),
      id="finished: not requeued even with on-failure and a suspect node"),
    P(Reason.SPAWN_FAILED, {"on_failure": True}, (False, "not after spawn-failed"),
      id="spawn failed: not requeued even with --requeue-on-failure"),
    P(Reason.CANCELLED, {"suspect": True}, (False, "not after cancelled"), id="cancelled on a suspect node: not requeued"),
    P(Reason.DEADLINE, {"requeue": False}, (False, "requeue is off"), id="--requeue off"),
    P(Reason.DEADLINE, {"requeue": False, "queued": False}, (False, "requeue is off"),
      id="--requeue off is said first"),
    P(Reason.DEADLINE, {"queued": False}, (False, "no scheduler to requeue with"), id="no scheduler (a local run)"),
    P(Reason.DEADLINE, {"queued": True}, (True, ""), id="a batch job requeues (Slurm and PBS alike)"),
    P(Reason.PREEMPTED, {"already": True}, (False, "the scheduler already requeued the job"),
      id="the scheduler already requeued it"),
    P(Reason.DEADLINE, {"restart_count": 2}, (True, ""), id="restart 2 of max 3: requeued"),
    P(Reason.DEADLINE, {"restart_count": 3}, (False, "max_requeues 3 reached"), id="restart 3 of max 3: spent"),
    P(Reason.DEADLINE, {"restart_count": 4}, (False, "max_requeues 3 reached"), id="restart 4 of max 3: spent"),
    P(Reason.DEADLINE, {"max_requeues": 0}, (False, "max_requeues 0 reached"), id="max_requeues 0: never"),
    P(Reason.NODE_FAILED, {}, (True, ""), id="a node died: requeued with requeue = true (issue 42: PBS as Slurm)"),
    P(Reason.NODE_FAILED, {"requeue": False}, (False, "requeue is off"), id="a node died, requeue off"),
]


@pytest.mark.parametrize(("reason", "changes", "expected"), REQUEUE_DECISION)
def test_requeue_decision(reason: Reason, changes: dict[str, Any], expected: tuple[bool, str]) -> None:
    args: dict[str, Any] = {"requeue": True, "on_failure": False, "queued": True, "already": False,
                            "restart_count": 0, "max_requeues": 3, **changes}
    assert policy.requeue_decision(reason, **args) == expected


REPLACE_DECISION = [
    P(Reason.NODE_FAILED, {}, (True, ""), id="a node died, one spare: replaced inside the allocation"),
    P(Reason.NODE_FAILED, {"spares": 0}, (False, "no spare node left"), id="a node died, no spare: the requeue decides"),
    P(Reason.NODE_FAILED, {"lost": ["n2", "n3"], "spares": 1}, (False, "2 nodes lost, 1 spare left"),
      id="two died, one spare: requeue"),
    P(Reason.NODE_FAILED, {"lost": ["n2", "n3"], "spares": 2}, (True, ""), id="two died, two spares: both replaced"),
    P(Reason.NODE_FAILED, {"leader_lost": True}, (False, "the batch node died"), id="the batch node: requeue"),
    P(Reason.NODE_FAILED, {"replaced": 1, "spares": 1}, (True, ""), id="a second death uses the second spare"),
    P(Reason.NODE_FAILED, {"max_replacements": 1, "replaced": 1, "spares": 1}, (False, "max_node_replacements 1 reached"),
      id="max_node_replacements spent: requeue though a spare is left"),
    P(Reason.NODE_FAILED, {"max_replacements": 0}, (False, "max_node_replacements 0 reached"),
      id="max_node_replacements 0: never"),
    P(Reason.NODE_FAILED, {"lost": []}, (False, "not after node-failed"), id="no node named: nothing to replace"),
    P(Reason.CHILD_FAILED, {}, (False, "not after child-failed"), id="the training failed: no replacement"),
    P(Reason.PREEMPTED, {}, (False, "not after preempted"), id="preempted: the requeue decides"),
]


@pytest.mark.parametrize(("reason", "changes", "expected"), REPLACE_DECISION)
def test_replace_decision(reason: Reason, changes: dict[str, Any], expected: tuple[bool, str]) -> None:
    args: dict[str, Any] = {"lost": ["n2"], "leader_lost": False, "spares": 1, "replaced": 0, "max_replacements": None,
                            **changes}
    assert policy.replace_decision(reason, **args) == expected


def test_requeue_table_names_every_reason() -> None:
    _covers_every_reason(REQUEUE_DECISION)
    _covers_every_reason(WANTS_CHECKPOINT)
    _covers_every_reason(STOPPED_CLEANLY)
    _covers_every_reason(EXCLUDE_NODE)


TERM = Trigger(Reason.PREEMPTED, signal=S.SIGTERM)
INT = Trigger(Reason.CANCELLED, signal=S.SIGINT)
DEADLINE = Trigger(Reason.DEADLINE)
CLEAN = {"stopped_cleanly": True}
# docs/slurm.md "Exit status": 3 no progress; a requeued job 0 after a clean stop; 74 not durable;
# a clean stop stopped_status; 75 a training left unfinished and not requeued ("auto"); else the child's.
EXIT_STATUS = [
    P(0, Trigger(Reason.CHILD_EXIT), {}, 0, id="the child's 0"),
    P(1, Trigger(Reason.CHILD_FAILED), {}, 1, id="the child's 1"),
    P(143, TERM, {}, 143, id="the child's 143 after our TERM"),
    P(None, TERM, {}, 143, id="TERM before the child ran: 128 + 15"),
    P(None, INT, {}, 130, id="INT before the child ran: 128 + 2"),
    P(None, policy.NO_TRIGGER, {}, 1, id="no child status and no signal: 1"),
    P(127, Trigger(Reason.SPAWN_FAILED), {}, 127, id="command not found: 127"),
    # a clean stop (checkpoint durable, no SIGKILL)
    P(1, DEADLINE, {**CLEAN, "requeued": True}, 0, id="a clean stop, requeued: 0 whatever the launcher said"),
    P(None, TERM, {**CLEAN, "requeued": True}, 0, id="a clean stop, requeued, no child status: 0"),
    P(1, DEADLINE, CLEAN, 75, id="a clean stop, not requeued: 75, the training is unfinished (afterok must not fire)"),
    P(0, TERM, CLEAN, 75, id="a clean preemption stop, not requeued, the launcher's 0: 75"),
    P(1, DEADLINE, {**CLEAN, "stopped_status": 0}, 0, id="stopped_status 0 set: 0, as before, requeued or not"),
    P(1, DEADLINE, {**CLEAN, "stopped_status": 5, "requeued": True}, 5, id="stopped_status 5 set, requeued: 5"),
    P(1, DEADLINE, {**CLEAN, "stopped_status": None}, 1, id="stopped_status child: the launcher's"),
    P(1, DEADLINE, {**CLEAN, "stopped_status": None, "requeued": True}, 1, id="stopped_status child, requeued: the launcher's"),
    # a stop that was not clean leaves the training unfinished too
    P(0, DEADLINE, {}, 75, id="a deadline stop, checkpoint not durable, the child's 0: 75"),
    P(0, INT, {}, 75, id="a cancel the training answered with 0: 75"),
    P(0, Trigger(Reason.HANG), {}, 75, id="a hang stop the training answered with 0: 75"),
    P(0, Trigger(Reason.ERROR), {}, 75, id="a supervisor error, the child's 0: 75"),
    P(0, DEADLINE, {"requeued": True}, 0, id="an unclean stop, requeued: the child's 0"),
    P(143, DEADLINE, {"requeued": True}, 143, id="an unclean stop, requeued: the child's 143"),
    P(143, DEADLINE, {}, 143, id="an unclean stop the child died of: its 143, already not 0"),
    P(0, DEADLINE, {"stopped_status": 0}, 0, id="stopped_status set: an unclean stop keeps the child's 0"),
    P(0, DEADLINE, {"stopped_status": None}, 0, id="stopped_status child: an unclean stop keeps the child's 0"),
    # not durable at the end
    P(0, Trigger(Reason.CHILD_EXIT), {"not_durable": True}, 74, id="finished, something not durable: 74"),
    P(3, Trigger(Reason.CHILD_FAILED), {"not_durable": True}, 3, id="failed, something not durable: its own 3"),
    P(143, DEADLINE, {"not_durable": True}, 143, id="an unclean stop it died of, something not durable: its 143"),
    P(0, DEADLINE, {"not_durable": True}, 74, id="an unclean stop answered with 0, something not durable: 74"),
    P(1, DEADLINE, {**CLEAN, "not_durable": True}, 74, id="a clean stop, a log not durable: 74"),
    P(1, DEADLINE, {**CLEAN, "not_durable": True, "stopped_status": 0}, 74, id="not durable wins over stopped_status"),
    P(0, Trigger(Reason.CHILD_EXIT), {"not_durable": True, "not_durable_status": 9}, 9, id="not_durable_status 9: 9"),
    P(0, Trigger(Reason.CHILD_EXIT), {"not_durable": True, "not_durable_status": None}, 0,
      id="not_durable_status child: the training's 0"),
    P(0, DEADLINE, {"not_durable": True, "not_durable_status": None}, 75, id="not_durable_status child, unfinished: 75"),
    P(1, DEADLINE, {**CLEAN, "not_durable": True, "requeued": True}, 0, id="requeued: the requeue's 0, not 74"),
    P(1, Trigger(Reason.NODE_FAILED), {}, 1, id="a node died, not requeued nor replaced: the training's failure"),
    P(0, Trigger(Reason.NODE_FAILED), {}, 75, id="a node died, its ranks said 0, not requeued: unfinished, 75"),
    P(1, Trigger(Reason.NODE_FAILED), {"requeued": True}, 1, id="a node died, requeued: the training's status"),
    # no progress wins
    P(1, TERM, {**CLEAN, "no_progress": True}, 3, id="no progress wins over a clean stop: 3"),
    P(0, DEADLINE, {"no_progress": True}, 3, id="no progress wins over the child's 0: 3"),
    P(0, DEADLINE, {"no_progress": True, "not_durable": True}, 3, id="no progress wins over not durable: 3"),
]


@pytest.mark.parametrize(("child", "trigger", "changes", "expected"), EXIT_STATUS)
def test_exit_status(child: int | None, trigger: Trigger, changes: dict[str, Any], expected: int) -> None:
    assert policy.exit_status(child, trigger, **changes) == expected


def test_exit_status_table_names_every_reason() -> None:
    assert {row.values[1].reason for row in EXIT_STATUS} == set(Reason)


OWED = [
    P([], False, id="nothing left"),
    P(["ckpt: step_7 (torn: newer than latest, which never named it; never published)"], False,
      id="a torn checkpoint only: the training died writing it, nothing of it can be durable"),
    P(["node 1: ckpt: step_7 (torn: the training ended before writing .metadata; never published)"], False,
      id="a node's torn part only"),
    P(["ckpt: step_7 (torn: x; never published)", "ckpt: step_8 (complete, not yet on persistent storage)"], True,
      id="a torn one and a complete one not landed"),
    P(["ckpt: step_8 (incomplete: settling)"], True, id="one still settling at the end"),
    P(["ckpt: latest (refused: another run's latest is on persistent storage)"], True, id="a refused pointer"),
    P(["ckpt: step_1 (waiting for parts: node 1 missing)"], True, id="a checkpoint waiting for a node's part"),
    P(["ckpt: stalled copy"], True, id="any other line"),
]


@pytest.mark.parametrize(("lines", "expected"), OWED)
def test_owed(lines: list[str], expected: bool) -> None:
    assert policy.owed(lines) is expected


@pytest.mark.parametrize(("status", "expected"), [
    P(143, True, id="TERM: a scancel, the time limit, a requeue"),
    P(137, True, id="KILL"),
    P(130, True, id="INT"),
    P(129, True, id="HUP"),
    P(1, False, id="a failure"),
    P(139, False, id="SEGV: the training's own fault"),
    P(None, False, id="no status"),
])
def test_died_of_stop_signal(status: int | None, expected: bool) -> None:
    assert policy.died_of_stop_signal(status) is expected


GOOD_STOP: dict[str, dict[str, object]] = {
    "checkpoint": {"outcome": "published"}, "flush": {"outcome": "done"},
    "stop-child": {"graceful": True, "killed": False}, "final-flush": {"outcome": "done"}}


def _with(step: str, fields: dict[str, object] | None) -> dict[str, dict[str, object]]:
    """GOOD_STOP with one step's fields replaced (None: the step left out)."""
    steps = {k: v for k, v in GOOD_STOP.items() if k != step}
    return steps if fields is None else {**steps, step: fields}


# docs/slurm.md "Exit status of a stop": a hang stop asks for no checkpoint (a hung training cannot
# save), so it keeps the child's status, as Ctrl-C and scancel do.
STOPPED_CLEANLY = [
    P(Reason.DEADLINE, GOOD_STOP, True, id="deadline, every step right: clean"),
    P(Reason.PREEMPTED, GOOD_STOP, True, id="preempted, every step right: clean"),
    P(Reason.HANG, GOOD_STOP, False, id="hang: no checkpoint asked, the child's status"),
    P(Reason.CANCELLED, GOOD_STOP, False, id="cancelled: the child's status"),
    P(Reason.CHILD_EXIT, GOOD_STOP, False, id="the training finished by itself: not a stop"),
    P(Reason.CHILD_FAILED, GOOD_STOP, False, id="the training failed by itself: not a stop"),
    P(Reason.SPAWN_FAILED, GOOD_STOP, False, id="never started: not a stop"),
    P(Reason.ERROR, GOOD_STOP, False, id="supervisor error: not clean"),
    P(Reason.NODE_FAILED, GOOD_STOP, False, id="a node died: not a clean stop"),
    P(Reason.DEADLINE, _with("checkpoint", None), False, id="no checkpoint step: not clean"),
    P(Reason.DEADLINE, _with("checkpoint", {"outcome": "timeout"}), False, id="checkpoint timed out: not clean"),
    P(Reason.DEADLINE, _with("checkpoint", {"outcome": "child-exited"}), False, id="child exited before the checkpoint"),
    P(Reason.DEADLINE, _with("checkpoint", {"outcome": "requested"}), False, id="checkpoint not seen durable"),
    P(Reason.DEADLINE, _with("flush", {"outcome": "timeout"}), False, id="the flush timed out: not clean"),
    P(Reason.DEADLINE, _with("final-flush", {"outcome": "error"}), False, id="the final flush failed: not clean"),
    P(Reason.DEADLINE, _with("stop-child", {"graceful": True, "killed": True}), False, id="SIGKILL needed: not clean"),
    P(Reason.DEADLINE, _with("stop-child", {"graceful": False, "killed": False}), False, id="not graceful: not clean"),
    P(Reason.DEADLINE, _with("stop-child", {"graceful": True, "killed": False, "error": "boom"}), False,
      id="stopping the child raised: not clean"),
    P(Reason.DEADLINE, _with("stop-child", None), False, id="no stop-child step: not clean"),
]


@pytest.mark.parametrize(("reason", "steps", "expected"), STOPPED_CLEANLY)
def test_stopped_cleanly(reason: Reason, steps: dict[str, dict[str, object]], expected: bool) -> None:
    assert policy.stopped_cleanly(reason, steps) is expected


# docs/slurm.md "Runs that cannot progress": no checkpoint in the last N attempts, this one
# included; 0 turns it off.
NO_PROGRESS = [
    P([False, False], 0, False, id="0 turns it off"),
    P([False, False], 2, True, id="none in the last 2 of 2: no progress"),
    P([True, False], 2, False, id="the previous attempt published: progress"),
    P([False, True], 2, False, id="this attempt published: progress"),
    P([True, False, False], 2, True, id="only the last 2 attempts count"),
    P([False], 2, False, id="fewer attempts than asked: not judged yet"),
    P([], 2, False, id="no attempts: not judged"),
    P([False], 1, True, id="window of 1: this attempt published nothing"),
    P([False, False, False], 3, True, id="none in the last 3 of 3"),
]


@pytest.mark.parametrize(("progress", "attempts", "expected"), NO_PROGRESS)
def test_no_progress(progress: list[bool], attempts: int, expected: bool) -> None:
    assert policy.no_progress(progress, attempts) is expected


def _ev(kind: str, attempt: object, **fields: object) -> dict[str, object]:
    return {"kind": kind, "attempt": attempt, **fields}


PROGRESS_BY_ATTEMPT = [
    P([], [], id="an empty journal: no attempts"),
    P([_ev("start", 1)], [False], id="an attempt that published nothing"),
    P([_ev("start", 1), _ev("publish", 1)], [True], id="an attempt that published"),
    P([_ev("start", 1), _ev("publish", 1, pointer=True)], [False], id="a pointer alone is no checkpoint"),
    P([_ev("start", 1), _ev("start", 2), _ev("publish", 2)], [False, True], id="per attempt, oldest first"),
    P([_ev("start", 2), _ev("start", 1), _ev("publish", 1)], [True, False], id="ordered by attempt, not by line"),
    P([_ev("start", 1), _ev("publish", 1), _ev("start", 1)], [True], id="a repeated start keeps the publish"),
    P([_ev("start", 1), _ev("publish", 3)], [False, True], id="an attempt seen only by its publish counts"),
    P([_ev("start", "1"), _ev("publish", None), {"kind": "start"}], [], id="lines without an integer attempt are skipped"),
]


@pytest.mark.parametrize(("events", "expected"), PROGRESS_BY_ATTEMPT)
def test_progress_by_attempt(events: list[dict[str, object]], expected: list[bool]) -> None:
    assert policy.progress_by_attempt(events) == expected


# ---------------------------------------------------------------- suspect nodes

GPU_FAULT = [
    *[P("gpu-xid", {"xid": x, "device": 0}, f"XID {x} on GPU 0", id=f"XID {x} ({what}) makes the node suspect")
      for x, what in ((48, "double-bit ECC"), (64, "row-remap failure"), (79, "fallen off the bus"),
                      (94, "contained ECC"), (95, "uncontained ECC"))],
    P("gpu-xid", {"xid": 13, "device": 0}, None, id="XID 13 (the training's fault) does not"),
    P("gpu-xid", {"xid": 31, "device": 1}, None, id="XID 31 (a page fault in the training) does not"),
    P("gpu-xid", {"device": 0}, None, id="an XID event without a number does not"),
    P("gpu-lost", {"device": 1}, "GPU 1 lost", id="a lost GPU makes the node suspect"),
    P("gpu-end", {"xid": 79, "device": 0}, None, id="another GPU event does not, whatever its fields"),
]


@pytest.mark.parametrize(("kind", "fields", "expected"), GPU_FAULT)
def test_gpu_fault(kind: str, fields: dict[str, object], expected: str | None) -> None:
    assert policy.gpu_fault(kind, fields) == expected


EXCLUDE_NODE = [
    P(Reason.HANG, [], ["hang"], id="a hang excludes the node"),
    P(Reason.HANG, ["XID 79 on GPU 0"], ["XID 79 on GPU 0", "hang"], id="a hang after a fault: both"),
    P(Reason.CHILD_FAILED, ["GPU 1 lost"], ["GPU 1 lost"], id="a crash after a lost GPU: the fault"),
    P(Reason.DEADLINE, ["XID 48 on GPU 0", "GPU 1 lost"], ["XID 48 on GPU 0", "GPU 1 lost"], id="every fault, in order"),
    *[P(r, [], [], id=f"{r.value} without a fault: not excluded")
      for r in Reason if r != Reason.HANG],
]


@pytest.mark.parametrize(("reason", "faults", "expected"), EXCLUDE_NODE)
def test_exclude_node(reason: Reason, faults: list[str], expected: list[str]) -> None:
    assert policy.exclude_node(reason, faults) == expected


RESTART_IN_PLACE = [
    P(1, 0, 2, [], True, id="a crash with restarts left and no fault: restart"),
    P(137, 1, 2, [], True, id="a killed child, last restart left: restart"),
    P(1, 2, 2, [], False, id="restarts exactly spent: no restart"),
    P(1, 3, 2, [], False, id="restarts over spent: no restart"),
    P(1, 0, 0, [], False, id="max_restarts 0: never"),
    P(0, 0, 2, [], False, id="a clean exit is not a crash"),
    P(1, 0, 2, ["XID 79 on GPU 0"], False, id="a crash after a GPU fault: not on the same GPUs"),
]


@pytest.mark.parametrize(("status", "restarts", "max_restarts", "faults", "expected"), RESTART_IN_PLACE)
def test_restart_in_place(status: int, restarts: int, max_restarts: int, faults: list[str], expected: bool) -> None:
    assert policy.restart_in_place(status, restarts=restarts, max_restarts=max_restarts, faults=faults) is expected


GPU_MEMORY_FREED = [
    P(None, True, id="unknown counts as free"),
    P(0, True, id="nothing held"),
    P(256 * MIB - 1, True, id="just under 256 MiB held"),
    P(256 * MIB, True, id="exactly 256 MiB held"),
    P(256 * MIB + 1, False, id="just over 256 MiB held"),
    P(1024 * MIB, False, id="1 GiB held"),
]


@pytest.mark.parametrize(("held", "expected"), GPU_MEMORY_FREED)
def test_gpu_memory_freed(held: int | None, expected: bool) -> None:
    assert policy.gpu_memory_freed(held) is expected


@pytest.mark.parametrize(("grace", "expected"), [
    P(30.0, 10.0, id="--grace past 10 s: 10 s for the leftovers"),
    P(10.0, 10.0, id="exactly 10 s"),
    P(3.0, 3.0, id="a shorter --grace is kept"),
])
def test_restart_grace(grace: float, expected: float) -> None:
    assert policy.restart_grace(grace) == expected


@pytest.mark.parametrize(("grace", "expected"), [
    P(30.0, 35.0, id="the grace and 5 s"),
    P(0.0, 5.0, id="no grace: 5 s"),
])
def test_exit_wait(grace: float, expected: float) -> None:
    assert policy.exit_wait(grace) == expected


@pytest.mark.parametrize(("grace", "expected"), [
    P(30.0, 40.0, id="the grace and 10 s"),
    P(0.0, 10.0, id="no grace: 10 s"),
])
def test_emergency_bound(grace: float, expected: float) -> None:
    assert policy.emergency_bound(grace) == expected


# ---------------------------------------------------------------- every function has a table

def _public_functions() -> set[str]:
    return {name for name, f in inspect.getmembers(policy, inspect.isfunction)
            if not name.startswith("_") and f.__module__ == policy.__name__}


def _tables() -> dict[str, Callable[..., None]]:
    """``test_<function>`` of this module, for each table-driven test (parametrized)."""
    tests = {name.removeprefix("test_"): f for name, f in globals().items()
             if name.startswith("test_") and callable(f)}
    return {name: f for name, f in tests.items()
            if any(m.name == "parametrize" for m in getattr(f, "pytestmark", []))}


def test_every_public_function_has_a_table() -> None:
    functions = _public_functions()
    assert len(functions) >= 25, functions  # the inspection itself works
    missing = functions - set(_tables())
    assert not missing, f"policy.py functions without a table in {__name__}: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(_public_functions()))
def test_each_table_has_several_rows(name: str) -> None:
    marks = [m for m in getattr(_tables().get(name), "pytestmark", []) if m.name == "parametrize"]
    assert marks and len(marks[0].args[1]) >= 2, f"test_{name} needs a table of at least two rows"
