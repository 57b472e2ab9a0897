"""Makes docs/images/audit-report.png, the screenshot of `torch-neuronx audit --html`
that the docs show: audits examples/porting_audit.py, renders the report's page in
headless Chromium (Debian's `chromium`, installed by scripts/setup.sh as root) and
keeps the top of the page (verdict, summary, CPU fallbacks).

    .venv/bin/python scripts/audit_screenshot.py [--out PNG] [--report REPORT.json]

--report renders an existing JSON report instead of running the audit (~20 s).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
WINDOW = "1200,2600"  # the top of the page; keeps the PNG small enough for the repository


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "audit-report.png"))
    parser.add_argument("--report", help="a JSON report (torch-neuronx audit --json) to render instead")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("chromium is missing: run scripts/setup.sh as root (it installs Debian's chromium)")
    with tempfile.TemporaryDirectory(prefix="audit-screenshot-") as tmp:
        page = pathlib.Path(tmp) / "report.html"
        if args.report:
            from torch_neuronx.audit import html

            html.write(json.loads(pathlib.Path(args.report).read_text()), str(page))
        else:
            _audit(pathlib.Path(tmp), page)
        out = pathlib.Path(args.out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={tmp}/profile", f"--screenshot={out}", f"--window-size={WINDOW}",
                        page.as_uri()], check=True, capture_output=True, timeout=180)
    print(f"{out}: {out.stat().st_size / 1024:.0f} KiB")
    return 0


def _audit(tmp: pathlib.Path, page: pathlib.Path) -> None:
    """Audits the example as a user would type it (`python examples/...`, not this
    interpreter's full path, which would show in the picture), with a fresh cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env.update(TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp / "cache"), TORCH_NEURONX_FALLBACK="silent",
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    proc = subprocess.run([sys.executable, "-m", "torch_neuronx", "audit", "--quiet", "--html", str(page),
                           "--", "python", "examples/porting_audit.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not page.exists():
        sys.exit(f"the audit failed (exit code {proc.returncode}):\n{proc.stderr[-3000:]}")


if __name__ == "__main__":
    sys.exit(main())
