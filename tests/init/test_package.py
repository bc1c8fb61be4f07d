"""The wheel: one copy of the templates, every subpackage, a console script that detects the
Supervisor daemon manager's `supervisor` package, and `supervise init` working from it alone."""

from __future__ import annotations

import os
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.wheel import build_wheel, fresh_venv


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return fresh_venv(tmp_path_factory.mktemp("venv") / "venv", wheel)


def test_the_wheel_ships_the_repo_templates_and_presets_byte_for_byte(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        shipped = {n: z.read(n) for n in z.namelist()}
    repo = {f"supervisor/job_scripts/{p.name}": p for p in (ROOT / "scripts").iterdir() if p.suffix in (".sbatch", ".pbs")}
    repo |= {f"supervisor/presets/{p.name}": p for p in (ROOT / "configs").glob("*.toml")}
    assert len(repo) >= 10
    for name, path in repo.items():
        assert shipped.get(name) == path.read_bytes(), name
    assert not [n for n in shipped if n.startswith("supervisor/job_scripts/") and n not in repo]


def test_every_subpackage_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "supervisor").rglob("__init__.py")}
    assert on_disk <= listed, on_disk - listed


def test_nvml_is_a_core_dependency_and_hints_name_the_distribution() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "supervise-hpc"
    assert any(d.startswith("nvidia-ml-py") for d in project["dependencies"])
    stale = [str(p.relative_to(ROOT)) for p in [*ROOT.glob("supervisor/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md"]
             if "install 'supervise[" in p.read_text() or "install supervise[" in p.read_text()
             or "pip install supervise\n" in p.read_text()]
    assert not stale, stale


def test_init_from_the_wheel_alone_writes_what_check_accepts(venv_bin: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM_", "PBS_", "PYTHON"))}
    env["PATH"] = f"{venv_bin}:{env['PATH']}"
    r = subprocess.run(["supervise", "init", "--scheduler", "slurm", "--launcher", "torchrun", "--gpus", "0", "--",
                        "torchrun", "--standalone", "--nproc-per-node", "2", "train.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "train.sbatch").read_text()
    assert f"VENV=${{VENV:-{venv_bin.parent}}}" in script
    env |= {"LOCAL_DIR": str(tmp_path / "local"), "PERSISTENT_DIR": str(tmp_path / "persistent")}
    c = subprocess.run(["supervise", "check", "--config", "train.toml", "--", "true"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "check: ready" in c.stderr


def test_a_foreign_supervisor_package_is_one_line_and_exit_2(venv_bin: Path, tmp_path: Path) -> None:
    # The Supervisor daemon manager's package as `pip install --target` lays it out: its
    # __init__.py says only "# this is a package", beside supervisord.py.
    foreign = tmp_path / "site" / "supervisor"
    foreign.mkdir(parents=True)
    (foreign / "__init__.py").write_text("# this is a package\n")
    (foreign / "supervisord.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "PYTHON"))}
    env["PYTHONPATH"] = str(tmp_path / "site")
    r = subprocess.run([str(venv_bin / "supervise"), "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert str(foreign) in r.stderr and "Supervisor daemon manager" in r.stderr
    ok = subprocess.run([str(venv_bin / "supervise"), "--version"], capture_output=True, text=True, timeout=60,
                        env={k: v for k, v in env.items() if k != "PYTHONPATH"})
    assert ok.returncode == 0 and ok.stdout.startswith("supervise "), ok.stderr


