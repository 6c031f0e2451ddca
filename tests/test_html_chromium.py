"""The HTML pages in headless Chromium: each renders (a screenshot is taken), logs nothing to the console, and shows
the numbers its JSON holds: the headline verdict and memory, the token simulator's timings, the leaderboard's rows
after sorting and filtering them in the page. Skipped where no Chromium is installed (`make test` installs Debian's
where it can)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
         "--log-level=0", "--user-data-dir={profile}"]


def benchcal(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "benchcal", *args], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    return p.stdout


def chromium(page: Path, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    args = [f.format(profile=tmp_path / "profile") for f in FLAGS]
    return subprocess.run([CHROMIUM, *args, *flags, page.as_uri()], capture_output=True, text=True, timeout=120)


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_predict_page_shows_its_json_figures(tmp_path):
    args = ["predict", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--ctx", "8192"]
    data = json.loads(benchcal(*args, "--format", "json"))
    page = tmp_path / "predict.html"
    page.write_text(benchcal(*args, "--format", "html"))
    shot = tmp_path / "predict.png"
    p = chromium(page, tmp_path, "--window-size=1280,2400", "--virtual-time-budget=3000", f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000, p.stderr[-2000:]
    assert console_messages(p.stderr) == []
    dom = chromium(page, tmp_path, "--dump-dom").stdout
    headline = re.search(r'<p class="headline[^"]*"><b>(\w[\w ]*)</b>\s*([\d.]+) GiB required of ([\d.]+) GiB usable',
                         dom)
    assert headline, "no headline verdict"
    assert headline.group(1).lower() == data["fit"]["verdict"]
    assert float(headline.group(2)) == pytest.approx(data["memory"]["total_gib"], abs=0.006)
    assert float(headline.group(3)) == pytest.approx(data["gpu"]["usable_gib"], abs=0.006)
    # the stacked bar's segments are the memory breakdown
    for label, key in (("weights", "weights_gib"), ("KV cache", "kv_cache_gib")):
        shown = re.search(rf'title="{label} ([\d.]+) GiB"', dom)
        assert shown and float(shown.group(1)) == pytest.approx(data["memory"][key], abs=0.006), label
    # the simulator: the first token after the TTFT, then one every 1 / decode rate
    delays = [float(x) for x in re.findall(r'animation-delay:\s*([\d.]+)s', dom)]
    ttft, rate = data["throughput"]["ttft_ms"] / 1000, data["throughput"]["decode_tok_s"]
    assert delays[0] == pytest.approx(ttft, abs=0.002)
    assert delays[10] - delays[0] == pytest.approx(10 / rate, abs=0.003)


def test_leaderboard_sorts_and_filters_in_the_page(tmp_path):
    args = ["leaderboard", "--model", "llama-3.1-8b", "--quant", "Q4_K_M", "--ctx", "8192"]
    data = json.loads(benchcal(*args, "--format", "json"))
    html = benchcal(*args, "--format", "html")
    page = tmp_path / "leaderboard.html"
    page.write_text(html)
    p = chromium(page, tmp_path, "--window-size=1280,1600", f"--screenshot={tmp_path / 'lb.png'}")
    assert console_messages(p.stderr) == [] and (tmp_path / "lb.png").stat().st_size > 20_000
    # as a user would: sort by decode (two clicks: descending), then filter on "RTX 40"
    driven = tmp_path / "driven.html"
    driven.write_text(html.replace("</body></html>", """<script>
const th = [...document.querySelectorAll("table.sortable th")].find(h => h.textContent.startsWith("Decode"));
th.click(); th.click();
const f = document.querySelector("input.filter"); f.value = "RTX 40"; f.dispatchEvent(new Event("input"));
</script></body></html>"""))
    run = chromium(driven, tmp_path, "--dump-dom")
    assert console_messages(run.stderr) == []
    body = run.stdout[run.stdout.index("<tbody>", run.stdout.index('class="sortable"')):]
    body = body[:body.index("</tbody>")]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", cells) for hidden, cells in
            re.findall(r'<tr( style="display: none;")?>(.*?)</tr>', body, re.S) if not hidden]
    expected = sorted((r for r in data["rows"] if "RTX 40" in r["name"] and r["decode_tok_s"] is not None),
                      key=lambda r: -r["decode_tok_s"])
    assert [r[0] for r in rows[:len(expected)]] == [r["name"] for r in expected]
    assert [float(r[3]) for r in rows[:len(expected)]] == pytest.approx([r["decode_tok_s"] for r in expected], abs=0.06)
    assert all("RTX 40" in r[0] for r in rows)


def test_report_page_renders_without_console_errors(tmp_path):
    page = tmp_path / "report.html"
    benchcal("report", "--runs-dir", str(REPO / "runs" / "imported"), "--format", "html", "--output", str(page))
    shot = tmp_path / "report.png"
    p = chromium(page, tmp_path, "--window-size=1280,3000", f"--screenshot={shot}")
    assert console_messages(p.stderr) == [] and shot.stat().st_size > 20_000
