"""``--html FILE``: one self-contained page, the same facts as the text plus time series.

plotly.js is inlined (from the ``plotly`` package, the ``report`` extra), so the file opens
offline on a login node or a laptop and nothing is fetched at view time. The figures are
built as plain JSON (no plotly Python figure objects): that keeps a week-long, eight-GPU
run quick, since the series are already downsampled to a bounded number of points.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any, Sequence

from supervisor.report._facts import Facts, throttled
from supervisor.report._goodput import is_checkpoint, step_of
from supervisor.report._load import RunData, Series
from supervisor.report._text import dur, mem, node_samples, roles, sanitized, summary, utc

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
STEP_COLOUR = {"checkpoint": "rgba(44,160,44,0.25)", "flush": "rgba(31,119,180,0.25)",
               "stop-child": "rgba(214,39,40,0.25)", "final-flush": "rgba(148,103,189,0.25)"}
STATUS_COLOUR = {"finished": "#1a7f37", "local-only": "#cf222e", "failed": "#cf222e", "cancelled": "#9a6700", "stopped": "#cf222e",
                 "requeued": "#9a6700", "running": "#0969da", "killed": "#cf222e"}


def iso(t: float) -> str:
    """UTC time as plotly reads it (no zone: the axis is labelled UTC)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}"


def _xy(times: list[float], s: Series, every: float = 10.0, width: float = 1.0,
        breaks: Sequence[float] = ()) -> tuple[list[str], list[float | None]]:
    """The filled buckets, joined by lines; a gap (None) where an attempt starts between two
    points (``breaks``: plotly would draw a line across the time between the attempts), and
    where no sample came for longer than 2.5 sampling periods. Samples sparser than the
    buckets (a short run at 10 s sampling) leave empty buckets between every two values:
    those are not gaps, or no segment would be drawn at all."""
    vals = s.values()
    gap = max(1, int(2.5 * every / width))  # buckets
    xs: list[str] = []
    ys: list[float | None] = []
    last = None
    for i, v in enumerate(vals):
        if v is None:
            continue
        if last is not None and (i - last > gap or any(times[last] < b <= times[i] for b in breaks)):
            xs.append(iso(times[(last + i) // 2]))
            ys.append(None)
        xs.append(iso(times[i]))
        ys.append(v)
        last = i
    return xs, ys


def attempt_breaks(f: Facts) -> list[float]:
    """Where the lines break: the start of every attempt after the first."""
    return sorted(a.start for a in f.attempts[1:] if a.start is not None)


def sampling_period(data: RunData) -> float:
    return max((float(e.get("every") or 0) for e in data.journal.events if e.get("kind") == "gpu-start"), default=0.0) \
        or 10.0


def _markers(f: Facts, data: RunData) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Shapes (attempt spans, stop steps, signals) and hoverable marker traces for them."""
    ev = data.journal.events
    shapes: list[dict[str, Any]] = []
    traces: list[dict[str, Any]] = []
    for k, a in enumerate(f.attempts):
        if a.start is None:
            continue
        end = a.end or max((e["t"] for e in ev if e.get("attempt") == a.number), default=a.start)
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": iso(a.start), "x1": iso(end), "y0": 0, "y1": 1,
                       "fillcolor": "rgba(120,120,120,0.06)" if k % 2 else "rgba(120,120,120,0.0)",
                       "line": {"width": 1, "color": "rgba(90,90,90,0.5)", "dash": "dot"}, "layer": "below"})
    step_x, step_y, step_text = [], [], []
    for s in f.stops:
        for e in (e for e in ev if e.get("kind") == "stop-step" and e.get("attempt") == s.attempt and e["t"] >= s.t):
            secs = float(e.get("seconds") or 0.0)
            colour = STEP_COLOUR.get(str(e.get("step")))
            if colour and secs > 0:
                shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": iso(e["t"] - secs), "x1": iso(e["t"]),
                               "y0": 0, "y1": 1, "fillcolor": colour, "line": {"width": 0}, "layer": "below"})
            step_x.append(iso(e["t"]))
            step_y.append(0)
            step_text.append(f"attempt {s.attempt} stop ({s.reason}): {e.get('step')} {secs:.1f}s "
                             f"{e.get('outcome') or e.get('skipped') or ''}")
    sig_x, sig_text = [], []
    for e in ev:
        if e.get("kind") in ("signal", "warning", "stop", "gpu-xid", "gpu-lost"):
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": iso(e["t"]), "x1": iso(e["t"]), "y0": 0, "y1": 1,
                           "line": {"color": "#cf222e", "width": 1.5, "dash": "dash"}})
            sig_x.append(iso(e["t"]))
            label = {"signal": e.get("signal"), "gpu-xid": f"GPU {e.get('device')} XID {e.get('xid')}",
                     "gpu-lost": f"GPU {e.get('device')} lost"}.get(str(e.get("kind")), e.get("kind"))
            sig_text.append(f"attempt {e.get('attempt')}: {label} {e.get('action') or e.get('reason') or ''}".strip())
    ck_x, ck_text = [], []
    seen = set()
    for e in ev:
        key = (e.get("pair"), e.get("checkpoint"))
        if is_checkpoint(e) and key not in seen:
            seen.add(key)
            ck_x.append(iso(e["t"]))
            ck_text.append(f"{e.get('checkpoint')} durable ({e.get('pair')}), lag {e.get('lag_s')}s")
    traces.append({"type": "scatter", "mode": "markers", "name": "checkpoint published", "x": ck_x, "y": [100] * len(ck_x),
                   "text": ck_text, "hoverinfo": "text+x", "marker": {"symbol": "triangle-down", "size": 9, "color": "#1a7f37"},
                   "xaxis": "x", "yaxis": "y"})
    traces.append({"type": "scatter", "mode": "markers", "name": "signal, warning, stop, XID", "x": sig_x, "y": [95] * len(sig_x),
                   "text": sig_text, "hoverinfo": "text+x", "marker": {"symbol": "x", "size": 9, "color": "#cf222e"},
                   "xaxis": "x", "yaxis": "y"})
    traces.append({"type": "scatter", "mode": "markers", "name": "stop step", "x": step_x, "y": step_y, "text": step_text,
                   "hoverinfo": "text+x", "marker": {"symbol": "square", "size": 7, "color": "#9a6700"},
                   "xaxis": "x", "yaxis": "y"})
    for a in f.attempts:
        if a.start is not None:
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": iso(a.start), "x1": iso(a.start),
                           "y0": 0, "y1": 1, "line": {"color": "#57606a", "width": 1}})
    return shapes, traces


def gpu_figure(f: Facts, data: RunData) -> dict[str, Any]:
    times = data.grid.times()
    breaks = attempt_breaks(f)
    traces: list[dict[str, Any]] = []
    every = sampling_period(data)
    for k, g in enumerate(data.gpus):
        colour = PALETTE[k % len(PALETTE)]
        for series, axis, what in ((g.s_util, "y", "util %"), (g.s_mem, "y2", "memory % (peak)"), (g.s_power, "y3", "power W")):
            x, y = _xy(times, series, every, data.grid.width, breaks)
            traces.append({"type": "scattergl" if len(x) > 2000 else "scatter", "mode": "lines", "name": f"GPU {g.index}",
                           "legendgroup": f"gpu{g.index}", "showlegend": axis == "y", "x": x, "y": y,
                           "line": {"color": colour, "width": 1.3}, "connectgaps": False, "xaxis": "x", "yaxis": axis,
                           "hovertemplate": f"GPU {g.index} {what}: %{{y}}<extra></extra>"})
    shapes, marks = _markers(f, data)
    annotations = [{"xref": "x", "yref": "paper", "x": iso(a.start), "y": 1.0, "yanchor": "bottom", "showarrow": False,
                    "text": f"attempt {a.number}", "font": {"size": 11, "color": "#57606a"}, "xanchor": "left"}
                   for a in f.attempts if a.start is not None]
    layout = {
        "title": {"text": "GPUs over time (UTC): utilisation, memory, power", "x": 0},
        "height": 720, "margin": {"l": 60, "r": 20, "t": 70, "b": 40}, "hovermode": "x unified",
        "legend": {"orientation": "h", "y": -0.08},
        "xaxis": {"type": "date", "anchor": "y3", "showgrid": True},
        "yaxis": {"title": {"text": "util %"}, "range": [-3, 105], "domain": [0.68, 1.0]},
        "yaxis2": {"title": {"text": "memory %"}, "range": [0, 105], "domain": [0.35, 0.64]},
        "yaxis3": {"title": {"text": "power W"}, "rangemode": "tozero", "domain": [0.0, 0.31]},
        "shapes": shapes, "annotations": annotations, "plot_bgcolor": "white",
    }
    return {"data": traces + marks, "layout": layout}


def sync_figure(f: Facts, data: RunData) -> dict[str, Any]:
    pairs: dict[str, tuple[list[str], list[float], list[str]]] = {}
    for e in data.journal.events:
        if is_checkpoint(e) and isinstance(e.get("lag_s"), (int, float)):
            x, y, text = pairs.setdefault(str(e.get("pair")), ([], [], []))
            x.append(iso(e["t"]))
            y.append(e["lag_s"])
            text.append(f"{e.get('checkpoint')} ({e.get('trigger')}), attempt {e.get('attempt')}")
    traces = [{"type": "scatter", "mode": "lines+markers", "name": f"lag, {name}", "x": x, "y": y, "text": t,
               "hovertemplate": "%{text}: %{y}s<extra></extra>", "line": {"color": PALETTE[k % len(PALETTE)]}}
              for k, (name, (x, y, t)) in enumerate(sorted(pairs.items()))]
    failed = [e for e in data.journal.events if e.get("kind") == "sync-failed"]
    if failed:
        traces.append({"type": "scatter", "mode": "markers", "name": "sync failed", "x": [iso(e["t"]) for e in failed],
                       "y": [0] * len(failed), "text": [str(e.get("error")) for e in failed],
                       "marker": {"symbol": "x", "color": "#cf222e", "size": 9}})
    return {"data": traces, "layout": {
        "title": {"text": "Checkpoint sync lag: written locally → durable on persistent storage", "x": 0},
        "height": 300, "margin": {"l": 60, "r": 20, "t": 50, "b": 40}, "xaxis": {"type": "date"},
        "yaxis": {"title": {"text": "seconds"}, "rangemode": "tozero"}, "plot_bgcolor": "white", "showlegend": True}}


def host_figure(f: Facts, data: RunData) -> dict[str, Any] | None:
    h = data.host
    if h is None:
        return None
    times = data.grid.times()
    breaks = attempt_breaks(f)
    every = sampling_period(data)
    cx, cy = _xy(times, h.s_cpu, every, data.grid.width, breaks)
    rx, ry = _xy(times, h.s_rss, every, data.grid.width, breaks)
    return {"data": [
        {"type": "scatter", "mode": "lines", "name": "CPU % of a core", "x": cx, "y": cy, "yaxis": "y", "connectgaps": False},
        {"type": "scatter", "mode": "lines", "name": "RSS MiB (peak)", "x": rx, "y": ry, "yaxis": "y2", "connectgaps": False},
    ], "layout": {
        "title": {"text": "Training processes: CPU and memory", "x": 0}, "height": 320,
        "margin": {"l": 60, "r": 60, "t": 50, "b": 40}, "xaxis": {"type": "date"}, "plot_bgcolor": "white",
        # below the plot: at plotly's default place (right, x = 1.02) it covered the RSS axis's tick labels
        "legend": {"orientation": "h", "y": -0.25, "yanchor": "top"},
        "yaxis": {"title": {"text": "CPU %"}, "rangemode": "tozero"},
        "yaxis2": {"title": {"text": "RSS MiB"}, "overlaying": "y", "side": "right", "rangemode": "tozero"}}}


def timeline_figure(f: Facts, data: RunData) -> dict[str, Any] | None:
    """The job at a glance: attempts (productive part darker), queue gaps, checkpoints
    (durable ▲ vs only on local disk ✖), stops."""
    g = f.goodput
    if g is None or not f.attempts:
        return None
    traces: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    ev = data.journal.events
    by_n = {a.attempt: a for a in g.attempts}
    prev_end = None
    for a in f.attempts:
        if a.start is None:
            continue
        end = a.end or max((e["t"] for e in ev if e.get("attempt") == a.number), default=a.start)
        gp = by_n.get(a.number)
        shapes.append({"type": "rect", "x0": iso(a.start), "x1": iso(end), "y0": 0.6, "y1": 1.4,
                       "fillcolor": "rgba(120,120,120,0.25)", "line": {"width": 0}})
        if gp is not None and gp.first_step_s is not None and gp.productive_s:
            p0 = a.start + gp.first_step_s
            shapes.append({"type": "rect", "x0": iso(p0), "x1": iso(p0 + gp.productive_s), "y0": 0.6, "y1": 1.4,
                           "fillcolor": "rgba(26,127,55,0.6)", "line": {"width": 0}})
            if gp.lost_work_s:
                shapes.append({"type": "rect", "x0": iso(p0 + gp.productive_s), "x1": iso(p0 + gp.productive_s + gp.lost_work_s),
                               "y0": 0.6, "y1": 1.4, "fillcolor": "rgba(207,34,46,0.6)", "line": {"width": 0}})
        if prev_end is not None and a.start > prev_end:
            shapes.append({"type": "rect", "x0": iso(prev_end), "x1": iso(a.start), "y0": 0.8, "y1": 1.2,
                           "fillcolor": "rgba(154,103,0,0.35)", "line": {"width": 0}})
        prev_end = end
    x, text = [], []
    for a in f.attempts:  # one hoverable point per attempt, so the bars read out
        gp = by_n.get(a.number)
        if a.start is None or gp is None:
            continue
        x.append(iso(a.start))
        text.append(f"attempt {a.number}: {a.reason or 'running?'}; wall {dur(gp.wall_s)}, productive {dur(gp.productive_s)}, "
                    f"lost {dur(gp.lost_work_s)}, queued before {dur(gp.queue_wait_s) if gp.queue_wait_s is not None else '-'}")
    traces.append({"type": "scatter", "mode": "markers", "name": "attempt (grey), productive (green), lost (red), queued (amber)",
                   "x": x, "y": [1.0] * len(x), "text": text, "hoverinfo": "text", "marker": {"symbol": "line-ns-open",
                                                                                             "size": 22, "color": "#57606a"}})
    seen: set[tuple[Any, Any]] = set()
    cx, ctext = [], []
    for e in ev:
        key = (e.get("pair"), e.get("checkpoint"))
        if is_checkpoint(e) and key not in seen:
            seen.add(key)
            cx.append(iso(e["t"]))
            step = step_of(e.get("checkpoint"))
            ctext.append(f"{e.get('checkpoint')} durable" + (f" (step {step})" if step is not None else ""))
    traces.append({"type": "scatter", "mode": "markers", "name": "checkpoint durable", "x": cx, "y": [1.6] * len(cx),
                   "text": ctext, "hoverinfo": "text+x", "marker": {"symbol": "triangle-up", "size": 9, "color": "#1a7f37"}})
    local = [e for e in ev if e.get("kind") == "end" and e.get("not_durable")] + [e for e in ev if e.get("kind") == "torn"]
    traces.append({"type": "scatter", "mode": "markers", "name": "only on local disk / torn", "x": [iso(e["t"]) for e in local],
                   "y": [1.6] * len(local), "text": ["; ".join(map(str, e.get("not_durable") or [e.get("checkpoint")])) for e in local],
                   "hoverinfo": "text+x", "marker": {"symbol": "x", "size": 10, "color": "#cf222e"}})
    stops = [s for s in f.stops if s.reason not in ("child-exit",)]
    traces.append({"type": "scatter", "mode": "markers", "name": "stop", "x": [iso(s.t) for s in stops], "y": [0.4] * len(stops),
                   "text": [f"attempt {s.attempt}: {s.reason}" for s in stops], "hoverinfo": "text+x",
                   "marker": {"symbol": "diamond", "size": 9, "color": "#cf222e"}})
    return {"data": traces, "layout": {
        "title": {"text": "The job's timeline: attempts, productive time, lost work, queue gaps, checkpoints", "x": 0},
        "height": 260, "margin": {"l": 60, "r": 20, "t": 50, "b": 40}, "xaxis": {"type": "date"},
        "yaxis": {"range": [0, 2], "showticklabels": False, "fixedrange": True}, "shapes": shapes,
        "plot_bgcolor": "white", "showlegend": True, "legend": {"orientation": "h", "y": -0.25}}}


def _table(head: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v: float | None, unit: str = "", nd: int = 0) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}{unit}"


def body(f: Facts) -> str:
    e = html.escape
    v = f.verdict
    parts = [f'<h1 style="color:{STATUS_COLOUR.get(v.status, "#24292f")}">{e(v.local_only) + "<br>" if v.local_only else ""}{e(v.headline)}</h1>',
             f"<p class=sub>run dir <code>{e(f.run_dir)}</code>" + (f" · job {e(str(f.job['job_id']))}" if f.job.get("job_id") else "")
             + (f" · {e(str(f.job['scheduler']))}" if f.job.get("scheduler") else "") + "</p>"]
    parts.append("<pre class=summary>" + e("\n".join(summary(f))) + "</pre>")
    # as the text report: a Notes section always, "nothing to change" when there is none
    items = "".join(f'<li class="{e(n.level)}">{e(n.text)}</li>' for n in f.notes) or '<li class="none">nothing to change</li>'
    parts.append(f"<h2>Notes</h2><ul class=notes>{items}</ul>")
    parts.append("<h2>Attempts</h2>" + _table(
        ["#", "came by", "start (UTC)", "ran", "host", "ended", "detail", "exit", "requeued", "restore"],
        [[a.number, a.came_by or "", utc(a.start), dur(a.seconds), a.host, a.reason or "running?", a.detail,
          f"{a.exit_status} ({a.exit_note})" if a.exit_note else a.exit_status,
          {True: "yes", False: "no", None: ""}[a.requeued], a.restore or ""] for a in f.attempts]))
    g = f.goodput
    if g is not None and g.attempts:
        rows = [[a.attempt, dur(a.queue_wait_s) if a.queue_wait_s is not None else "", dur(a.wall_s),
                 f"{dur(a.first_step_s)} ({a.first_step_by or 'not seen'})", dur(a.training_s), dur(a.productive_s),
                 dur(a.lost_work_s) + (f" ({'' if a.lost_steps_exact else '≈'}{a.lost_steps} steps)" if a.lost_steps else ""),
                 "" if a.ettr is None else f"{100 * a.ettr:.0f} %",
                 "" if a.lost_gpu_hours is None else f"{a.lost_gpu_hours:.3f}"] for a in g.attempts]
        rows.append(["job", dur(g.queue_wait_s), dur(g.wall_s), "", "", dur(g.productive_s), dur(g.lost_work_s),
                     "" if g.ettr is None else f"{100 * g.ettr:.1f} %",
                     "" if g.lost_gpu_hours is None else f"{g.lost_gpu_hours:.3f}"])
        gpus = f"{g.gpus} GPUs ({g.gpus_from})" if g.gpus else "GPU count unknown"
        parts.append(f"<h2>Goodput</h2><p class=sub>ETTR = productive training time / wall time; {e(gpus)}</p>" + _table(
            ["#", "queued before", "wall", "first step (evidence)", "training", "productive", "work lost", "ETTR",
             "GPU-hours not productive"], rows))
    if f.stops:
        rows = []
        for s in f.stops:
            steps = ", ".join(f"{st.step} {dur(st.seconds)} {st.outcome or ''}".strip() for st in s.steps)
            rows.append([s.attempt, utc(s.t), s.reason, dur(s.time_left_s) if s.time_left_s is not None else "no known end",
                         steps, dur(s.seconds), dur(s.margin_s) if s.margin_s is not None else "n/a"])
        parts.append("<h2>Stop sequences</h2>" + _table(
            ["attempt", "start (UTC)", "reason", "time left", "steps", "total", "margin before the hard kill"], rows))
    c = f.checkpoints
    restores = "".join(f"<li>{e(r.text)}</li>" for r in c.restores)
    last = f"{c.last.name} ({c.last.pair}) at {utc(c.last.t)} UTC, attempt {c.last.attempt}" if c.last else "none"
    local = "unknown until the attempt ends" if f.verdict.status in ("running", "killed") else ("; ".join(c.not_durable) or "nothing")
    parts.append("<h2>Checkpoints</h2>" + _table(["published (versions)", "lag p50", "lag p95", "interval (median)", "last durable",
                                                   "only on local disk", "failed syncs"],
                                                  [[f"{c.published} ({c.versions})", dur(c.lag_p50_s) if c.lag_p50_s is not None else "n/a",
                                                    dur(c.lag_p95_s) if c.lag_p95_s is not None else "n/a",
                                                    dur(c.interval_s) if c.interval_s else "n/a", last, local, c.sync_failures]])
                 + (f"<ul>{restores}</ul>" if restores else ""))
    if f.gpus:
        rows = []
        for gpu in f.gpus:
            slow = throttled(gpu)
            thr = ", ".join(f"{k} {100 * t / gpu.sampled_s:.0f}%" for k, t in slow.items()) if slow and gpu.sampled_s else "none"
            errs = ", ".join(filter(None, ["XID " + ",".join(map(str, gpu.xids)) if gpu.xids else "",
                                           f"ECC unc. {gpu.ecc_uncorrected}" if gpu.ecc_uncorrected else "",
                                           "lost" if gpu.lost else ""])) or "none"
            rows.append([gpu.index, gpu.name or "", _fmt(gpu.util_mean_pct, " %"), _fmt(gpu.util_p95_pct, " %"),
                         f"{_fmt(gpu.mem_peak_mib and gpu.mem_peak_mib / 1024, '', 1)} / {_fmt(gpu.mem_total_mib and gpu.mem_total_mib / 1024, ' GiB', 0)}"
                         f" ({_fmt(gpu.mem_peak_pct, ' %')})", _fmt(gpu.power_mean_w, " W"), _fmt(gpu.energy_kwh, " kWh", 3), thr, errs])
        parts.append("<h2>GPUs</h2>" + _table(["GPU", "model", "util mean", "util p95", "memory peak", "power mean",
                                               "energy", "throttled", "errors"], rows))
    else:
        parts.append("<h2>GPUs</h2><p>No GPU data" + (": " + e("; ".join(f.gpu_none)) if f.gpu_none else "") + ".</p>")
    if f.nodes:
        parts.append("<h2>Nodes</h2>" + _table(["node", "attempts (node rank)", "GPU samples", "host samples", "what happened"],
                                                [[r.node, roles(r), *node_samples(r), "; ".join(r.problems) or "ok"]
                                                 for r in f.nodes]))
    if f.host:
        h = f.host
        parts.append("<h2>Training processes</h2>" + _table(
            ["CPU mean (% of a core)", "CPU max", "RSS peak", "processes", "node memory lowest available"],
            [[_fmt(h.cpu_mean_pct, " %"), _fmt(h.cpu_max_pct, " %"),
              mem(h.rss_peak_mib) + (f" of {mem(h.mem_requested_mib)} asked for" if h.mem_requested_mib else ""),
              h.nprocs_max, f"{mem(h.node_mem_min_available_mib)} of {mem(h.node_mem_total_mib)}"]]))
    return "\n".join(parts)


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#24292f;padding:0 16px}
h1{font-size:24px;margin:0 0 4px} h2{font-size:17px;margin:22px 0 6px;border-bottom:1px solid #d0d7de}
.sub{color:#57606a;margin:0 0 10px} code{font-size:90%}
table{border-collapse:collapse;font-size:13px;width:100%} th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left}
th{background:#f6f8fa} ul.notes{padding-left:20px} ul.notes li{margin:4px 0}
pre.summary{margin:6px 0;font-size:14px} li.bad{color:#cf222e} li.warn{color:#9a6700} li.info{color:#24292f} .plot{margin-top:14px}
"""


def page(f: Facts, data: RunData, plotly_js: str) -> str:
    f = sanitized(f)
    figures = {"timeline": timeline_figure(f, data), "gpu": gpu_figure(f, data) if data.gpus else None, "sync": sync_figure(f, data), "host": host_figure(f, data)}
    divs, calls = [], []
    for name, fig in figures.items():
        if fig is None:
            continue
        divs.append(f'<div class=plot id="plot-{name}"></div>')
        calls.append(f"Plotly.newPlot('plot-{name}',{json.dumps(fig['data'], allow_nan=False)},"
                     f"{json.dumps(fig['layout'], allow_nan=False)},{{responsive:true,displaylogo:false}});")
    if not data.gpus:
        divs.insert(0, "<p class=sub>No GPU samples in this run directory: no GPU plots.</p>")
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<title>supervise report: {html.escape(f.verdict.headline)}</title><style>{CSS}</style>"
            f"<script>{plotly_js}</script></head><body>{body(f)}<h2>Time series</h2>{''.join(divs)}"
            f"<script>{''.join(calls)}</script></body></html>\n")


def write_html(f: Facts, data: RunData, path: Path) -> None:
    """Write the page; raises ImportError when the ``report`` extra (plotly) is missing."""
    from plotly.offline import get_plotlyjs

    text = page(f, data, get_plotlyjs())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
