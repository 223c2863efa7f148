"""``kiln report``'s page: one static HTML file, no network (inline CSS, JS, SVG).

Tables are rendered here; the timeline is drawn in the browser from the data
embedded in the page (one row per lane, one bar per action, the critical path
highlighted), so it scales to the window and shows details on hover.
"""

from __future__ import annotations

import datetime
import html
import json
from pathlib import Path
from typing import Any

from kiln.observe.report_data import ActionRun, BuildReport, log_tail

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;
background:#f6f7f9}
main{max-width:1400px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d6d9e0}
h3{font-size:15px;margin:16px 0 4px}
details.more{display:inline}details.more summary{cursor:pointer;color:#364fc7}
tr.shown td{background:#edf2ff}
.status{display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;font-weight:600}
.ok{background:#2b8a3e}.bad{background:#c92a2a}.unknown{background:#868e96}
.counts{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.count{background:#fff;border:1px solid #d6d9e0;border-radius:6px;padding:6px 14px;min-width:90px}
.count b{display:block;font-size:20px}
table{border-collapse:collapse;background:#fff;width:100%;margin:6px 0}
th,td{border:1px solid #e1e4ea;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}
pre{background:#1d2330;color:#e9ecef;padding:8px 10px;border-radius:4px;overflow-x:auto;
white-space:pre-wrap;max-height:420px}
.failure{background:#fff;border-left:4px solid #c92a2a;padding:4px 12px 10px;margin:10px 0}
#timeline{background:#fff;border:1px solid #d6d9e0;border-radius:6px;overflow-x:auto}
#timeline svg{display:block}.lane-label{font-size:12px;fill:#495057}
.slice{fill:#4c6ef5;stroke:#fff;stroke-width:.5}.slice.failed{fill:#e03131}
.slice.cached{fill:#adb5bd}.slice.running{fill:#fab005}
.slice.critical{fill:#f76707;stroke:#862e00;stroke-width:1}
.slice.failed.critical{fill:#e03131;stroke:#862e00}
.slice-label{font-size:11px;fill:#fff;pointer-events:none}.axis{stroke:#ced4da}.tick{font-size:11px;fill:#868e96}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;
vertical-align:middle;border-radius:2px}
#tip{position:fixed;pointer-events:none;background:#1d2330;color:#fff;padding:6px 8px;
border-radius:4px;font-size:12px;max-width:480px;display:none;white-space:pre-wrap}
.passed{color:#2b8a3e;font-weight:600}.failedv{color:#c92a2a;font-weight:600}
"""

_JS = r"""
(function () {
  var data = JSON.parse(document.getElementById('kiln-data').textContent);
  var box = document.getElementById('timeline');
  var NS = 'http://www.w3.org/2000/svg';
  var lanes = data.lanes, runs = data.runs;
  var gutter = 110, row = 24, top = 24;
  var width = Math.max(box.clientWidth || 1000, 600);
  var wall = Math.max(data.wall || 0, 1e-3);
  var scale = (width - gutter - 12) / wall;
  var svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('width', width);
  svg.setAttribute('height', top + row * lanes.length + 8);
  svg.setAttribute('role', 'img');
  function el(name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  }
  var step = Math.pow(10, Math.floor(Math.log10(wall / 5)));
  if (wall / step > 10) step *= 2;
  if (wall / step > 10) step *= 2.5;
  for (var t = 0; t <= wall + 1e-9; t += step) {
    var x = gutter + t * scale;
    el('line', {x1: x, x2: x, y1: top - 6, y2: top + row * lanes.length, 'class': 'axis'});
    el('text', {x: x + 2, y: top - 10, 'class': 'tick'}, (+t.toFixed(3)) + ' s');
  }
  var laneIndex = {};
  lanes.forEach(function (lane, i) {
    laneIndex[lane] = i;
    el('text', {x: 6, y: top + row * i + 16, 'class': 'lane-label'}, lane);
  });
  var tip = document.getElementById('tip');
  runs.forEach(function (r) {
    var rect = el('rect', {
      x: gutter + r.start * scale, y: top + row * laneIndex[r.lane] + 3,
      width: Math.max(3, r.duration * scale), height: row - 6, rx: 2,
      'class': 'slice ' + r.status + (r.critical ? ' critical' : ''),
      'data-action': r.id
    });
    var text = r.desc + '\n' + r.duration.toFixed(3) + ' s, ' + r.status +
      (r.critical ? ', on the critical path' : '') + (r.reason ? '\nwhy: ' + r.reason : '');
    var title = document.createElementNS(NS, 'title');
    title.textContent = text;
    rect.appendChild(title);
    rect.addEventListener('mousemove', function (e) {
      tip.textContent = text; tip.style.display = 'block';
      tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px';
    });
    rect.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    var room = Math.floor((r.duration * scale - 8) / 7);
    if (room >= 6) {
      var label = r.desc.length > room ? r.desc.slice(0, room - 1) + '\u2026' : r.desc;
      el('text', {x: gutter + r.start * scale + 4, y: top + row * laneIndex[r.lane] + 16,
                  'class': 'slice-label'}, label);
    }
  });
  box.appendChild(svg);
  box.setAttribute('data-rendered', String(runs.length));
})();
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f} s" if value < 100 else f"{value:.1f} s"


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


# Inside a <script> element the HTML parser looks for "</script", "<!--" and
# "<script" (which changes how a later "</script" is read), whatever JSON means.
_SCRIPT_UNSAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def embedded_json(data: Any) -> str:
    """``data`` as JSON text that can sit inside a ``<script>`` element: no string in
    it can end the element or open a comment, since ``<``, ``>`` and ``&`` are
    written as JSON escapes (``\\u003c``), which ``JSON.parse`` reads back as they were."""
    return json.dumps(data).translate(_SCRIPT_UNSAFE)


def render(report: BuildReport, output_dir: Path, comparison: str = "") -> str:
    """The whole page; ``comparison``: the section comparing this build with the one
    before (``kiln.compare.page.report_section``, already escaped), or nothing."""
    data = {
        "wall": report.wall_s or 0.0,
        "lanes": report.lanes,
        "runs": [
            {
                "id": r.id,
                "desc": r.desc,
                "lane": r.lane,
                "start": round(r.start, 6),
                "duration": round(r.duration, 6),
                "status": r.status,
                "critical": r.critical,
                "reason": r.why,
            }
            for r in report.runs
        ],
    }
    blob = embedded_json(data)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>kiln build report: {_e(output_dir)}</title><style>{_CSS}</style></head>",
        "<body><main>",
        _header(report, output_dir),
        _timeline(report),
        _critical(report),
        _slowest(report),
        _failures(report),
        _artifacts(report),
        comparison,
        _kept(report),
        "</main><div id='tip'></div>",
        f"<script type='application/json' id='kiln-data'>{blob}</script>",
        f"<script>{_JS}</script></body></html>\n",
    ]
    return "\n".join(parts)


def _header(report: BuildReport, output_dir: Path) -> str:
    if report.ok is None:
        status, cls = "incomplete: the build did not record its end", "unknown"
    elif report.interrupted:
        status, cls = "interrupted", "bad"
    else:
        status, cls = ("succeeded", "ok") if report.ok else ("failed", "bad")
    when = datetime.datetime.fromtimestamp(report.started).astimezone()
    counts = report.counts or {"built": sum(r.status == "finished" for r in report.runs)}
    labels = [
        ("built", "built"),
        ("up_to_date", "up to date"),
        ("cached", "from cache"),
        ("failed", "failed"),
        ("not_run", "not run"),
    ]
    boxes = "".join(
        f"<div class='count' id='count-{key}'><b>{_e(counts.get(key, 0))}</b>{label}</div>"
        for key, label in labels
    )
    which = "the last build" if not report.build else _builds_before(report.build)
    return (
        f"<h1>kiln build report</h1><p><span class='status {cls}' id='status'>{_e(status)}"
        f"</span> &nbsp;{_e(which)}, {_e(when.strftime('%Y-%m-%d %H:%M:%S %Z'))}, wall time "
        f"{_seconds(report.wall_s)}, -j {_e(report.jobs)}, output directory "
        f"<code>{_e(output_dir)}</code></p><p id='targets'>Targets: {_targets(report.targets)}</p>"
        f"<div class='counts'>{boxes}</div>"
    )


_TARGETS_SHOWN = 8


def _targets(targets: list[str]) -> str:
    """The requested targets; past the first few, folded (a zoo names 140)."""
    if not targets:
        return "(none)"
    shown = _e(", ".join(targets[:_TARGETS_SHOWN]))
    rest = targets[_TARGETS_SHOWN:]
    if not rest:
        return shown
    return (
        f"{shown} <details class='more'><summary>and {len(rest)} more</summary>"
        f"{_e(', '.join(rest))}</details>"
    )


def _builds_before(n: int) -> str:
    return "the build before the last" if n == 1 else f"{n} builds before the last"


def _kept(report: BuildReport) -> str:
    """Every build ``.kiln/`` keeps, and how to see each one."""
    rows = []
    for k in report.kept:
        command = "kiln report" if k.n == 0 else f"kiln report --build {k.n}"
        mark = " class='shown'" if k.n == report.build else ""
        rows.append(
            f"<tr{mark}><td class='num'>{k.n}</td><td>{_e(k.started_text)}"
            f"</td><td>{_e(k.status)}</td><td>{_e(k.counts_text)}</td>"
            f"<td class='num'>{_seconds(k.wall_s)}</td><td><code>{_e(command)}</code></td></tr>"
        )
    head = (
        "<tr><th>builds before the last</th><th>started</th><th>status</th><th>counts</th>"
        "<th>wall</th><th>its report</th></tr>"
    )
    return (
        f"<section id='kept-builds'><h2>Kept builds ({len(report.kept)})</h2>"
        f"<table>{head}{''.join(rows)}</table></section>"
    )


def _timeline(report: BuildReport) -> str:
    legend = (
        "<p class='legend'>One row per worker lane.<span style='background:#4c6ef5'></span>"
        "ran<span style='background:#f76707'></span>critical path"
        "<span style='background:#e03131'></span>failed"
        "<span style='background:#adb5bd'></span>from cache</p>"
    )
    body = "<div id='timeline'></div><noscript>The timeline needs JavaScript.</noscript>"
    if not report.runs:
        body = "<p id='timeline-empty'>No action ran: everything was up to date.</p>" + body
    return f"<section id='timeline-section'><h2>Timeline</h2>{legend}{body}</section>"


def _critical(report: BuildReport) -> str:
    runs = {r.id: r for r in report.runs}
    chain = [runs[i] for i in report.critical]
    total = sum(r.duration for r in chain)
    items = "".join(f"<li>{_e(r.desc)} <small>({_seconds(r.duration)})</small></li>" for r in chain)
    return (
        f"<section id='critical-path'><h2>Critical path</h2><p>{len(chain)} action(s), "
        f"{_seconds(total)} of {_seconds(report.wall_s)} wall time.</p>"
        f"<ol>{items}</ol></section>"
    )


def _slowest(report: BuildReport) -> str:
    rows = "".join(
        f"<tr><td>{_e(r.desc)}</td><td class='num'>{_seconds(r.duration)}</td>"
        f"<td>{_e(r.status)}{' (critical)' if r.critical else ''}</td><td>{_e(r.lane)}</td>"
        f"<td>{_e(r.target or '')}</td><td>{_e(r.why or '')}</td></tr>"
        for r in report.slowest()
    )
    head = (
        "<tr><th>action</th><th>time</th><th>status</th><th>lane</th><th>target</th>"
        "<th>why it ran</th></tr>"
    )
    return f"<section id='slowest'><h2>Slowest actions</h2><table>{head}{rows}</table></section>"


def _failures(report: BuildReport) -> str:
    failed = report.failures()
    parts = [f"<section id='failures'><h2>Failures ({len(failed)})</h2>"]
    if not failed:
        parts.append("<p>No action failed.</p>")
    for run in failed:
        parts.append(_failure(run))
    if report.not_run:
        by_cause: dict[str, list[str]] = {}
        for rec in report.not_run:
            by_cause.setdefault(rec.get("root_cause") or "the build stopped", []).append(
                rec.get("desc", "?")
            )
        names = {r.id: r.desc for r in report.runs + report.unchanged}
        items = "".join(
            f"<li>{len(descs)} not run because of {_e(names.get(cause, cause))}: "
            f"{_e(', '.join(descs[:10]))}{' ...' if len(descs) > 10 else ''}</li>"
            for cause, descs in by_cause.items()
        )
        parts.append(f"<h3>Not run</h3><ul id='not-run'>{items}</ul>")
    parts.append("</section>")
    return "".join(parts)


def _failure(run: ActionRun) -> str:
    if run.unchanged:
        when = (
            "not run: it failed with the same key in an earlier build (the error and log "
            "below are that run's); <code>kiln build --retry-failed</code> runs it again"
        )
        if run.failed_before:
            when += f"; failed in the {run.failed_before} kept build(s) before this one too"
    else:
        when = (
            f"after {_seconds(run.duration)} on {_e(run.lane)}"
            f"{'; why it ran: ' + _e(run.why) if run.why else ''}"
        )
    text = [
        f"<article class='failure{' unchanged' if run.unchanged else ''}'><h3>{_e(run.desc)}</h3>",
        f"<p>{when}</p>",
        f"<pre class='error'>{_e(run.error or '')}</pre>",
    ]
    tail = log_tail(run.log)
    if run.log:
        link = Path(run.log).absolute().as_uri()
        text.append(f"<p>Log: <a class='log-link' href='{_e(link)}'>{_e(run.log)}</a></p>")
    if tail is not None:
        text.append(f"<pre class='log-tail'>{_e(tail)}</pre>")
    text.append("</article>")
    return "".join(text)


def _artifacts(report: BuildReport) -> str:
    manifest = report.manifest
    parts = ["<section id='artifacts'><h2>Artifacts</h2>"]
    if report.build:
        parts.append("<p>The manifest describes the last build: see its report.</p></section>")
        return "".join(parts)
    if manifest is None:
        parts.append("<p>No manifest.json in the output directory.</p></section>")
        return "".join(parts)
    head = (
        "<tr><th>path</th><th>status</th><th>size</th><th>sha256</th><th>target</th>"
        "<th>verification</th></tr>"
    )
    for name, entry in sorted(manifest.get("entrypoints", {}).items()):
        rows = "".join(_artifact_row(o) for o in entry.get("outputs", []))
        parts.append(f"<h3>{_e(name)}</h3><table class='artifacts'>{head}{rows}</table>")
    parts.append("</section>")
    return "".join(parts)


def _artifact_row(out: dict[str, Any]) -> str:
    digest = out.get("sha256") or ""
    checks = out.get("verification") or []
    verdicts = []
    for check in checks:
        ok = check.get("passed")
        label = "passed" if ok else check.get("status", "failed")
        verdicts.append(f"<span class='{'passed' if ok else 'failedv'}'>{_e(label)}</span>")
    return (
        f"<tr><td><code>{_e(out.get('path', ''))}</code></td><td>{_e(out.get('status', ''))}"
        f"</td><td class='num'>{_size(out.get('size'))}</td>"
        f"<td><code title='{_e(digest)}'>{_e(digest[:16])}</code></td>"
        f"<td>{_e(out.get('target', ''))}</td><td>{' '.join(verdicts) or '-'}</td></tr>"
    )
