"""How the report's values read in the terminal summary, the HTML page and the
actions' `where`: one rule each for a source line, a size and a duration."""

from __future__ import annotations

import os


def relative(text) -> str:
    """A path (or "path:line") below the working directory, relative to it; any
    other text as it is. The report is read where the script lives, and full
    paths crowd it."""
    text, here = str(text or ""), os.path.join(os.getcwd(), "")
    return text[len(here):] if text.startswith(here) else text


def site_text(site) -> str:
    """A call site as file:line, "(backward)" for one reached from loss.backward()."""
    if not isinstance(site, dict) or not site.get("file"):
        return "(unknown line)"
    text = f"{relative(site['file'])}:{site.get('line', '?')}"
    return text + (" (backward)" if site.get("backward") else "")


def size(n: float) -> str:
    """Bytes in binary units: 512 B, 38.5 KiB, 24 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n} B"


def duration(seconds: float, micro: str = "us") -> str:
    """Seconds in the unit that keeps them readable: 12.3 us, not 1.23e-05 s
    (`micro`: "µs" where the page can show it)."""
    if seconds == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), (micro, 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
