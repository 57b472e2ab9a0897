"""The command line of a generated documentation page (docs/supported-operators.md by
torch_neuronx.op_support, docs/nki-api.md by torch_neuronx.nki.api_status): `--write` renders
and writes the page, `--check` exits 1 when the page on disk is not what would be rendered now."""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Callable


def main(argv: list[str] | None, *, prog: str, description: str, page: pathlib.Path,
         render: Callable[[], str], is_current: Callable[[str], bool], regenerate: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help=f"write {page.name}")
    action.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    parser.add_argument("--output", type=pathlib.Path, default=page, help="the page (default: %(default)s)")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        args.output.write_text(text)
        print(f"wrote {args.output} ({text.count(chr(10))} lines)")
        return 0
    if args.output.exists() and is_current(args.output.read_text()):
        return 0
    print(f"{args.output} is out of date: run {regenerate}", file=sys.stderr)
    return 1
