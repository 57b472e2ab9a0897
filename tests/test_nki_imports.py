"""AWS's import styles resolve to the simulator (`import nki`, `import neuronxcc.nki`), never
shadowing an installed nki/neuronxcc; the startup hook that makes a plain `import nki` work.

The hook is a .pth file: `site` runs it when it processes a site directory. The subprocess tests
copy it into a temporary directory and call site.addsitedir on that directory, which is what the
interpreter does with site-packages at start (a wheel installs the file there; see docs/nki.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_neuronx import _nki_aliases

REPO = Path(__file__).resolve().parents[1]


def run_python(code: str, tmp_path: Path, *first_on_path: Path) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter whose site directory `tmp_path/site` holds the hook;
    `first_on_path` directories come before this checkout on sys.path (fake AWS packages)."""
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(REPO / _nki_aliases.PTH_NAME, site_dir)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, first_on_path), str(REPO)])
    prologue = f"import site, sys; site.addsitedir({str(site_dir)!r})\n"
    return subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)


def check(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def write_package(root: Path, dotted: str, source: str = "") -> None:
    """A fake installed package: root/a/b/__init__.py holding `source` for "a.b" (parents empty)."""
    parts = dotted.split(".")
    for i in range(1, len(parts) + 1):
        package = root.joinpath(*parts[:i])
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(source if i == len(parts) else "")


# ---------------------------------------------------------------------------- the hook
def test_hook_is_cheap_and_only_installs_the_finder(tmp_path):
    out = check(run_python("""
        heavy = [m for m in ("torch", "torch_neuronx", "torch_neuronx.nki", "numpy") if m in sys.modules]
        finders = [type(f).__name__ for f in sys.meta_path]
        print(heavy, finders[-1], finders.count("AliasFinder"))
    """, tmp_path))
    assert out.split("\n")[0] == "[] AliasFinder 1", out


def test_plain_import_nki_runs_a_kernel(tmp_path):
    """A kernel file as AWS's current docs write it: `import nki` with no torch_neuronx import."""
    out = check(run_python("""
        import numpy as np
        import nki
        import nki.isa as nisa
        import nki.language as nl
        from nki.isa.constants import dge_mode, oob_mode
        import nki.compiler
        import nki.typing

        @nki.jit
        def double(x):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=x, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error)
            nl.store(out, nl.add(tile, tile))
            return out

        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        assert np.array_equal(nki.simulate(double)(x), 2 * x)
        import torch_neuronx.nki
        assert nki is torch_neuronx.nki and nl is torch_neuronx.nki.language
        assert nki.isa.constants is torch_neuronx.nki.isa.constants
        print("ok")
    """, tmp_path))
    assert out.strip() == "ok"


def test_plain_import_neuronxcc_nki(tmp_path):
    """The older style: `import neuronxcc.nki as nki` and its language/isa/typing submodules."""
    out = check(run_python("""
        import numpy as np
        import neuronxcc.nki as nki
        import neuronxcc.nki.isa as nisa
        import neuronxcc.nki.language as nl
        import neuronxcc.nki.typing as nt
        from neuronxcc import nki as same

        @nki.jit
        def negate(x):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.negative(nl.load(x)))
            return out

        x = np.ones((4, 8), dtype=np.float32)
        assert np.array_equal(nki.simulate_kernel(negate, x), -x)
        import torch_neuronx.nki
        assert nki is same is torch_neuronx.nki and nisa is torch_neuronx.nki.isa
        assert nt is torch_neuronx.nki.typing
        print("ok")
    """, tmp_path))
    assert out.strip() == "ok"


def test_installed_nki_and_neuronxcc_are_never_shadowed(tmp_path):
    real = tmp_path / "real"
    write_package(real, "nki", "REAL = 'nki'")
    (real / "nki" / "language.py").write_text("REAL = 'nki.language'")
    write_package(real, "neuronxcc.nki", "REAL = 'neuronxcc.nki'")
    out = check(run_python("""
        import torch_neuronx.nki  # installs the finder a second time: still only the last resort
        import nki, nki.language, neuronxcc.nki
        print(nki.REAL, nki.language.REAL, neuronxcc.nki.REAL)
    """, tmp_path, real))
    assert out.strip() == "nki nki.language neuronxcc.nki"


def test_installed_neuronxcc_without_nki_keeps_its_error(tmp_path):
    real = tmp_path / "real"
    write_package(real, "neuronxcc", "REAL = True")
    out = check(run_python("""
        import neuronxcc
        try:
            import neuronxcc.nki
        except ModuleNotFoundError as e:
            print(neuronxcc.REAL, e.name)
    """, tmp_path, real))
    assert out.strip() == "True neuronxcc.nki"


def test_hook_does_nothing_without_this_torch_neuronx(tmp_path):
    """An older torch_neuronx (no _nki_aliases.py) first on the path: no error at start, no alias."""
    old = tmp_path / "old"
    write_package(old, "torch_neuronx")
    proc = run_python("""
        try:
            import nki
        except ModuleNotFoundError:
            print("no nki")
    """, tmp_path, old)
    assert check(proc).strip() == "no nki" and proc.stderr == ""


# ---------------------------------------------------------------------------- in this process
def test_importing_the_simulator_installs_the_finder():
    import torch_neuronx.nki

    # By name: where the startup hook is installed (scripts/setup.sh writes it) it loaded its own copy
    # of _nki_aliases, whose finder class is another object with the same name.
    assert sum(type(f).__name__ == "AliasFinder" for f in sys.meta_path) == 1
    import nki  # noqa: F401 - no real nki in the test environment
    import nki.language

    assert sys.modules["nki"] is torch_neuronx.nki and nki.language is torch_neuronx.nki.language


def test_write_pth_copies_the_hook(tmp_path):
    path = _nki_aliases.write_pth(str(tmp_path))
    assert Path(path).read_text() == (REPO / _nki_aliases.PTH_NAME).read_text()
    assert Path(path).name.endswith(".pth")


def test_the_command_for_editable_installs_writes_the_hook(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "torch_neuronx._nki_aliases", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    written = tmp_path / _nki_aliases.PTH_NAME
    assert check(proc).strip() == f"wrote {written}"
    assert written.read_text() == (REPO / _nki_aliases.PTH_NAME).read_text()


@pytest.mark.parametrize("name", ["nki.kernel", "neuronxcc.nki.tensor"])
def test_internal_submodules_are_the_loaded_ones(name):
    """`nki.X` is torch_neuronx.nki.X itself, never a second copy loaded through the package path."""
    import importlib

    import torch_neuronx.nki

    assert importlib.import_module(name) is sys.modules["torch_neuronx.nki." + name.rsplit(".", 1)[1]]
    assert torch_neuronx.nki  # imported for its side effect above
