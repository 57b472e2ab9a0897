"""docs/hardware-figures.md is the one place the code's hardware figures are sourced: every
citation of it names a section that exists, and the audit's chip rates are the page's."""

from __future__ import annotations

import re
from pathlib import Path

from torch_neuronx.audit.estimate import TARGET_RATES

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "hardware-figures.md"
CITATION = re.compile(r"hardware-figures\.md#([a-z0-9-]+)")


def _anchors() -> set[str]:
    """GitHub's anchors of the page's headings: lower case, punctuation dropped, spaces as '-'."""
    headings = re.findall(r"^#+ (.+)$", PAGE.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}


def _cited() -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}
    files = [*ROOT.glob("torch_neuronx/**/*.py"), *ROOT.glob("docs/*.md"), *ROOT.glob("tests/*.py"),
             ROOT / "README.md"]
    for path in files:
        for anchor in CITATION.findall(path.read_text()):
            cited.setdefault(anchor, set()).add(str(path.relative_to(ROOT)))
    return cited


def test_every_citation_names_a_section_of_the_page():
    cited = _cited()
    assert cited, "nothing cites docs/hardware-figures.md"
    missing = {anchor: files for anchor, files in cited.items() if anchor not in _anchors()}
    assert not missing, f"citations of sections the page does not have: {missing}"


def test_the_audit_chip_rates_are_the_page_figures():
    text = PAGE.read_text()
    for platform, rates in TARGET_RATES.items():
        for value in (rates.bf16_tflops, rates.fp8_tflops, rates.fp32_tflops, rates.hbm_tbps,
                      rates.neuronlink_tbps):
            shown = f"{value:,}" if float(value).is_integer() else f"{value}"
            assert shown in text, f"{platform}: {shown} is not on {PAGE.name}"
