"""The report as ONE self-contained HTML page: inline CSS and JavaScript, charts as base64 data URIs, no network;
the runs table sorts by any column when its header is clicked.
"""

from __future__ import annotations

import base64
import html
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardbench.report.content import Chart, Column, ReportContent, ReportedRun

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1400px;
       padding: 0 1rem; color: #1f2328; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; }
code { background: #f0f2f4; padding: 0 .25em; border-radius: 3px; }
/* The table scrolls in its own box, both ways, so that its header row stays on top of a long table (a box that
   scrolls sideways only would hold the sticky header to itself, and it would go with the page). */
.table-wrap { overflow: auto; max-height: 85vh; border: 1px solid #d0d7de; border-radius: 6px; }
table#runs { border-collapse: collapse; font-size: 12.5px; white-space: nowrap; }
#runs th, #runs td { padding: .3rem .55rem; border-bottom: 1px solid #eaeef2; }
#runs th { position: sticky; top: 0; z-index: 2; background: #f6f8fa; cursor: pointer; user-select: none;
           text-align: left; }
#runs th:hover { background: #eaeef2; }
#runs td:first-child, #runs th:first-child { position: sticky; left: 0; background: #fff; z-index: 1;
                                             border-right: 1px solid #d0d7de; }
#runs th:first-child { background: #f6f8fa; z-index: 3; }
#runs th .arrow { display: inline-block; width: 1em; color: #0969da; }
#runs td.num, #runs th.num { text-align: right; }
#runs td.missing { color: #8c959f; }
#runs tr.failed td { background: #fff5f5; }
#runs tbody tr:hover td { background: #f3f8ff; }
.note, .hint { color: #57606a; font-size: 12.5px; }
figure { margin: 1.5rem 0; } figcaption { color: #57606a; font-size: 12.5px; }
img.chart { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
.chart-wrap { overflow-x: auto; }
/* A narrow window (a phone) scrolls a chart sideways rather than shrink its text past reading: each chart is
   shown at one scale, its own width (--narrow) x 0.64, so a chart of two panels keeps the text size of one. The
   sticky run column keeps room for the figures beside it (its full name is the cell's title). */
@media (max-width: 700px) {
  img.chart { max-width: none; width: var(--narrow, 640px); }
  #runs td:first-child, #runs th:first-child { max-width: 40vw; overflow: hidden; text-overflow: ellipsis; }
}
"""

NARROW_SCALE = 0.64  # a chart's shown width over its own in a narrow window: a one-panel chart (1,000 px) at 640 px

# Rows move as a whole; missing values (no data-value) sort last in both directions; a stable sort keeps
# the store order among equal values.
SCRIPT = """
(function () {
  var table = document.getElementById('runs');
  var body = table.tBodies[0];
  var headers = Array.prototype.slice.call(table.querySelectorAll('th[data-key]'));
  function key(row, index, numeric) {
    var cell = row.cells[index];
    if (!cell.hasAttribute('data-value')) return null;
    var raw = cell.getAttribute('data-value');
    return numeric ? parseFloat(raw) : raw.toLowerCase();
  }
  headers.forEach(function (th, index) {
    th.addEventListener('click', function () {
      var dir = (table.dataset.sortKey === th.dataset.key && table.dataset.sortDir === 'asc') ? 'desc' : 'asc';
      var numeric = th.dataset.type === 'num';
      var sign = dir === 'asc' ? 1 : -1;
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = key(a, index, numeric), y = key(b, index, numeric);
        if (x === null || y === null) return (x === null) - (y === null);
        if (numeric) return sign * (x - y);
        return sign * x.localeCompare(y, undefined, {numeric: true});
      });
      rows.forEach(function (row) { body.appendChild(row); });
      headers.forEach(function (h) {
        h.setAttribute('aria-sort', 'none');
        h.querySelector('.arrow').textContent = '';
      });
      th.setAttribute('aria-sort', dir === 'asc' ? 'ascending' : 'descending');
      th.querySelector('.arrow').textContent = dir === 'asc' ? '\\u25B2' : '\\u25BC';
      table.dataset.sortKey = th.dataset.key;
      table.dataset.sortDir = dir;
    });
  });
})();
"""


def _inline(text: str) -> str:
    """Escape, then show `code` spans as the Markdown does."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _cell(column: Column, run: ReportedRun) -> str:
    value = column.value(run)
    classes = ["num"] if column.numeric else []
    if value is None or value == "":
        return f'<td class="{" ".join([*classes, "missing"])}" data-key="{column.key}">–</td>'
    sort_value = repr(float(value)) if column.numeric else str(value)
    text = html.escape(column.text(run))
    title = "" if column.numeric else f' title="{text}"'  # whole where a narrow window cuts the cell short
    return (f'<td class="{" ".join(classes)}" data-key="{column.key}" data-value="{html.escape(sort_value)}"{title}>'
            f"{text}</td>")


def _table(columns: tuple[Column, ...], runs: list[ReportedRun]) -> str:
    head = "".join(
        f'<th data-key="{c.key}" data-type="{"num" if c.numeric else "text"}" class="{"num" if c.numeric else ""}" '
        f'aria-sort="none" scope="col">{html.escape(c.label)}<span class="arrow" aria-hidden="true"></span></th>'
        for c in columns)
    rows = "\n".join(
        f'<tr data-run="{html.escape(r.name)}" class="{"complete" if r.ok else "failed"}">'
        + "".join(_cell(c, r) for c in columns) + "</tr>" for r in runs)
    return (f'<div class="table-wrap"><table id="runs"><thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n'
            f"</tbody></table></div>")


def _figure(chart: Chart) -> str:
    png = chart.path.read_bytes()
    data = base64.b64encode(png).decode("ascii")
    caption = html.escape(chart.title) + (f" — {html.escape(chart.note)}" if chart.note else "")
    narrow = round(NARROW_SCALE * int.from_bytes(png[16:20], "big"))  # its width, from the PNG's header
    return (f'<figure id="figure-{chart.name}"><div class="chart-wrap"><img class="chart" id="chart-{chart.name}" '
            f'style="--narrow: {narrow}px" '
            f'alt="{html.escape(chart.title)}" src="data:image/png;base64,{data}"></div><figcaption>{caption}'
            f"</figcaption></figure>")


def render(content: ReportContent) -> str:
    """The whole page as a string."""
    parts = [f'<h1 id="title">{html.escape(content.title)}</h1>', f'<p id="source">{_inline(content.source)}</p>',
             '<section id="swept"><h2>What was swept</h2>']
    if content.varied:
        parts.append("<ul>" + "".join(f"<li><code>{html.escape(k)}</code>: {html.escape(text)}</li>"
                                      for k, text in content.varied_text().items()) + "</ul>")
    else:
        parts.append(f"<p>{html.escape(content.nothing_varied())}</p>")
    if content.unrecorded:
        parts.append(f"<p>{content.unrecorded_text(lambda key: f'<code>{html.escape(key)}</code>', html.escape)}</p>")
    if content.fixed:
        parts.append("<p>Set the same for every run: " + ", ".join(
            f"<code>{html.escape(k)}</code> = {html.escape(text)}" for k, text in content.fixed_text())
            + "</p>")
    parts.append("</section>")
    if content.findings:
        parts.append('<section id="findings"><h2>What the numbers say</h2>')
        for heading, sentences in content.findings.items():
            parts.append(f"<h3>{html.escape(heading)}</h3><ul>"
                         + "".join(f'<li class="finding">{_inline(s)}</li>' for s in sentences) + "</ul>")
        parts.append("</section>")
    parts += ['<section id="runs-section"><h2>Runs</h2>',
              '<p class="hint">Click a column header to sort; click again to reverse. Missing values stay last.</p>',
              _table(content.columns, content.runs), f'<p class="note">{_inline(content.table_note)}</p></section>']
    if content.failed:
        parts.append('<section id="failed"><h2>Failed runs</h2><ul>' + "".join(
            f'<li class="failed-run" data-run="{html.escape(r.name)}"><code>{html.escape(r.name)}</code>: '
            f"{html.escape(r.error_kind or r.status)}: {html.escape(r.error or 'no message')}</li>"
            for r in content.failed) + "</ul></section>")
    left_out = "".join(f'<p class="omitted">{html.escape(line)}</p>' for line in content.omitted)
    parts.append('<section id="charts"><h2>Charts</h2>' + "\n".join(map(_figure, content.charts)) + left_out
                 + "</section>")
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(content.title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n"
            f"<script>{SCRIPT}</script>\n</body>\n</html>\n")
