"""The documentation points only inside the repository, and its links land (issue 42).

README.md and docs/*.md are read off the repository and off the sdist (MANIFEST.in ships
them): a reference to ``../shared/…`` (a folder beside one developer's clone) or a relative
link to a file or heading that is not there is a dead end for every other reader."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_no_document_points_outside_the_repository() -> None:
    outside = [f"{p.relative_to(ROOT)}:{i}" for p in DOCS for i, line in enumerate(p.read_text().splitlines(), 1)
               if "../shared" in line]
    assert not outside, outside


def test_every_relative_link_lands_on_a_file_and_heading() -> None:
    dead = []
    for doc in DOCS:
        for target in LINK.findall(re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check offline
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists() or not dest.is_relative_to(ROOT):
                dead.append(f"{doc.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                dead.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not dead, dead
