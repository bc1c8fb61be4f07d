"""supervisor.deadline: the learned warning lead and which end time governs."""

from __future__ import annotations

import pytest

from supervisor.deadline import learn_lead, percentile, resolve_end, step_durations, warning_time


def ev(step: str, seconds: object, attempt: int = 1, kind: str = "stop-step") -> dict:
    return {"v": 1, "t": 0.0, "attempt": attempt, "kind": kind, "step": step, "seconds": seconds}


def test_slow_checkpoints_warn_earlier_than_fast_ones() -> None:
    end = 100_000.0
    slow = learn_lead([ev("checkpoint", 240, 1), ev("flush", 20, 1), ev("checkpoint", 230, 2)])
    fast = learn_lead([ev("checkpoint", 10, 1), ev("flush", 2, 1), ev("checkpoint", 9, 2)])
    assert warning_time(end, slow) < warning_time(end, fast)
    assert slow == pytest.approx(1.25 * (240 + 20) + 30)  # 355 s
    assert fast == 60.0                                     # 1.25*12+30 = 45 → floor


def test_the_steps_of_one_stop_add_up() -> None:
    events = [ev("checkpoint", 100), ev("flush", 40), ev("final-flush", 20), ev("stop-child", 999)]
    assert learn_lead(events) == pytest.approx(1.25 * 160 + 30)


def test_nothing_learned_gives_the_default() -> None:
    assert learn_lead([]) == 300.0
    assert learn_lead([ev("stop-child", 3), {"kind": "end"}, ev("checkpoint", "x"), ev("flush", -1)]) == 300.0
    assert learn_lead([], default=120.0) == 120.0


def test_lead_is_capped() -> None:
    assert learn_lead([ev("checkpoint", 5000)]) == 1800.0
    assert learn_lead([ev("checkpoint", 5000)], cap=900) == 900.0


def test_p95_is_nearest_rank_so_one_slow_attempt_counts() -> None:
    assert percentile([10, 20, 300], 95) == 300
    assert percentile(list(range(1, 101)), 95) == 95
    lead = learn_lead([ev("checkpoint", s) for s in [10] * 19 + [400]])
    assert lead == 60.0  # 20 samples: p95 is the 19th (10 s): 1.25*10+30 = 42.5 → floor
    assert learn_lead([ev("checkpoint", s) for s in [10] * 5 + [400]]) == pytest.approx(1.25 * 400 + 30)


def test_only_earlier_attempts_are_learned_when_asked() -> None:
    events = [ev("checkpoint", 100, 1), ev("checkpoint", 900, 3)]
    assert learn_lead(events, before_attempt=2) == pytest.approx(1.25 * 100 + 30)
    assert step_durations(events, before_attempt=4)["checkpoint"] == [100.0, 900.0]


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
