"""``supervise report DIR…``: the fleet view over a folder of run directories (docs/report.md,
"The fleet view").

The folder holds run directories made by the real supervise: the golden ones
(tests/report/make_golden.py: ``finished``; ``attempts``, a time limit then a preemption with an
XID 79 on its node; ``failed``; ``torn``, killed mid-write; ``slurm-requeued``, two
``scontrol requeue``s under the test Slurm), and two made here: one preempted by a SIGTERM with
two GPUs sampled (fake NVML) and one stopped by the hang watch, nested two folders down. Beside
them: a corrupt journal, a partial run (a log, no journal), and a journal that is a directory.
The bar: a row per run, totals whose ETTR and lost GPU-hours equal the sums over the single-run
reports' JSON, ``--json`` parses, the HTML draws its plots in headless Chromium.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.journal import read_journal
from tests.support.supervise import run_supervise, start_supervise

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
FAKE_NVML = ROOT / "tests" / "chaos" / "_fakenvml"
TRAINER = ROOT / "tests" / "helpers" / "trainer.py"
SCREENSHOT = ROOT / "docs" / "img" / "fleet.png"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
COPIED = ["finished", "attempts", "failed", "torn", "slurm-requeued"]
PROBLEMS = {"corrupt": "corrupt", "partial": "partial", "journal-is-a-dir": "corrupt"}


def report(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "supervisor", "report", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _preempted(run: Path, tmp: Path) -> None:
    """A real run with two sampled GPUs, preempted (SIGTERM) a second after its second durable
    checkpoint (two give the step rate, so its ETTR is measured); the training answers no
    checkpoint request and dies of the TERM, so that second is lost work."""
    env = {"PYTHONPATH": f"{FAKE_NVML}:{ROOT}", "CHAOS_FAKE_NVML": json.dumps({"gpus": [{}, {}]})}
    p = start_supervise("--run-dir", str(run), "--gpu-backend", "nvml", "--gpu-every", "0.5",
                        "--checkpoints", str(tmp / "local"), str(tmp / "persist"), "--grace", "5s",
                        "--checkpoint-timeout", "1s", "--",
                        sys.executable, str(TRAINER), str(tmp / "local"), "--every", "60", "--no-answer", "--ignore-stop",
                        env=env)
    try:
        deadline = time.monotonic() + 60
        while sum(e.get("kind") == "publish" and not e.get("pointer") for e in read_journal(run).events) < 2:
            assert time.monotonic() < deadline and p.poll() is None, "no checkpoint became durable"
            time.sleep(0.1)
        time.sleep(1.0)  # some work after the checkpoint: lost to the preemption
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    runs = root / "runs"
    for case in COPIED:
        shutil.copytree(GOLDEN / case, runs / case, ignore=shutil.ignore_patterns("expected.*"))
    _preempted(runs / "preempted", root / "work")
    hung = runs / "sweep" / "lr-3e-4" / "hung"
    r = run_supervise("--run-dir", str(hung), "--gpu-every", "0", "--hang-after", "1s", "--hang-action", "stop",
                      "--", "sleep", "60", timeout=90)
    assert read_journal(hung).events[-1]["reason"] == "hang", r.stderr[-2000:]
    (runs / "corrupt").mkdir()
    (runs / "corrupt" / "events.jsonl").write_bytes(os.urandom(300).replace(b"\n", b"") + b"\n\x00garbage")
    (runs / "partial").mkdir()
    (runs / "partial" / "supervise.log").write_text("2026-11-21T10:00:00Z supervise[1] INFO starting\n")
    (runs / "journal-is-a-dir" / "events.jsonl").mkdir(parents=True)
    (runs / "not-a-run" / "empty").mkdir(parents=True)  # a folder with no run below: no row
    return runs


@pytest.fixture(scope="module")
def doc(fleet: Path) -> dict:
    r = report(str(fleet), "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return json.loads(r.stdout)


READABLE = [*COPIED, "preempted", "sweep/lr-3e-4/hung"]


@pytest.fixture(scope="module")
def singles(fleet: Path) -> dict[str, dict]:
    out = {}
    for name in READABLE:
        r = report(str(fleet / name), "--json")
        assert r.returncode == 0, r.stderr
        out[name] = json.loads(r.stdout)
    return out


def test_a_row_per_run_and_each_row_says_what_the_single_run_report_says(doc: dict, singles: dict) -> None:
    rows = {r["name"]: r for r in doc["runs"]}
    assert set(rows) == set(READABLE) | set(PROBLEMS), sorted(rows)
    assert doc["schema"] == 1 and doc["kind"] == "fleet"
    for name, single in singles.items():
        row, g = rows[name], single["goodput"]
        assert row["state"] == single["verdict"]["status"] and row["attempts"] == single["verdict"]["attempts"], name
        assert row["ettr"] == g["ettr"] and row["lost_gpu_hours"] == g["lost_gpu_hours"], name
        assert row["wall_s"] == g["wall_s"] and row["gpus"] == g["gpus"], name
        last = single["checkpoints"]["last"]
        assert row["last_checkpoint"] == (last["name"] if last else None), name
    assert rows["preempted"]["state"] == "stopped" and rows["preempted"]["gpus"] == 2 and rows["preempted"]["ettr"] > 0.3
    assert rows["sweep/lr-3e-4/hung"]["state"] == "failed" and rows["sweep/lr-3e-4/hung"]["top_cause"] == "hang"
    assert rows["slurm-requeued"]["requeues"] >= 2 and rows["slurm-requeued"]["job_ids"]
    assert rows["torn"]["state"] == "killed"


def test_totals_equal_the_sums_over_the_single_run_reports(doc: dict, singles: dict) -> None:
    t = doc["totals"]
    goodputs = [s["goodput"] for s in singles.values()]
    lost = sum(g["lost_gpu_hours"] for g in goodputs if g["lost_gpu_hours"] is not None)
    assert math.isclose(t["lost_gpu_hours"], lost, abs_tol=1e-9), (t, lost)
    timed = [g for g in goodputs if g["wall_s"]]
    ettr = sum(g["productive_s"] for g in timed) / sum(g["wall_s"] for g in timed)
    assert math.isclose(t["ettr"], round(ettr, 4), abs_tol=1e-9), (t, ettr)
    assert t["runs"] == len(READABLE) + len(PROBLEMS) and t["problems"] == len(PROBLEMS)
    assert t["attempts"] == sum(s["verdict"]["attempts"] for s in singles.values())
    assert lost > 0 and t["gpu_hours"] > t["lost_gpu_hours"]


def test_the_badput_causes_add_up_to_the_lost_gpu_hours(doc: dict) -> None:
    causes = {b["cause"]: b for b in doc["badput"]}
    assert list(causes) == ["queue_wait", "startup", "overhead", "interrupted", "hang", "failed", "suspect_node"]
    assert causes["queue_wait"]["gpu_hours"] is None and causes["queue_wait"]["seconds"] > 0  # the requeued runs
    held = sum(b["gpu_hours"] for b in doc["badput"] if b["gpu_hours"] is not None)
    assert math.isclose(held, doc["totals"]["lost_gpu_hours"], abs_tol=5e-4 * len(doc["runs"])), (held, doc["totals"])
    for r in doc["runs"]:
        if r["gpus"] is not None and r["lost_gpu_hours"] is not None:
            assert math.isclose(sum(r["badput_gpu_hours"].values()), r["lost_gpu_hours"], abs_tol=1e-3), r
    rows = {r["name"]: r for r in doc["runs"]}
    assert rows["sweep/lr-3e-4/hung"]["badput_s"]["hang"] > 0
    preempted = rows["preempted"]["badput_s"]
    assert preempted["interrupted"] + preempted["suspect_node"] > 0.5  # the second after its checkpoint


def test_nodes_implicated_across_runs(doc: dict) -> None:
    """The golden ``attempts`` run saw XID 79 on its node; the hung run hung on this one."""
    nodes = {n["node"]: n for n in doc["nodes"]}
    xid_node = next(e["host"] for e in read_journal(GOLDEN / "attempts").events if e.get("kind") == "start")
    assert nodes[xid_node]["suspect"] is True and nodes[xid_node]["counts"]["xid"] >= 1
    assert "attempts" in nodes[xid_node]["runs"] and "XID 79" in nodes[xid_node]["details"]
    here = os.uname().nodename.split(".")[0]
    assert nodes[here]["counts"].get("hang") == 1 and "sweep/lr-3e-4/hung" in nodes[here]["runs"]


def test_unreadable_run_directories_are_rows_that_say_so(doc: dict, fleet: Path) -> None:
    rows = {r["name"]: r for r in doc["runs"]}
    for name, state in PROBLEMS.items():
        assert rows[name]["state"] == state and rows[name]["error"], rows[name]
    assert "no events.jsonl" in rows["partial"]["error"]
    text = report(str(fleet))
    assert text.returncode == 0 and "Traceback" not in text.stderr
    lines = text.stdout.splitlines()
    for name in READABLE + list(PROBLEMS):
        assert any(line.startswith(name[:27]) for line in lines), name
    assert re.search(r"^\d+ runs \(.*1 partial", text.stdout, re.M), text.stdout
    assert "could not be read (the rows say why)" in text.stdout and "Badput by cause" in text.stdout


def test_colour_marks_the_state_cell_only(doc: dict) -> None:
    """On a terminal the state is coloured; a run named like a state keeps its name plain."""
    from supervisor.report._fleet import render

    row = next(line for line in render(doc, colour=True).splitlines() if line.startswith("finished "))
    assert row.startswith("finished" + " " * 20) and "\033[32mfinished  \033[0m" in row, row


def test_filters_sorting_globs_and_several_folders(fleet: Path, doc: dict) -> None:
    by_lost = json.loads(report(str(fleet), "--json", "--sort", "lost").stdout)["runs"]
    lost = [r["lost_gpu_hours"] for r in by_lost if r["lost_gpu_hours"] is not None]
    assert lost == sorted(lost, reverse=True) and by_lost[0]["lost_gpu_hours"] == max(lost)
    failed = json.loads(report(str(fleet), "--json", "--state", "failed,corrupt").stdout)["runs"]
    assert {r["state"] for r in failed} == {"failed", "corrupt"}
    assert {r["name"] for r in failed} >= {"failed", "sweep/lr-3e-4/hung", "corrupt"}
    recent = json.loads(report(str(fleet), "--json", "--since", "1h").stdout)["runs"]
    assert {"preempted", "sweep/lr-3e-4/hung"} <= {r["name"] for r in recent}
    assert "finished" not in {r["name"] for r in recent}  # the golden runs are from 2026-11-21
    globbed = json.loads(report(str(fleet / "*"), "--json").stdout)
    assert globbed["totals"]["runs"] == doc["totals"]["runs"]
    two = json.loads(report(str(fleet / "finished"), str(fleet / "sweep"), "--json").stdout)
    assert sorted(r["name"] for r in two["runs"]) == ["finished", "sweep/lr-3e-4/hung"]
    one = report(str(fleet / "finished"))
    assert one.returncode == 0 and one.stdout.startswith("FINISHED")  # one run directory: today's report
    for bad in (("--since", "soon"), ("--sort", "colour")):
        r = report(str(fleet), *bad)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", r.stderr


def test_worker_processes_give_the_same_document(fleet: Path) -> None:
    """--jobs N reads the runs in N processes (the default from 64 runs on): the same rows."""
    one, three = (json.loads(report(str(fleet), "--json", "--jobs", n).stdout) for n in ("1", "3"))
    for d in (one, three):
        d.pop("generated")
    assert one == three and len(one["runs"]) == len(READABLE) + len(PROBLEMS)
    r = report(str(fleet), "--jobs", "0")
    assert r.returncode == 2 and "1 to 256" in r.stderr


def test_planted_files_are_rows_never_a_hang(tmp_path: Path) -> None:
    """A FIFO as gpu.csv (opened, it would block), a journal that is a link to /dev/zero or a FIFO,
    a journal past the size bound: rows, in bounded time."""
    runs = tmp_path / "runs"
    shutil.copytree(GOLDEN / "finished", runs / "fifo-gpu", ignore=shutil.ignore_patterns("expected.*"))
    (runs / "fifo-gpu" / "gpu.csv").unlink()
    os.mkfifo(runs / "fifo-gpu" / "gpu.csv")
    (runs / "zero").mkdir(parents=True)
    (runs / "zero" / "events.jsonl").symlink_to("/dev/zero")
    (runs / "fifo-journal").mkdir()
    os.mkfifo(runs / "fifo-journal" / "events.jsonl")
    (runs / "huge").mkdir()
    with open(runs / "huge" / "events.jsonl", "wb") as f:
        f.truncate(200 << 20)  # sparse
    r = report(str(runs), "--json")
    assert r.returncode == 0, r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)["runs"]}
    assert rows["fifo-gpu"]["state"] == "finished" and rows["fifo-gpu"]["gpus"] is None
    assert rows["zero"]["error"] == rows["fifo-journal"]["error"] == "events.jsonl is not a plain file"
    assert rows["huge"]["state"] == "corrupt" and "past the fleet view's 128 MiB" in rows["huge"]["error"]


def _chromium(url: str, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--log-level=0",
                           "--virtual-time-budget=10000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)


def _plot_blocks(dom: str) -> dict[str, str]:
    """Each plot's rendered DOM, from its div to the next plot's or the next heading."""
    parts = re.split(r'(?=<div class="plot[^"]*" id="plot-)|(?=<h2>)', dom)
    return {m.group(1): p for p in parts if (m := re.match(r'<div class="plot[^"]*" id="plot-(\w+)"', p))}


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_html_draws_its_plots_in_chromium_and_links_each_run(fleet: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    html = tmp_path / "fleet.html"
    r = report(str(fleet), "--html", str(html))
    assert r.returncode == 0, r.stderr
    page = html.read_text(encoding="utf-8")
    links = re.findall(r'<a href="(fleet-runs/[^"]+)">', page)
    assert len(links) == len(READABLE), links
    dom = _chromium(html.as_uri(), tmp_path / "p1")
    assert dom.returncode == 0 and _console(dom.stderr) == [], dom.stderr[-2000:]
    blocks = _plot_blocks(dom.stdout)
    assert set(blocks) == {"where", "ettr"}
    for name, block in blocks.items():
        assert "main-svg" in block, f"plot {name} was not drawn"
    assert len(re.findall(r'class="point"', blocks["where"])) >= 2, "the stacked bars have drawn bars"
    assert len(re.findall(r'class="point"', blocks["ettr"])) >= len(READABLE), "a point per run with an ETTR"
    hung = next(link for link in links if "hung" in link)
    run_dom = _chromium((tmp_path / hung).as_uri(), tmp_path / "p2")  # the single-run report, plotly.js shared
    assert run_dom.returncode == 0 and _console(run_dom.stderr) == [], run_dom.stderr[-2000:]
    assert re.search(r'id="plot-timeline".*?main-svg', run_dom.stdout, re.S), "the run's own report draws"
    assert (tmp_path / "fleet-runs" / "plotly.min.js").stat().st_size > 1_000_000
    shot = tmp_path / "fleet.png"
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'p3'}", "--virtual-time-budget=10000", f"--screenshot={shot}",
                        "--window-size=1400,1700", "--hide-scrollbars", html.as_uri()], capture_output=True, timeout=120)
    assert r.returncode == 0 and shot.stat().st_size > 50_000
    if not SCREENSHOT.exists() or os.environ.get("UPDATE_SCREENSHOT"):  # docs/report.md shows it
        shutil.copyfile(shot, SCREENSHOT)
