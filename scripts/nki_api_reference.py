"""Extract the API names of AWS's NKI reference into torch_neuronx/nki/api_reference.py.

Run once per reference update, against a local clone (or bare mirror) of aws-neuron/aws-neuron-sdk:

    python scripts/nki_api_reference.py GIT_DIR            # writes torch_neuronx/nki/api_reference.py

It reads the reference's Sphinx sources, names only (no code, no text):

- every entry of every ``.. autosummary::`` block of each module page, qualified by the page's
  ``.. currentmodule::`` and filed under the section heading above it (entries commented out with
  ``.. name`` are AWS's "not supported" and are skipped);
- the ``.. attribute::`` entries of ``nki.language.tile_size.rst`` (its own page);
- for an autosummary entry rendered with AWS's class templates (``nki-custom-class-*``), the public
  members the template documents, read from the reference's Python stubs (``nki/.../__init__.py``)
  with ``ast``: methods, properties and class attributes (enum members); the attribute-only
  template documents attributes only.

Two references: the current one (``nki/api/``, ``import nki``), read at the repository's HEAD, and the
previous one (``general/nki/api/``, ``neuronxcc.nki``), read at the last commit that had it.
Then regenerate the page: ``python -m torch_neuronx.nki.api_status --write``.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

OUT = pathlib.Path(__file__).resolve().parents[1] / "torch_neuronx" / "nki" / "api_reference.py"

# (key, title, directory in the repository, the commit to read: a revision expression)
REFERENCES = (
    ("current", "NKI API reference (nki, Neuron 2.32)", "nki/api", "HEAD",
     ("nki.rst", "nki.language.rst", "nki.isa.rst", "nki.collectives.rst")),
    ("previous", "NKI API reference before NKI 0.x (neuronxcc.nki, Neuron 2.26)", "general/nki/api",
     "1db4d74ec718b8c3287ad118ad021c95c64ff455^",   # the commit that moved the docs removed it
     ("nki.rst", "nki.language.rst", "nki.isa.rst", "nki.compiler.rst")),
)
CLASS_TEMPLATE = re.compile(r":template:\s*nki-custom-class(-attr-only)?-template")


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def _autosummary(text: str):
    """(module, section, name, template) for every autosummary entry of one page."""
    module, section, lines = None, None, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"\.\.\s+currentmodule::\s*(\S+)", line)
        if m:
            module = m.group(1)
        if i + 1 < len(lines) and line.strip() and re.fullmatch(r"[-=~^]{3,}", lines[i + 1].strip()) \
                and not line.startswith(".."):
            section = line.strip()
        if line.strip() == ".. autosummary::":
            template = None
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                entry = lines[i].strip()
                if entry.startswith(":"):
                    t = CLASS_TEMPLATE.search(entry)
                    if t:
                        template = "attributes" if t.group(1) else "class"
                elif entry and not entry.startswith(".."):
                    yield module, section, entry, template
                i += 1
            continue
        i += 1


def _stub_members(source: str, cls: str, attributes_only: bool) -> list[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            names = []
            for item in node.body:
                if isinstance(item, ast.Assign):
                    names += [t.id for t in item.targets if isinstance(t, ast.Name)]
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.append(item.target.id)
                elif isinstance(item, ast.FunctionDef) and not attributes_only:
                    names.append(item.name)
                elif isinstance(item, ast.FunctionDef) and any(
                        isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                    names.append(item.name)
            return [n for n in names if not n.startswith("_")]
    return []


def extract(git_dir: str):
    out = []
    for key, title, directory, rev, pages in REFERENCES:
        commit = _git(git_dir, "rev-parse", rev).strip()
        names: list[tuple[str, str]] = []
        seen = set()

        def add(name, section):
            if name not in seen:
                seen.add(name)
                names.append((name, section))

        for page in pages:
            text = _git(git_dir, "show", f"{commit}:{directory}/{page}")
            for module, section, entry, template in _autosummary(text):
                qualified = f"{module}.{entry}"
                add(qualified, f"{module}: {section}")
                if template:
                    package, _, cls = qualified.rpartition(".")
                    stub_path = f"{directory}/{package.replace('.', '/')}/__init__.py"
                    try:
                        stub = _git(git_dir, "show", f"{commit}:{stub_path}")
                    except subprocess.CalledProcessError:
                        continue
                    for member in _stub_members(stub, cls, template == "attributes"):
                        add(f"{qualified}.{member}", f"{module}: {section}")
        tile_page = f"{directory}/nki.language.tile_size.rst"
        try:
            tile = _git(git_dir, "show", f"{commit}:{tile_page}")
        except subprocess.CalledProcessError:
            tile = ""
        if tile:
            add("nki.language.tile_size", "nki.language: Constants")
            for attr in re.findall(r"\.\.\s+attribute::\s*(\w+)", tile):
                add(f"nki.language.tile_size.{attr}", "nki.language: Constants")
            pages = pages + ("nki.language.tile_size.rst",)
        out.append((key, title, commit, tuple(f"{directory}/{p}" for p in pages), tuple(names)))
    return out


def render(references) -> str:
    lines = [
        '"""The API names of AWS\'s NKI reference: names only, with where they were read.',
        "",
        "Generated by scripts/nki_api_reference.py from aws-neuron/aws-neuron-sdk (the Sphinx sources of",
        "the NKI API reference: autosummary entries, tile_size attributes, the members AWS's class",
        "templates document); do not edit by hand. docs/nki-api.md is generated from these names",
        "(torch_neuronx/nki/api_status.py).",
        '"""',
        "",
        "REPOSITORY = \"aws-neuron/aws-neuron-sdk\"",
        "",
        "# key -> (title, commit, source pages, ((qualified name, 'module: section'), ...))",
        "REFERENCES = {",
    ]
    for key, title, commit, pages, names in references:
        lines.append(f"    {key!r}: (")
        lines.append(f"        {title!r},")
        lines.append(f"        {commit!r},")
        lines.append(f"        {pages!r},")
        lines.append("        (")
        for name, section in names:
            lines.append(f"            ({name!r}, {section!r}),")
        lines.append("        ),")
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    references = extract(argv[0])
    OUT.write_text(render(references))
    for key, _title, commit, _pages, names in references:
        print(f"{key}: {len(names)} names at {commit[:12]}")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
