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
    interactive: bool = False  # HTML: a table whose headers sort it and whose rows a text box filters


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
    # HTML only (the same figures are in the sections): {"verdict", "required_gib", "usable_gib", "segments":
    # [(label, gib)], "simulator": {"ttft_s", "tok_s"} or None}
    headline: dict[str, Any] | None = None

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


def _context_label(v: float, _pos=None) -> str:
    """4K, 8K, 128K, 1M: context lengths as people write them."""
    if v >= 2**20 and v % 2**20 == 0:
        return f"{v / 2**20:g}M"
    if v >= 1024:
        return f"{v / 1024:g}K"
    return f"{v:g}"


def _positive_span(values: list[float]) -> float:
    """max / min of the finite positive values (1 when there are none)."""
    vals = [v for v in values if v is not None and v == v and v > 0]
    return max(vals) / min(vals) if vals else 1.0


def chart_svg(chart: Chart) -> str:
    """One chart as an inline SVG string (matplotlib's SVG backend). Line charts start at zero; a scatter whose
    values span more than two decades is drawn on log axes; a context axis is log2 with 4K/8K/... ticks; more than
    ten series take colours from a 20-colour map, and more than six put the legend beside the plot."""
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    n = len(chart.series)
    wide = n > 6
    fig, ax = plt.subplots(figsize=(9.5 if wide else 7.5, 3.8 if n <= 20 else 4.6))
    colours = plt.get_cmap("tab20").colors if n > 10 else plt.get_cmap("tab10").colors
    markers = "osD^v<>ph*"
    xs_all = [x for xs, _ in chart.series.values() for x in xs]
    ys_all = [y for _, ys in chart.series.values() for y in ys]
    for i, (label, (xs, ys)) in enumerate(chart.series.items()):
        style = {"color": colours[i % len(colours)]}
        if chart.kind == "scatter":
            ax.scatter(xs, ys, label=label, s=18, marker=markers[(i // len(colours)) % len(markers)], **style)
        else:
            ax.plot(xs, ys, marker="o", label=label, **style)
    if chart.hline is not None:
        ax.axhline(chart.hline, color="crimson", linestyle="--", label=chart.hline_label or None)
    log = chart.kind == "scatter" and chart.diagonal and _positive_span(xs_all + ys_all) > 100
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    elif chart.kind == "scatter" and _positive_span(xs_all) > 100 and min(xs_all, default=0) > 0:
        ax.set_xscale("log")
    if chart.x_label.startswith("context") and xs_all and min(xs_all) > 0:
        ax.set_xscale("log", base=2)
        ticks = sorted(set(xs_all))
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(FuncFormatter(_context_label))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if chart.diagonal:
        lims = [min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])]
        ax.plot(lims, lims, color="grey", linewidth=0.8, label="measured = predicted")
    if chart.kind == "line" and not log and all(y >= 0 for y in ys_all if y == y):
        top = max([y for y in ys_all if y == y] + [chart.hline or 0.0], default=1.0)
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1.12 * top) or 1.0)  # a drop of 25% looks like 25%
    ax.set_title(chart.title)
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    ax.grid(alpha=0.3)
    if chart.series:
        if wide:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if n <= 20 else 2,
                      frameon=False)
        else:
            ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
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
.headline{font-size:1.3rem;margin:1rem 0 .4rem}.headline b{font-size:1.6rem;margin-right:.6rem}
.bar{position:relative;display:flex;height:1.6rem;background:#eef1f6;border-radius:3px;overflow:visible;max-width:60rem}
.bar div{height:100%}.bar .usable{position:absolute;top:-.3rem;bottom:-.3rem;width:0;border-left:2px dashed #c5221f}
.legend{font-size:.85rem;color:#334;margin:.35rem 0 1rem}.legend span{margin-right:1.1rem;white-space:nowrap}
.legend i{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem;vertical-align:-.1rem}
.sim{font-family:ui-monospace,monospace;background:#f4f6fa;padding:.7rem;min-height:4.5rem;max-width:60rem}
.sim span{font-size:0;animation:tok 0s linear forwards}@keyframes tok{from,to{font-size:1rem}}
.sim .cursor{font-size:1rem;animation:none;color:#889}
</style></head><body>
<h1>{{ title }}</h1>{% if subtitle %}<p>{{ subtitle }}</p>{% endif %}
{% if headline %}<p class="headline {{ css(headline.verdict) }}"><b>{{ headline.verdict|capitalize }}</b>
{{ "%.2f"|format(headline.required_gib) }} GiB required of {{ "%.2f"|format(headline.usable_gib) }} GiB usable</p>
<div class="bar" role="img" aria-label="memory: {% for label, gib, colour in bar %}{{ label }} {{ "%.2f"|format(gib) }} GiB; {% endfor %}usable {{ "%.2f"|format(headline.usable_gib) }} GiB">
{% for label, gib, colour in bar %}<div style="width:{{ "%.3f"|format(100 * gib / bar_scale) }}%;background:{{ colour }}" title="{{ label }} {{ "%.2f"|format(gib) }} GiB"></div>{% endfor %}
<div class="usable" style="left:{{ "%.3f"|format(100 * headline.usable_gib / bar_scale) }}%" title="usable {{ "%.2f"|format(headline.usable_gib) }} GiB"></div></div>
<p class="legend">{% for label, gib, colour in bar %}<span><i style="background:{{ colour }}"></i>{{ label }} {{ "%.2f"|format(gib) }} GiB</span>{% endfor %}<span><i style="border-left:2px dashed #c5221f;width:0"></i>usable {{ "%.2f"|format(headline.usable_gib) }} GiB</span></p>
{% if headline.simulator %}<h2>Token speed simulator</h2><p class="note">Placeholder tokens at the predicted rates: the first after
{{ "%.2f"|format(headline.simulator.ttft_s) }} s (TTFT), then {{ "%.1f"|format(headline.simulator.tok_s) }} tokens/s; reload the page to replay.</p>
<div class="sim">{% for word, delay in sim_tokens %}<span style="animation-delay:{{ "%.3f"|format(delay) }}s">{{ word }} </span>{% endfor %}<span class="cursor">▍</span></div>{% endif %}
{% endif %}
{% for svg in charts %}<figure>{{ svg }}</figure>{% endfor %}
{% for s in sections %}<h2>{{ s.title }}</h2>
{% if s.kind == "code" %}<pre>{% for r in s.rows %}{{ r[0] }}
{% endfor %}</pre>{% else %}{% if s.interactive %}<p><input class="filter" type="search" placeholder="filter rows (e.g. fits, RTX, 4090)" aria-label="filter rows"> <span class="note">click a column header to sort</span></p>{% endif %}
<table{% if s.interactive %} class="sortable"{% endif %}>{% if s.columns %}<thead><tr>{% for c in s.columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>{% endif %}<tbody>
{% for r in s.rows %}<tr>{% for c in r %}<td class="{{ css(c) }}">{{ cell(c) }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>{% endif %}{% if s.note %}<p class="note">{{ s.note }}</p>{% endif %}
{% endfor %}
{% if interactive %}<script>
// sort a table by the clicked header (numbers by value, "—" last) and filter its rows by the text box before it
for (const table of document.querySelectorAll("table.sortable")) {
  const body = table.tBodies[0], filter = table.previousElementSibling.querySelector("input.filter");
  const key = (row, i) => { const t = row.cells[i].textContent.trim(), n = parseFloat(t.replace(/[$,]/g, ""));
                            return t === "—" ? null : (isNaN(n) ? t.toLowerCase() : n); };
  table.tHead.querySelectorAll("th").forEach((th, i) => { th.style.cursor = "pointer"; th.addEventListener("click", () => {
    const up = th.dataset.dir !== "up"; th.dataset.dir = up ? "up" : "down";
    const rows = [...body.rows].sort((a, b) => { const x = key(a, i), y = key(b, i);
      if (x === null) return 1; if (y === null) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1); });
    rows.forEach(r => body.appendChild(r)); }); });
  filter.addEventListener("input", () => { const q = filter.value.toLowerCase();
    for (const r of body.rows) r.style.display = r.textContent.toLowerCase().includes(q) ? "" : "none"; });
}
</script>{% endif %}
</body></html>
"""


BAR_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d755d")
_WORDS = ("the", "model", "streams", "tokens", "at", "the", "rate", "predicted", "for", "this", "device", "and",
          "context", "after", "its", "first", "token", "arrives")


def simulated_tokens(ttft_s: float, tok_s: float, seconds: float = 10.0, most: int = 160) -> list[tuple[str, float]]:
    """(placeholder word, when it appears in seconds): the first at ``ttft_s``, then one every 1 / ``tok_s`` s, for
    ``seconds`` after the first (at most ``most`` words)."""
    if not (tok_s > 0 and ttft_s >= 0):
        return []
    n = max(1, min(most, int(seconds * tok_s) + 1))
    return [(_WORDS[i % len(_WORDS)], ttft_s + i / tok_s) for i in range(n)]


def render_html(report: Report) -> str:
    """One self-contained page: inline CSS, inline SVG charts, the tables."""
    from jinja2 import Environment
    from markupsafe import Markup

    env = Environment(autoescape=True)
    tpl = env.from_string(_PAGE)
    head = report.headline
    bar = [(label, gib, BAR_COLOURS[i % len(BAR_COLOURS)]) for i, (label, gib) in enumerate((head or {}).get("segments", ()))
           if gib > 0]
    scale = max([head["usable_gib"], sum(g for _, g, _ in bar)] if head else [1.0]) or 1.0
    sim = (head or {}).get("simulator")
    return tpl.render(
        title=report.title,
        subtitle=report.subtitle,
        headline=head,
        bar=bar,
        bar_scale=scale,
        sim_tokens=simulated_tokens(sim["ttft_s"], sim["tok_s"]) if sim else [],
        sections=report.sections,
        interactive=any(sec.interactive for sec in report.sections),
        charts=[Markup(chart_svg(c)) for c in report.charts],
        cell=_cell,
        css=lambda c: str(c).replace(" ", "-") if str(c) in ("fits", "tight", "needs offload", "does not fit") else "",
    )
