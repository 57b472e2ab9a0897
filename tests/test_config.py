"""torch_neuronx.config: every environment variable declared once, documented,
parsed one way, and read nowhere else."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

from torch_neuronx import config

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "torch_neuronx"
DOC = ROOT / "docs" / "env-vars.md"
PROJECT_PREFIXES = ("TORCH_NEURONX_", "NEURON_")

def _documented() -> set[str]:
    """Variable names in the first column of docs/env-vars.md's tables."""
    return set(re.findall(r"^\| `([A-Z0-9_]+)`", DOC.read_text(), re.MULTILINE))


def test_declared_project_variables_are_the_documented_ones():
    documented = {name for name in _documented() if name.startswith(PROJECT_PREFIXES)}
    assert set(config.project_variables()) == documented


def test_project_prefix_means_project_variable():
    for name, variable in config.VARIABLES.items():
        assert variable.external != name.startswith(PROJECT_PREFIXES), name
        assert variable.doc and variable.when in (config.IMPORT, config.PER_CALL), name
        assert variable.section in config.SECTIONS, name


def test_env_vars_page_tables_are_rendered_from_the_declarations():
    text = DOC.read_text()
    assert config.render_page(text) == text, (
        "docs/env-vars.md is stale: run python scripts/render_env_vars.py")


def test_documented_choices_are_the_known_ones():
    """The Values cells that list names owned by other modules list exactly those."""
    from torch_neuronx.neuron import profiles
    from torch_neuronx.nki import targets

    def listed(variable):
        return set(re.findall(r"`([^`]+)`", variable.values))

    assert listed(config.instance) == set(profiles.PROFILES)
    assert listed(config.platform_target) == set(targets.TARGETS)


def test_env_vars_page_has_one_table_per_section():
    sections = [match.group("section") for match in config.GENERATED_TABLE.finditer(DOC.read_text())]
    assert sorted(sections) == sorted(config.SECTIONS)


def test_other_tools_variables_are_documented_too():
    text = DOC.read_text()
    for name, variable in config.VARIABLES.items():
        if variable.external:
            assert f"`{name}`" in text, name


def _environment_reads(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, variable or '?') of every os.environ / os.getenv use in a module."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "environb", "getenv", "getenvb") for alias in node.names):
                found.append((node.lineno, "?"))
        elif isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv", "getenvb"):
            found.append((node.lineno, "?"))
    # Name the variable where the read is `os.environ.get("NAME"...)` / `os.environ["NAME"]`.
    named = {}
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            target = node.args[0]
        elif isinstance(node, ast.Subscript):
            target = node.slice
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            named.setdefault(node.lineno, target.value)
    return [(line, named.get(line, name)) for line, name in found]


def test_no_module_but_config_reads_the_environment():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "config.py":
            continue
        for line, name in _environment_reads(path):
            offenders.append(f"torch_neuronx/{relative}:{line} ({name})")
    assert not offenders, "read through torch_neuronx.config instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize("raw,expected", [
    ("1", True), ("true", True), ("True", True), ("TRUE", True), (" 1 ", True),
    ("0", False), ("false", False), ("False", False), ("FALSE", False), (" 0", False),
])
def test_flag_spellings(raw, expected):
    assert config.parse_flag("X", raw) is expected


@pytest.mark.parametrize("raw", ["yes", "2", "on", "enabled"])
def test_unknown_flag_value_is_an_error_naming_the_variable(raw):
    with pytest.raises(ValueError, match=rf"TORCH_NEURONX_X='{raw}': expected '0' or '1'"):
        config.parse_flag("TORCH_NEURONX_X", raw)


def test_every_flag_goes_through_the_one_parser():
    flags = [v for v in config.VARIABLES.values() if isinstance(v.default, bool) and not v.external]
    assert flags and all(v.parse is config.parse_flag for v in flags)


def test_mode_choices_are_the_extensions_names():
    """config spells the C++ core's mode names (it cannot import the extension)."""
    from torch_neuronx import _C

    assert set(config.FALLBACK_MODES) == set(dict(_C._fallback_modes))
    assert set(config.FP64_MODES) == set(dict(_C._fp64_modes))


@pytest.mark.parametrize("variable,raw", [("fallback_mode", " Silent "), ("fp64_mode", "NATIVE")])
def test_mode_choices_ignore_case_and_spaces(monkeypatch, variable, raw):
    declared = getattr(config, variable)
    monkeypatch.setenv(declared.name, raw)
    assert declared() == raw.strip().lower()


def test_unset_or_empty_means_the_default(monkeypatch):
    for name, variable in config.VARIABLES.items():
        monkeypatch.delenv(name, raising=False)
        assert variable() == variable.default_value(), name
        if not variable.external:
            monkeypatch.setenv(name, "  ")
            assert variable() == variable.default_value(), name


def test_accessors_read_the_environment_at_each_call(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "1")
    assert config.neff_disable_cache() is True
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "0")
    assert config.neff_disable_cache() is False
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "false")
    assert config.disable_fallback_execution() is False
    monkeypatch.delenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION")
    assert config.disable_fallback_execution() is True
    monkeypatch.setenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "yes")
    with pytest.raises(ValueError, match="TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY='yes'"):
        config.dynamo_disable_cpu_autocopy()


def test_cache_dir_default_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert config.neff_cache_dir() == str(tmp_path / "torch_neuronx" / "neff")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert config.neff_cache_dir().endswith(".cache/torch_neuronx/neff")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", f" {tmp_path} ")
    assert config.neff_cache_dir() == str(tmp_path)


def test_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK='x' is not an integer"):
        config.local_rank()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")
    assert config.local_world_size() is None


def test_torch_compile_debug_is_read_as_pytorch_reads_it(monkeypatch):
    monkeypatch.setenv("TORCH_COMPILE_DEBUG", "true")
    assert config.torch_compile_debug() is False
    monkeypatch.setenv("TORCH_COMPILE_DEBUG", "1")
    assert config.torch_compile_debug() is True


def test_config_imports_no_jax():
    code = ("import sys, torch_neuronx.config as c; c.neff_cache_max_size(); "
            "print([m for m in sys.modules if m == 'jax' or m.startswith('jax.')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_bad_flag_at_import_fails_naming_the_variable():
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(PROJECT_PREFIXES)}
    env["TORCH_NEURONX_DISABLE_INTEGRATIONS"] = "maybe"
    out = subprocess.run([sys.executable, "-c", "import torch; print('started')"], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode != 0 and "started" not in out.stdout
    assert "TORCH_NEURONX_DISABLE_INTEGRATIONS='maybe': expected '0' or '1'" in out.stderr
