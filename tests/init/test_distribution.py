"""What a newcomer installs (issue 42): install lines that work before the project is on PyPI,
a wheel that carries its license and complete metadata, an sdist that carries every file the
README links to, and the example config reachable from the installed package
(``supervise init --example-config``). scripts/check-dist.sh (CI) installs the wheel alone into
a clean venv and runs the real ``supervise`` from it; these are the pieces, checked here."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.supervise import run_supervise
from tests.support.wheel import build_wheel

# builds in ./build/ as tests/init/test_package.py does: never at the same time (one xdist worker)
pytestmark = pytest.mark.xdist_group("tests/init/test_package.py")

EXAMPLE = ROOT / "configs" / "example.toml"


def test_init_example_config_prints_the_shipped_example_config(tmp_path: Path) -> None:
    r = run_supervise("init", "--example-config", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == EXAMPLE.read_text() and r.stderr == ""
    assert list(tmp_path.iterdir()) == []  # it prints, it writes nothing
    (tmp_path / "job.toml").write_text(r.stdout)
    c = run_supervise("check", "--config", str(tmp_path / "job.toml"), "--", "true", cwd=tmp_path)
    assert c.returncode == 0, c.stdout + c.stderr
    bad = run_supervise("init", "--example-config", "--", "torchrun", "train.py", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "takes no command" in bad.stderr, bad.stderr


def test_help_points_to_init_example_config_not_to_a_file_a_pip_user_lacks() -> None:
    run = run_supervise("--help")
    assert run.returncode == 0
    assert "supervise init --example-config" in run.stdout and "configs/example.toml" not in run.stdout
    init = run_supervise("init", "--help")
    assert init.returncode == 0 and "--example-config" in init.stdout


def test_the_readme_says_it_is_not_on_pypi_and_every_install_line_installs_a_path() -> None:
    for doc in (ROOT / "README.md", ROOT / "docs" / "install.md"):
        text = doc.read_text()
        assert re.search(r"not on PyPI yet", text, re.I), doc
        blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
        installs = [line.split("#")[0].split()[2:] for line in blocks.splitlines() if line.startswith("pip install")]
        assert installs, doc
        for words in installs:  # '.', '.[extras]' or a built file: never a name pip would look up on an index
            target = words[-1].strip("'\"")
            assert target.startswith((".", "dist/")), (doc.name, words)


def test_the_wheel_carries_the_license_and_complete_metadata(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = z.read(f"{info}/METADATA").decode()
        assert z.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        assert z.read("supervisor/presets/example.toml") == EXAMPLE.read_bytes()
    head, _, description = meta.partition("\n\n")
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert "License-Expression: Apache-2.0" in head and "License-File: LICENSE" in head
    classifiers = re.findall(r"^Classifier: (.+)$", head, re.M)
    assert "Operating System :: POSIX :: Linux" in classifiers and "Programming Language :: Python :: 3.10" in classifiers
    assert "Requires-Python: >=3.10" in head and "Description-Content-Type: text/markdown" in head
    # the long description (README.md) says where the documentation its relative links point to is
    assert "not on PyPI yet" in description and "docs/` folder of the repository and of the source distribution" in description


def test_the_sdist_carries_the_license_and_every_file_the_readme_links_to(tmp_path: Path) -> None:
    code = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (sdist,) = tmp_path.glob("supervise_hpc-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = t.getnames()
    root = names[0].split("/")[0]
    have = {n.removeprefix(root + "/") for n in names}
    links = {m.split("#")[0] for m in re.findall(r"\]\(([^)\s:]+)\)", (ROOT / "README.md").read_text())}
    assert links and {"LICENSE", "README.md", "pyproject.toml"} | links <= have, sorted(({"LICENSE"} | links) - have)
    assert "docs/install.md" in have and "docs/img/report.png" in have


def test_ci_runs_the_distribution_check() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/check-dist.sh" in ci
    assert (ROOT / "scripts" / "check-dist.sh").is_file()
