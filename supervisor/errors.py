"""Errors that carry one clear line for the user."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input: the command line, a config file or the environment. Exit status 2.

    The message is one line that names the key, the value and what would be right, so a
    researcher reading a batch log can fix the job script without reading our code.
    """

    exit_status = 2


class ConfigError(UsageError):
    """A config value that fails validation."""

    def __init__(self, key: str, value: object, expected: str, source: str = "") -> None:
        self.key = key
        self.value = value
        self.expected = expected
        self.source = source
        where = f" (from {source})" if source else ""
        super().__init__(f"{key} = {_shown(value)}{where}: {expected}")


SHOWN = 240  # characters of a value a one-line error shows (a 5000-character path stays readable)


def _shown(value: object) -> str:
    """``repr(value)``, its middle cut when it is long: both ends name the path."""
    text = repr(value)
    if len(text) <= SHOWN:
        return text
    keep = SHOWN // 2 - 20
    return f"{text[:keep]}…[{len(text) - 2 * keep} characters]…{text[-keep:]}"


try:
    BaseExceptionGroup  # noqa: B018  # novermin - the name's existence is the test
except NameError:  # Python 3.10: anyio's own dependency backports it
    from exceptiongroup import BaseExceptionGroup  # novermin - the backport


def root_cause(e: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups: what the journal names."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e
