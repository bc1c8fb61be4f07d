"""supervisor.deadline: the learned warning lead, fitted to the job, and which end time governs."""

from __future__ import annotations

import pytest

from supervisor.deadline import Lead, fit, learn, learn_lead, resolve_end, smooth, warning_time


def ev(step: str, seconds: object, attempt: int = 1, kind: str = "stop-step", **more: object) -> dict:
    if step == "checkpoint":
        more.setdefault("outcome", "published")
    return {"v": 1, "t": 0.0, "attempt": attempt, "kind": kind, "step": step, "seconds": seconds, **more}


def test_slow_checkpoints_warn_earlier_than_fast_ones() -> None:
    end = 100_000.0
    slow = learn_lead([ev("checkpoint", 240, 1), ev("flush", 20, 1), ev("checkpoint", 230, 2)])
    fast = learn_lead([ev("checkpoint", 10, 1), ev("flush", 2, 1), ev("checkpoint", 9, 2)])
    assert warning_time(end, slow) < warning_time(end, fast)


def test_the_need_is_the_sum_of_one_stops_steps_smoothed_across_attempts() -> None:
    events = [ev("checkpoint", 100, 1), ev("flush", 40, 1), ev("final-flush", 20, 1), ev("checkpoint", 40, 2)]
    lead = learn(events)
    assert [s["need_s"] for s in lead.samples] == [160, 40]
    assert lead.smoothed_need_s == pytest.approx(0.5 * 40 + 0.5 * 160)
    assert lead.seconds == pytest.approx(1.25 * 100 + 30) and lead.learned
    assert smooth([10, 20, 40]) == pytest.approx(0.5 * 40 + 0.5 * (0.5 * 20 + 0.5 * 10))


def test_a_stop_that_waited_for_a_periodic_save_teaches_nothing() -> None:
    """Issue 15: a 26 s wait for the next periodic save made every later attempt warn 63 s early."""
    events = [ev("checkpoint", 26.3, 1, answered=False), ev("flush", 0.1, 1)]
    lead = learn(events)
    assert not lead.learned and lead.seconds == 300.0
    assert lead.ignored[0]["attempt"] == 1 and "periodic" in lead.ignored[0]["why"]


@pytest.mark.parametrize("outcome", ["timeout", "child-exited", "no-time", "requested"])
def test_only_a_checkpoint_completed_after_the_request_teaches(outcome: str) -> None:
    lead = learn([ev("checkpoint", 500, 1, outcome=outcome), ev("flush", 5, 1)])
    assert not lead.learned and lead.ignored[0]["why"] == f"checkpoint {outcome}"


def test_nothing_learned_gives_the_default_and_bad_events_are_ignored() -> None:
    assert learn_lead([]) == 300.0
    assert learn_lead([ev("stop-child", 3), {"kind": "end"}, ev("checkpoint", "x"), ev("flush", -1)]) == 300.0
    assert learn_lead([], default=120.0) == 120.0


def test_cap_bounds_a_pathological_attempt() -> None:
    assert learn_lead([ev("checkpoint", 5000)]) == 1800.0
    assert learn_lead([ev("checkpoint", 5000)], cap=900) == 900.0


def test_before_attempt_excludes_the_current_and_later_attempts() -> None:
    events = [ev("checkpoint", 100, 1), ev("checkpoint", 900, 3)]
    assert learn_lead(events, before_attempt=2) == pytest.approx(1.25 * 100 + 30)


def test_the_first_attempts_lead_is_at_most_a_quarter_of_the_allocation() -> None:
    """Issue 15: a 2-minute attempt started its stop 0.1 s in, with the 5-minute default."""
    assert fit(Lead(300.0, False), 120.0) == (30.0, "first-share")
    assert fit(Lead(300.0, False), 7200.0) == (300.0, None)
    assert fit(Lead(300.0, False), None) == (300.0, None)


def test_a_learned_lead_keeps_a_floor_and_leaves_the_training_its_minimum_share() -> None:
    assert fit(Lead(63.0, True), 120.0) == (48.0, "min-share")   # 40 % of 120 s at most
    assert fit(Lead(33.0, True), 120.0) == (33.0, None)
    assert fit(Lead(35.0, True), 3600.0) == (60.0, "floor")
    assert fit(Lead(10.0, True), 120.0) == (30.0, "floor")       # the floor itself fits the job
    assert fit(Lead(35.0, True), None) == (60.0, "floor")


def test_resolve_end_flags_override_the_scheduler() -> None:
    now, start = 1000.0, 900.0
    assert resolve_end(now, start, 600, None, 5000.0) == (1500.0, "time-limit")
    assert resolve_end(now, start, None, 9000.0, 5000.0) == (9000.0, "deadline")
    assert resolve_end(now, start, 600, 1200.0, 5000.0) == (1200.0, "deadline")  # earlier flag wins
    assert resolve_end(now, start, None, None, 5000.0) == (5000.0, "scheduler")
    assert resolve_end(now, start, None, None, None) == (None, "none")
    assert resolve_end(now, None, 60, None, None) == (1060.0, "time-limit")


def test_warning_time_is_never_after_the_end() -> None:
    assert warning_time(1000.0, 300.0) == 700.0
    assert warning_time(1000.0, -5) == 1000.0
