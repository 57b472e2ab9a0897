"""Renders the tables of docs/env-vars.md from the declarations in
torch_neuronx/config.py (the prose around them is written by hand).

    .venv/bin/python scripts/render_env_vars.py          # rewrite the page
    .venv/bin/python scripts/render_env_vars.py --check  # exit 1 when it is stale

tests/test_config.py runs the same check.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's package, not an installed one

from torch_neuronx import config  # noqa: E402

PAGE = ROOT / "docs" / "env-vars.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page is stale")
    args = parser.parse_args()
    text = PAGE.read_text()
    rendered = config.render_page(text)
    if args.check:
        if rendered != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/render_env_vars.py")
            return 1
        return 0
    PAGE.write_text(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
