"""``supervise report DIR… --html FILE``: the fleet view as one page, drawn from the JSON document.

The page holds the table (each run linked to its own single-run report), a stacked bar of
where the GPU-hours went (productive, then each cause of badput, per UTC day the runs ended)
and the ETTR over time (each run, and each day's Σ productive / Σ wall). plotly.js is inlined
once, so the page opens offline. The single-run reports are written beside it, in
``<FILE stem>-runs/``, sharing one ``plotly.min.js`` there (inlining it into a thousand pages
would be gigabytes). It reads the fleet's document, not ``_fleet``, so neither imports the other.
"""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path
from typing import Any

from supervisor.report._run import ReportError, facts_of

COLOURS = {"productive": "#2da44e", "startup": "#8c959f", "overhead": "#54aeff", "interrupted": "#d4a72c",
           "hang": "#8250df", "failed": "#cf222e", "suspect_node": "#fa4549"}
CSS = """
body{font-family:system-ui,sans-serif;margin:20px;color:#24292f;max-width:1500px}
h1{font-size:22px} h2{font-size:17px;margin-top:24px;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;font-size:12px;width:100%} th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left}
th{background:#f6f8fa} td.num{text-align:right} tr.problem td{color:#cf222e} .plot{margin-top:14px}
.sub{color:#57606a}
"""


def _js(obj: Any) -> str:
    """JSON that is safe inside a <script>: no ``</script>`` from a run's name can close it."""
    return json.dumps(obj, allow_nan=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _gh(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f}" if v >= 1 else f"{v:.4f}"


def _slug(i: int, name: str) -> str:
    return f"{i:05d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', name)[:80]}.html"


def where_figure(doc: dict[str, Any]) -> dict[str, Any]:
    """Stacked bars: per UTC day the runs ended, the GPU-hours productive and lost by cause."""
    labels = {b["cause"]: b["label"] for b in doc["badput"]}
    days: dict[str, dict[str, float]] = {}
    for r in doc["runs"]:
        if r["gpus"] is None or r["end"] is None:
            continue
        d = days.setdefault(time.strftime("%Y-%m-%d", time.gmtime(r["end"])), {})
        d["productive"] = d.get("productive", 0.0) + (r["productive_gpu_hours"] or 0.0)
        for c, v in r["badput_gpu_hours"].items():
            d[c] = d.get(c, 0.0) + v
    xs = sorted(days)
    traces = [{"type": "bar", "name": "productive" if c == "productive" else labels.get(c, c), "x": xs,
               "y": [round(days[x].get(c, 0.0), 4) for x in xs], "marker": {"color": colour}}
              for c, colour in COLOURS.items()]
    return {"data": traces, "layout": {"barmode": "stack", "title": {"text": "Where the GPU-hours went (by the day runs ended)"},
                                       "yaxis": {"title": {"text": "GPU-hours"}}, "xaxis": {"type": "category"},
                                       "height": 380, "margin": {"t": 50, "l": 60, "r": 20, "b": 60}}}


def ettr_figure(doc: dict[str, Any]) -> dict[str, Any]:
    runs = [r for r in doc["runs"] if r["ettr"] is not None and r["end"] is not None]
    iso = [time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(r["end"])) for r in runs]
    data = [{"type": "scatter", "mode": "markers", "name": "run", "x": iso, "y": [r["ettr"] for r in runs],
             "text": [r["name"] for r in runs], "marker": {"size": 7, "color": "#0969da"}}]
    by_day = [d for d in doc["ettr_by_day"] if d["ettr"] is not None]
    data.append({"type": "scatter", "mode": "lines+markers", "name": "day (Σ productive / Σ wall)",
                 "x": [d["day"] + "T12:00:00" for d in by_day], "y": [d["ettr"] for d in by_day],
                 "line": {"color": "#2da44e"}})
    return {"data": data, "layout": {"title": {"text": "ETTR over time (by when each run ended)"},
                                     "yaxis": {"title": {"text": "ETTR"}, "range": [0, 1.05], "tickformat": ".0%"},
                                     "xaxis": {"type": "date"}, "height": 360,
                                     "margin": {"t": 50, "l": 60, "r": 20, "b": 50}}}


def _table(doc: dict[str, Any], links: dict[str, str]) -> str:
    head = ["run", "job", "state", "attempts", "wall", "GPU-hours", "ETTR", "lost GPU-hours", "top cause",
            "last checkpoint", "what to fix"]
    out = ["<table id=runs><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    e = html.escape
    for r in doc["runs"]:
        problem = r["error"] is not None and r["state"] in ("corrupt", "unreadable", "partial", "missing")
        name = e(r["name"])
        if r["path"] in links:
            name = f'<a href="{e(links[r["path"]])}">{name}</a>'
        cells = [name, e(",".join(r["job_ids"]) or "-"), e(r["state"]), str(r["attempts"]) if not problem else "-",
                 f"{r['wall_s']:.0f} s" if r["wall_s"] is not None else "-", _gh(r["gpu_hours"]) if not problem else "-",
                 f"{100 * r['ettr']:.1f} %" if r["ettr"] is not None else "-",
                 _gh(r["lost_gpu_hours"]) if not problem else "-", e((r["top_cause"] or "-").replace("_", " ")),
                 e(r["last_checkpoint"] or "-"), e(r["error"] if problem else (r["fix"] or ""))]
        num = {3, 4, 5, 6, 7}
        out.append(f"<tr{' class=problem' if problem else ''}>"
                   + "".join(f"<td{' class=num' if i in num else ''}>{c}</td>" for i, c in enumerate(cells)) + "</tr>")
    return "".join(out) + "</table>"


def page(doc: dict[str, Any], plotly_js: str, links: dict[str, str]) -> str:
    t = doc["totals"]
    e = html.escape
    ettr = f"{100 * t['ettr']:.1f} %" if t["ettr"] is not None else "?"
    summary = (f"<p>{t['runs']} runs ({e(', '.join(f'{n} {s}' for s, n in t['by_state'].items()))}), {t['attempts']} "
               f"attempts, {t['requeues']} requeues. GPU-hours held <b>{_gh(t['gpu_hours'])}</b>, productive "
               f"{_gh(t['productive_gpu_hours'])}, lost <b>{_gh(t['lost_gpu_hours'])}</b>; ETTR <b>{ettr}</b> "
               f"(Σ productive / Σ wall); queue wait {t['queue_wait_s']:.0f} s.</p>")
    badput = "<table id=badput><tr><th>cause</th><th>GPU-hours</th><th>hours</th><th>runs</th></tr>" + "".join(
        f"<tr><td>{e(b['label'])}</td><td class=num>{'-' if b['gpu_hours'] is None else _gh(b['gpu_hours'])}</td>"
        f"<td class=num>{b['seconds'] / 3600:.3f}</td><td class=num>{b['runs']}</td></tr>" for b in doc["badput"]) + "</table>"
    nodes = ("<p class=sub>No node was implicated in a failure.</p>" if not doc["nodes"] else
             "<table id=nodes><tr><th>node</th><th>suspect</th><th>failures</th><th>what</th><th>runs</th><th>jobs</th></tr>"
             + "".join(f"<tr><td>{e(n['node'])}</td><td>{'yes' if n['suspect'] else ''}</td><td class=num>{n['failures']}</td>"
                       f"<td>{e('; '.join(n['details']))}</td><td>{e(', '.join(n['runs']))}</td>"
                       f"<td>{e(', '.join(x for x in n['jobs'] if x))}</td></tr>" for n in doc["nodes"]) + "</table>")
    figures = {"where": where_figure(doc), "ettr": ettr_figure(doc)}
    divs = "".join(f'<div class=plot id="plot-{name}"></div>' for name in figures)
    calls = "".join(f"Plotly.newPlot('plot-{name}',{_js(fig['data'])},{_js(fig['layout'])},"
                    "{responsive:true,displaylogo:false});" for name, fig in figures.items())
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>supervise report: "
            f"{t['runs']} runs</title><style>{CSS}</style><script>{plotly_js}</script></head><body>"
            f"<h1>{t['runs']} runs</h1>{summary}{divs}<h2>Badput by cause</h2>{badput}"
            f"<h2>Nodes implicated in failures</h2>{nodes}<h2>Runs</h2>{_table(doc, links)}"
            f"<script>{calls}</script></body></html>\n")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_run_pages(doc: dict[str, Any], folder: Path, plotly_js: str) -> dict[str, str]:
    """Each readable run's single-run report into ``folder``; its path → the page's link."""
    from supervisor.report._html import page as run_page

    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / "plotly.min.js", plotly_js)
    links: dict[str, str] = {}
    for i, r in enumerate(doc["runs"]):
        if r["state"] in ("corrupt", "unreadable", "partial", "missing"):
            continue
        try:
            f, data = facts_of(Path(r["path"]))
        except (ReportError, OSError):
            continue
        text = run_page(f, data, "")
        # the single-run page inlines plotly.js in its head's one empty <script>; here it is the shared file
        text = text.replace("<script></script>", '<script src="plotly.min.js"></script>', 1)
        name = _slug(i, r["name"])
        _write(folder / name, text)
        links[r["path"]] = f"{folder.name}/{name}"
    return links


def write_fleet_html(doc: dict[str, Any], path: Path) -> None:
    """The page and its single-run reports; raises ImportError without the ``report`` extra."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    links = write_run_pages(doc, path.with_name(path.stem + "-runs"), js)
    _write(path, page(doc, js, links))
