"""`torch-neuronx audit --html FILE`: one self-contained page (no network at view
time), every section and plot present, user text escaped, empty sections
handled (a crashed script's report), the optional dependencies imported only
when rendering, and the page really drawn by a browser (headless Chromium:
a screenshot that is not blank, a DOM with the sections and drawn SVG plots)."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys

import pytest

from torch_neuronx.audit import html

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECTIONS = ["verdict", "summary", "fallbacks", "compilations", "torch-compile", "memory", "hazards",
            "estimate", "cost"]
PLOTS = ["step-time", "memory", "signatures", "fallbacks"]
CHROMIUM_MISSING = "chromium is missing: run scripts/setup.sh as root (it installs Debian's chromium)"


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(tmp_path / "cache")
    env["TORCH_NEURONX_FALLBACK"] = "silent"
    return env


@pytest.fixture(scope="module")
def audited(porting_audit):
    """(report dict, path of the HTML page) of the example porting script, through the CLI
    (conftest.py runs it once for this file and tests/test_audit.py)."""
    _, report, html_path = porting_audit
    return report, html_path


def _crashed(report: dict) -> dict:
    """The report of a script that died early: no steps, no fallbacks, an estimate with
    nothing in it, and an exception whose text is markup."""
    r = copy.deepcopy(report)
    r.update(status="failed", exit_code=1, fallbacks=[], collectives=[],
             exception='Traceback (most recent call last):\n  File "train.py", line 3\n'
                       "RuntimeError: <script>alert(1)</script> & more")
    r["steps"] = {"count": 1, "source": "none", "note": "no step marker was seen"}
    r["memory"]["timeline"] = []
    r["eager_compilations"] = {"total_signatures": 0, "first_step": 0, "new_per_step": [],
                               "after_last_step": 0, "churn": []}
    for estimate in r["estimates"]:
        estimate["by_class"] = {name: [0.0, 0.0] for name in estimate["by_class"]}
        estimate["low_s"] = estimate["high_s"] = 0.0
    r["verdict"] = {"status": "blocked", "reasons": ["the command failed (see the exception)"],
                    "actions": [a for a in r["verdict"]["actions"] if a["kind"] != "fallback"]}
    return r


def _escaped(text: str) -> str:
    from markupsafe import escape

    return str(escape(text))


def _figure(page: str, name: str) -> str | None:
    match = re.search(rf'<figure id="plot-{name}">(.*?)</figure>', page, re.S)
    return match.group(1) if match else None


# ------------------------------------------------------------------ the page

def test_page_is_self_contained(audited):
    page = audited[1].read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    remote = re.findall(r'\b(?:src|href)\s*=\s*["\']?\s*(?:https?:)?//', page, re.I)
    assert not remote, f"links to the network: {remote[:5]}"
    assert not re.search(r"<script\b[^>]*\bsrc", page, re.I)
    assert not re.search(r"<link\b[^>]*stylesheet", page, re.I)
    assert not re.search(r"@import|url\(\s*['\"]?https?:", page, re.I)
    assert "<?xml" not in page, "an SVG's XML prolog was left in the page"


def test_sections_and_plots_present(audited):
    report, path = audited
    page = path.read_text(encoding="utf-8")
    for section in SECTIONS:
        assert re.search(rf'<section id="{section}">\s*<h2>', page), section
    assert 'id="collectives"' not in page  # the example has none
    for name in PLOTS:
        figure = _figure(page, name)
        assert figure is not None, f"no plot-{name} figure"
        assert "<svg" in figure and "<figcaption>" in figure, name
    assert "ESTIMATE" in page and "estimate" in _figure(page, "step-time")
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "duplicate element ids (the inline SVGs' ids must be prefixed)"
    # What the report says is on the page: the ranked actions, the fallback's line and code.
    assert report["verdict"]["status"].replace("_", " ").upper() in page
    for action in report["verdict"]["actions"]:
        assert _escaped(action["what"]) in page
    site = report["fallbacks"][0]["sites"][0]
    assert _escaped(site["code"]) in page
    assert "pass --price" in page  # the example's targets have no price


def test_work_outside_the_steps_has_its_section(audited):
    """The example reads one value after its last optimizer step: the "after the training
    loop" phase, with its own estimate per occurrence on each target."""
    report, path = audited
    page = path.read_text(encoding="utf-8")
    after = next(p for p in report["phases"] if p["name"] == "after_last_step")
    section = page.split('<section id="phases">', 1)[1].split("</section>", 1)[0]
    assert "after the training loop" in section and "aten::_local_scalar_dense" in section
    assert all(f"{e['instance']} per occurrence" in section for e in after["estimates"])
    assert '<section id="phases">' not in html.render({"command": ["x.py"], "phases": []})


def test_crashed_report_renders_without_empty_plots(audited):
    report = _crashed(audited[0])
    page = html.render(report)
    for section in SECTIONS:
        assert f'<section id="{section}">' in page, section
    assert _figure(page, "fallbacks") is None and "No CPU fallbacks" in page
    assert _figure(page, "memory") is None and "no memory timeline" in page
    assert _figure(page, "step-time") is None and _figure(page, "signatures") is None
    assert "<script" not in page
    assert "RuntimeError: &lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert "<pre>" in page


def test_bare_report_renders():
    """A report with only a few fields (hand-made, or from an older audit) still renders."""
    page = html.render({"command": ["python", "x.py"], "status": "failed", "exception": "boom"})
    for section in SECTIONS:
        assert f'<section id="{section}">' in page, section
    assert not any(_figure(page, name) for name in PLOTS)


def test_user_code_is_escaped_and_optional_sections_appear(audited):
    report = copy.deepcopy(audited[0])
    report["fallbacks"][0]["sites"][0]["code"] = 'y = f(x) if a < b else "<img src=x onerror=alert(1)>"'
    report["collectives"] = [{"op": "all_reduce", "bytes": 4096, "world_size": 2, "calls_per_step": 1.0,
                              "calls": 6}]
    report["ranks"].append(dict(report["ranks"][0], rank=1, exception="ValueError: <b>bad</b>"))
    page = html.render(report)
    assert "<img" not in page and "<b>bad</b>" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "ValueError: &lt;b&gt;bad&lt;/b&gt;" in page
    assert '<section id="collectives">' in page and "all_reduce" in page
    assert "<h3>Processes</h3>" in page


def test_cost_ranges_prices_and_baseline(audited):
    from torch_neuronx.audit import prices

    report = copy.deepcopy(audited[0])
    baseline = {"name": "g6e.xlarge", "seconds_per_step": 0.0005, "usd_per_hour": 1.861}
    report["cost"]["rows"] = prices.cost_table(report["estimates"], {"trn2.3xlarge": 4.0}, 1.0, "step", baseline)
    page = html.render(report)
    cost = page[page.index('<section id="cost">'):]
    assert "g6e.xlarge" in cost and "(baseline)" in cost and "$4/h" in cost
    assert re.search(r"[\d.]+× – [\d.]+×", cost), "work per dollar vs baseline as best – worst"
    assert re.search(r"\$[\d.]+ – \$[\d.]+", cost), "USD per million units as best – worst"
    assert "pass --price" in cost  # trn3.3xlarge has no price


# ------------------------------------------------- the optional dependencies

def test_other_audit_modules_do_not_import_the_extra():
    code = ("import sys\n"
            "import torch_neuronx.audit.html, torch_neuronx.audit.report, torch_neuronx.audit.terminal\n"
            "import torch_neuronx.audit.schema, torch_neuronx.audit.prices, torch_neuronx.audit.estimate\n"
            "print(sorted(m for m in ('matplotlib', 'jinja2') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("missing", ["jinja2", "matplotlib"])
def test_missing_extra_says_what_to_install(monkeypatch, tmp_path, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` now raises ImportError
    with pytest.raises(RuntimeError, match=re.escape("install the audit extra: pip install 'torch-neuronx[audit]'")):
        html.write({"command": []}, str(tmp_path / "r.html"))
    assert not (tmp_path / "r.html").exists()


# ------------------------------------------------------------ in a browser

def _chromium(*args: str, tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail(CHROMIUM_MISSING)
    # A profile of its own: no clash with a Chromium someone else runs on this machine.
    command = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, the first after the 8-byte signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", head[16:24])


def test_chromium_draws_the_page(audited, tmp_path):
    from matplotlib import image

    url = audited[1].as_uri()
    shot = tmp_path / "page.png"
    proc = _chromium(f"--screenshot={shot}", "--window-size=1280,4000", url, tmp_path=tmp_path)
    assert shot.exists(), proc.stderr[-2000:]
    assert _png_size(shot) == (1280, 4000)
    pixels = image.imread(str(shot))[..., :3]
    assert pixels.std() > 0.05, "the screenshot is blank"
    assert (pixels.min(axis=2) < 0.8).mean() > 0.02, "next to nothing drawn"
    coloured = (pixels.max(axis=2) - pixels.min(axis=2) > 0.3).mean()
    assert coloured > 0.002, "no colour: neither badges nor plots were drawn"

    proc = _chromium("--dump-dom", "--virtual-time-budget=2000", url, tmp_path=tmp_path)
    dom = proc.stdout
    assert proc.returncode == 0 and "</html>" in dom, proc.stderr[-2000:]
    for section in SECTIONS:
        assert f'id="{section}"' in dom, section
    for name in PLOTS:
        figure = _figure(dom, name)
        assert figure is not None and "<svg" in figure, name
        assert figure.count("<path") > 10, f"plot-{name} has next to nothing drawn"

