"""``exclude``: one meaning, gitignore's, in both copy backends.

* a pattern without a slash (``*.tmp``, ``scratch``) matches a name at any depth;
* a pattern with a slash at the start or in the middle (``/*.json``, ``step_*/optim``) is
  anchored at the pair's root; ``*`` and ``?`` never cross a ``/``; ``**`` does;
* a trailing ``/`` matches directories only; an excluded directory takes all it holds.

The pair engine copies one checkpoint at a time, so a copier's root is the checkpoint, not
the pair: ``within(name)`` rewrites the patterns for that root, in a form rsync reads the
same way (rsync's rules agree with gitignore's on these forms) and the Python copier reads
with this module.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence


def _glob_regex(glob: str) -> str:
    out, i = [], 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = glob.find("]", i + 2 if glob[i + 1 : i + 2] in ("!", "]") else i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = glob[i + 1 : j]
                body = "^" + body[1:] if body.startswith("!") else body
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Rule:
    text: str
    anchored: bool
    dir_only: bool
    regex: re.Pattern[str]


@lru_cache(maxsize=256)
def _compile(pattern: str) -> _Rule:
    body = pattern
    dir_only = body.endswith("/")
    body = body.rstrip("/")
    anchored = "/" in body
    body = body.lstrip("/")
    rx = _glob_regex(body)
    return _Rule(pattern, anchored, dir_only, re.compile(("^" if anchored else r"^(?:.*/)?") + rx + "$"))


def excluded(rel: str, patterns: Sequence[str], is_dir: bool = False) -> bool:
    """Does a pattern exclude ``rel`` (a path from the root the patterns are relative to)?
    Ancestors are not checked: walkers never descend into an excluded directory."""
    for p in patterns:
        rule = _compile(p)
        if rule.dir_only and not is_dir:
            continue
        if rule.regex.match(rel):
            return True
    return False


def excluded_path(rel: str, patterns: Sequence[str], is_dir: bool = False) -> bool:
    """As ``excluded``, with every ancestor directory of ``rel`` checked too."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        if excluded("/".join(parts[:i]), patterns, True):
            return True
    return excluded(rel, patterns, is_dir)


def within(name: str, patterns: Iterable[str]) -> tuple[str, ...]:
    """The patterns that apply inside the top-level entry ``name``, rooted at it."""
    out = []
    for p in patterns:
        rule = _compile(p)
        if not rule.anchored:
            out.append(p)
            continue
        first, _, rest = p.lstrip("/").partition("/")
        if not rest:
            continue  # names a top-level entry: decided by the scan, nothing inside
        if first == "**":
            out.append(p.lstrip("/"))   # '**/x' may match at the checkpoint's top too
            out.append("/" + rest)
        elif fnmatch.fnmatchcase(name, first) and not re.search(r"\*\*", first):
            out.append("/" + rest)
    return tuple(out)
