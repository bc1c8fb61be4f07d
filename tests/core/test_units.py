"""Durations and signal names, as every room parses them."""

import signal

import pytest

from supervisor._units import format_duration, parse_duration, parse_signal


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400),
                                               ("1h", 3600), ("2m30s", 150), ("1.5s", 1.5), (45, 45), (0.25, 0.25)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "seconds"), [("01:30", 90), ("90:00", 5400), ("12:00:00", 43200), ("48:00:00", 172800),
                                               ("1-00", 86400), ("1-12:30", 131400), ("2-00:00:05", 172805),
                                               ("0-00:01:00", 60)])
def test_durations_as_the_scheduler_writes_them(text: str, seconds: float) -> None:
    """sbatch --time and PBS walltime: MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (a bare number stays seconds)."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["12:00:xx", "1:2:3:4", "1-", "1-2-3", "10:60", "1:61:00", "1:00:00s", ":30", "-1:00"])
def test_bad_durations_in_the_schedulers_forms(text: str) -> None:
    with pytest.raises(ValueError, match="HH:MM:SS"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["", "5 minutes", "1m1h", "1h1h", "-5", "m", "10x", True, float("nan"), float("inf"), "99999999999999h"])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError, match="90s"):
        parse_duration(text)


def test_format_round_trips() -> None:
    for s in (5400, 150, 45, 0.25, 86400):
        assert parse_duration(format_duration(s)) == s


@pytest.mark.parametrize(("name", "sig"), [("TERM", signal.SIGTERM), ("sigusr1", signal.SIGUSR1), ("USR2", signal.SIGUSR2), ("alrm", signal.SIGALRM)])
def test_signals(name: str, sig: signal.Signals) -> None:
    assert parse_signal(name) == sig


@pytest.mark.parametrize("name", ["FOO", "KILL", "SIGSTOP", "999", "10", "9", "19", "SEGV", "CHLD", "CONT", "TSTP", 15])
def test_bad_signals(name: str) -> None:
    with pytest.raises(ValueError):
        parse_signal(name)
