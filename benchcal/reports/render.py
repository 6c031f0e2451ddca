"""Render a :class:`Report` as a terminal table, Markdown, JSON or one self-contained HTML page.

A report is data: a title, a subtitle, sections (key/value blocks, tables, code blocks) and
charts (x/y series). Builders in :mod:`benchcal.reports.predictions` and :mod:`benchcal.reports.calibration` produce them;
this module only formats. Charts are drawn with matplotlib into inline SVG, so the HTML page
needs no network and no script.
"""

from __future__ import annotations

import html
import io
import json
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("table", "md", "json", "html")


@dataclass
class Section:
    """One block of a report: ``kind`` is "kv" (rows of label/value), "table" or "code"."""

    title: str
    kind: str
    rows: list[list[Any]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Chart:
    """A line or scatter chart: ``series`` maps a label to (xs, ys)."""

    title: str
    x_label: str
    y_label: str
    series: dict[str, tuple[list[float], list[float]]]
    kind: str = "line"  # or "scatter"
    hline: float | None = None
    hline_label: str = ""
    diagonal: bool = False


@dataclass
class Report:
    title: str
    subtitle: str = ""
    sections: list[Section] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    data: Any = None  # the machine-readable payload for --format json

    def add(self, title: str, kind: str, rows, columns=None, note: str = "") -> Section:
        sec = Section(title, kind, [list(r) for r in rows], list(columns or []), note)
        self.sections.append(sec)
        return sec


def _cell(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if v != v:  # NaN
            return "—"
        return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def render(report: Report, fmt: str) -> str:
    """Format ``report``; ``fmt`` is one of FORMATS."""
    if fmt == "json":
        payload = report.data if report.data is not None else {
            "title": report.title,
            "sections": [{"title": s.title, "columns": s.columns, "rows": s.rows} for s in report.sections],
        }
        return json.dumps(payload, indent=2, default=str)
    if fmt == "md":
        return render_markdown(report)
    if fmt == "html":
        return render_html(report)
    return render_text(report)


def render_markdown(report: Report) -> str:
    out = [f"# {report.title}", ""]
    if report.subtitle:
        out += [report.subtitle, ""]
    for sec in report.sections:
        out += [f"## {sec.title}", ""]
        if sec.kind == "code":
            out += ["```sh", *[str(r[0]) for r in sec.rows], "```"]
        else:
            cols = sec.columns or ["", ""]
            out.append("| " + " | ".join(cols) + " |")
            out.append("|" + "|".join("---" for _ in cols) + "|")
            out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in sec.rows]
        if sec.note:
            out += ["", sec.note]
        out.append("")
    return "\n".join(out)


def render_text(report: Report) -> str:
    """Terminal output with rich tables (plain text when not a TTY)."""
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=140, force_terminal=False, color_system=None, soft_wrap=True)
    console.print(report.title, style="bold")
    if report.subtitle:
        console.print(report.subtitle)
    for sec in report.sections:
        console.print()
        if sec.kind == "code":
            console.print(sec.title, style="bold")
            for row in sec.rows:
                console.print("  " + str(row[0]), markup=False, highlight=False)
        else:
            show_header = bool(sec.columns)
            table = Table(title=sec.title, title_justify="left", show_header=show_header, box=None if sec.kind == "kv" else None)
            for i, col in enumerate(sec.columns or ["", ""]):
                table.add_column(col, justify="left" if i == 0 else "right")
            for row in sec.rows:
                table.add_row(*[html.unescape(_cell(c)) for c in row])
            console.print(table)
        if sec.note:
            console.print(sec.note, markup=False, highlight=False)
    return buf.getvalue().rstrip() + "\n"


def chart_svg(chart: Chart) -> str:
    """One chart as an inline SVG string (matplotlib, Agg-free SVG backend)."""
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for label, (xs, ys) in chart.series.items():
        if chart.kind == "scatter":
            ax.scatter(xs, ys, label=label, s=18)
        else:
            ax.plot(xs, ys, marker="o", label=label)
    if chart.hline is not None:
        ax.axhline(chart.hline, color="crimson", linestyle="--", label=chart.hline_label or None)
    if chart.diagonal:
        lims = [min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])]
        ax.plot(lims, lims, color="grey", linewidth=0.8, label="measured = predicted")
    ax.set_title(chart.title)
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    ax.grid(alpha=0.3)
    if chart.series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:70rem;color:#1d2430;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #dde}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.25rem .7rem;border-bottom:1px solid #eef;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f4f6fa}
pre{background:#f4f6fa;padding:.7rem;overflow-x:auto}.note{color:#556;font-size:.9rem}
.fits{color:#137333}.tight{color:#b06000}.needs-offload{color:#b06000}.does-not-fit{color:#c5221f}
</style></head><body>
<h1>{{ title }}</h1>{% if subtitle %}<p>{{ subtitle }}</p>{% endif %}
{% for svg in charts %}<figure>{{ svg }}</figure>{% endfor %}
{% for s in sections %}<h2>{{ s.title }}</h2>
{% if s.kind == "code" %}<pre>{% for r in s.rows %}{{ r[0] }}
{% endfor %}</pre>{% else %}<table>{% if s.columns %}<tr>{% for c in s.columns %}<th>{{ c }}</th>{% endfor %}</tr>{% endif %}
{% for r in s.rows %}<tr>{% for c in r %}<td class="{{ css(c) }}">{{ cell(c) }}</td>{% endfor %}</tr>
{% endfor %}</table>{% endif %}{% if s.note %}<p class="note">{{ s.note }}</p>{% endif %}
{% endfor %}
</body></html>
"""


def render_html(report: Report) -> str:
    """One self-contained page: inline CSS, inline SVG charts, the tables."""
    from jinja2 import Environment
    from markupsafe import Markup

    env = Environment(autoescape=True)
    tpl = env.from_string(_PAGE)
    return tpl.render(
        title=report.title,
        subtitle=report.subtitle,
        sections=report.sections,
        charts=[Markup(chart_svg(c)) for c in report.charts],
        cell=_cell,
        css=lambda c: str(c).replace(" ", "-") if str(c) in ("fits", "tight", "needs offload", "does not fit") else "",
    )
