"""The torch-neuronx command (torch_neuronx/cli): exit codes, `info`'s report
checked field by field against torch_neuronx's own APIs and profiles table,
the compile cache it reports, and that it does not import JAX."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
import tomllib
from importlib import metadata

import pytest
import torch

import torch_neuronx
from torch_neuronx import cli, config, integrations, neuron, patching
from torch_neuronx.cli import info
from torch_neuronx.neuron import profiles

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "tools.md"


def _env(tmp_path, **variables) -> dict:
    """The test process's environment without the project's variables (each
    case sets its own), with a compile cache of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(tmp_path / "cache")
    env.update(variables)
    return env


def _command(args, env, code=None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "torch_neuronx", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def _info_json(env) -> dict:
    out = _command(["info", "--json"], env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# ------------------------------------------------------------- info --json


CASES = {
    "default": ({}, config.DEFAULT_INSTANCE),
    # LNC=1 from the variable; NEURON_RT_VISIBLE_CORES wins over NEURON_RT_NUM_CORES.
    "trn3-lnc1-visible-1-2": ({"TORCH_NEURONX_INSTANCE": "trn3.3xlarge", "NEURON_LOGICAL_NC_CONFIG": "1",
                               "NEURON_RT_VISIBLE_CORES": "1-2", "NEURON_RT_NUM_CORES": "5",
                               "TORCH_NEURONX_FALLBACK": "silent", "TORCH_NEURONX_FP64": "native"},
                              "trn3.3xlarge"),
    "trn1-num-cores-1": ({"TORCH_NEURONX_INSTANCE": "trn1.2xlarge", "NEURON_RT_NUM_CORES": "1"}, "trn1.2xlarge"),
}


@pytest.mark.parametrize("case", CASES)
def test_info_json_matches_the_profile_and_policies(case, tmp_path):
    variables, name = CASES[case]
    report = _info_json(_env(tmp_path, **variables))
    lnc = variables.get("NEURON_LOGICAL_NC_CONFIG")
    profile = profiles.profile(name, None if lnc is None else int(lnc))
    assert report["schema_version"] == info.SCHEMA_VERSION == 1
    _check_instance(report["instance"], profile, "TORCH_NEURONX_INSTANCE" if variables else "default",
                    "NEURON_LOGICAL_NC_CONFIG" if lnc else "default")
    _check_visible(report["visible_cores"], profile, variables)
    assert report["policies"] == {
        "fallback": variables.get("TORCH_NEURONX_FALLBACK", config.fallback_mode.default),
        "fp64": variables.get("TORCH_NEURONX_FP64", config.fp64_mode.default),
    }
    _check_versions(report["versions"])
    _check_integrations(report["integrations"])
    assert report["compile_cache"] == {
        "enabled": True, "source": "TORCH_NEURONX_NEFF_CACHE_DIR", "directory": str(tmp_path / "cache"),
        "entries": 0, "size_bytes": 0, "max_size_bytes": config.neff_cache_max_size.default,
    }


def _check_instance(instance: dict, profile: profiles.InstanceProfile, source: str, lnc_source: str) -> None:
    chip = {"trn1": (2, 32 * 2**30), "trn2": (8, 96 * 2**30), "trn3": (8, 144 * 2**30)}[profile.platform]
    assert instance == {
        "type": profile.name, "source": source, "platform": profile.platform,
        "core_generation": profile.core_generation, "chips": profile.chips,
        "logical_cores": profile.chips * chip[0] // profile.lnc, "physical_cores": profile.chips * chip[0],
        "lnc": profile.lnc, "lnc_source": lnc_source,
        "hbm_per_logical_core_bytes": chip[1] * profile.lnc // chip[0],
        "hbm_total_bytes": chip[1] * profile.chips,
        "fp8": profile.platform == "trn3",
    }
    # The emulator's core generation names: v2 on trn1, v3 on trn2, v4 on trn3.
    assert instance["core_generation"] == {"trn1": "NeuronCore-v2", "trn2": "NeuronCore-v3",
                                           "trn3": "NeuronCore-v4"}[profile.platform]
    if profile == neuron._PROFILE:  # the test process runs the same profile: the C++ core agrees
        assert instance["hbm_per_logical_core_bytes"] == torch.neuron.get_device_properties(0).total_memory


def _check_visible(visible: dict, profile: profiles.InstanceProfile, variables: dict) -> None:
    spec, count = variables.get("NEURON_RT_VISIBLE_CORES"), variables.get("NEURON_RT_NUM_CORES")
    cores = profiles.parse_visible_cores(spec, profile.num_cores) if spec else \
        list(range(int(count) if count else profile.num_cores))
    source = "NEURON_RT_VISIBLE_CORES" if spec else ("NEURON_RT_NUM_CORES" if count else "all")
    assert visible == {"cores": cores, "count": len(cores), "source": source,
                       "hbm_bytes": len(cores) * profile.hbm_per_core}


def _check_versions(versions: dict) -> None:
    assert versions == {
        "torch_neuronx": torch_neuronx.__version__, "torch": torch.__version__,
        "jax": metadata.version("jax"), "jaxlib": metadata.version("jaxlib"),
        "python": "{}.{}.{}".format(*sys.version_info[:3]),
    }


def _check_integrations(report: dict) -> None:
    assert report["enabled"] is True
    assert set(report["waiting"]) <= set(integrations.registered_patches())
    # The patches a fresh process applies at import are applied here too (with more since).
    here = {(p.target, p.by, p.why) for p in patching.applied()}
    reported = [(p["target"], p["by"], p["why"]) for p in report["patches_applied"]]
    assert reported and set(reported) <= here


def test_info_fields_are_the_documented_ones(capsys):
    """Every field of the JSON object is in docs/tools.md's table, and only those."""
    assert cli.main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    info_section = DOC.read_text().split("\n## info\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", info_section, re.MULTILINE))
    assert set(_fields(report)) == documented


def _fields(value: dict, prefix: str = ""):
    for key, item in value.items():
        if isinstance(item, dict):
            yield from _fields(item, f"{prefix}{key}.")
        else:
            yield prefix + key


# ------------------------------------------------------------- compile cache


def test_info_counts_the_entries_a_compile_wrote(tmp_path):
    """One tiny compiled function, then info in the same process: the entries
    and bytes are the cache directory's entry files."""
    code = (
        "import torch\n"
        "from torch_neuronx.cli import main\n"
        "f = torch.compile(lambda x: x * 2 + 1, backend='neuron')\n"
        "f(torch.ones(4, device='neuron'))\n"
        "raise SystemExit(main(['info', '--json']))\n"
    )
    out = _command([], _env(tmp_path), code=code)
    assert out.returncode == 0, out.stderr
    cache = json.loads(out.stdout)["compile_cache"]
    files = [p for p in (tmp_path / "cache").iterdir() if p.suffix in (".neff", ".aot")]
    assert files, "the compile wrote no cache entry"
    assert (cache["entries"], cache["size_bytes"]) == (len(files), sum(p.stat().st_size for p in files))


def _info_in_process(capsys) -> dict:
    assert cli.main(["info", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info_counts_a_prepared_cache_without_changing_it(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "a.neff").write_bytes(b"x" * 10)
    (folder / "b.aot").write_bytes(b"y" * 20)
    (folder / "notes.txt").write_text("not an entry")
    stale = folder / ".tmp-c.neff"  # a killed writer's temporary file: not an entry, and left alone
    stale.write_bytes(b"z" * 5)
    os.utime(stale, (time.time() - 7200,) * 2)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(folder))
    monkeypatch.delenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", raising=False)
    cache = _info_in_process(capsys)["compile_cache"]
    assert (cache["enabled"], cache["directory"], cache["entries"], cache["size_bytes"]) == \
        (True, str(folder), 2, 30)
    assert stale.exists()


def test_info_reports_a_disabled_cache(monkeypatch, capsys):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "1")
    cache = _info_in_process(capsys)["compile_cache"]
    assert cache == {"enabled": False, "source": "TORCH_NEURONX_NEFF_DISABLE_CACHE", "directory": None,
                     "entries": 0, "size_bytes": 0, "max_size_bytes": config.neff_cache_max_size()}
    assert cli.main(["info"]) == 0
    assert re.search(r"^compile cache +disabled", capsys.readouterr().out, re.MULTILINE)


# ------------------------------------------------------------- text output, JAX


def test_info_text_names_the_instance_and_hbm_without_importing_jax(tmp_path):
    code = (
        "import sys\n"
        "from torch_neuronx.cli import main\n"
        "rc = main(['info'])\n"
        "print('jax imported:', sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')),"
        " file=sys.stderr)\n"
        "raise SystemExit(rc)\n"
    )
    out = _command([], _env(tmp_path, TORCH_NEURONX_INSTANCE="trn3.3xlarge", NEURON_LOGICAL_NC_CONFIG="1"),
                   code=code)
    assert out.returncode == 0, out.stderr
    assert "jax imported: []" in out.stderr
    profile = profiles.profile("trn3.3xlarge", 1)
    lines = out.stdout.splitlines()
    assert re.match(r"instance +trn3\.3xlarge \(from TORCH_NEURONX_INSTANCE\)$", lines[1])
    hbm = next(line for line in lines if line.startswith("HBM "))
    assert hbm.split(None, 1)[1] == (f"{info.size(profile.hbm_per_core)} per logical core, "
                                     f"{info.size(profile.hbm_total)} total")
    cores = next(line for line in lines if line.startswith("cores "))
    assert cores.split(None, 1)[1] == "8 logical NeuronCore-v4, 8 physical (LNC=1, NEURON_LOGICAL_NC_CONFIG)"
    # The host's memory beside the emulated HBM: trn3.3xlarge's 144 GiB exceed any machine this runs on.
    host = next(line for line in lines if line.startswith("host memory "))
    assert re.search(r"GiB total, [\d.]+ \w+ available \(less than the visible cores' HBM", host), host


@pytest.mark.parametrize("count,text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                        (24 * 2**30, "24 GiB"), (10 * 2**40, "10 TiB")])
def test_size(count, text):
    assert info.size(count) == text


@pytest.mark.parametrize("cores,text", [([0, 1, 2, 3], "0-3"), ([1, 2], "1-2"), ([2], "2"),
                                        ([0, 2, 3], "0,2-3"), ([3, 1], "3,1")])
def test_core_ranges(cores, text):
    assert info.core_ranges(cores) == text
    assert profiles.parse_visible_cores(text, 8) == cores


# ------------------------------------------------------------- exit codes


def test_help_exits_0_and_lists_the_commands(tmp_path):
    out = _command(["--help"], _env(tmp_path))
    assert out.returncode == 0
    for name in cli.COMMANDS:
        assert re.search(rf"^\s+{name}\s", out.stdout, re.MULTILINE), name


def test_unknown_command_is_a_usage_error(tmp_path):
    out = _command(["nonsense"], _env(tmp_path))
    assert out.returncode == 2
    assert "invalid choice: 'nonsense'" in out.stderr


def test_usage_errors_in_process(capsys):
    assert cli.main([]) == 2  # a command is required
    assert cli.main(["info", "--nonsense"]) == 2
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"torch-neuronx {torch_neuronx.__version__}"


def test_bad_instance_is_one_line_and_exit_1(tmp_path):
    """Read when torch_neuronx is imported, before any command code runs."""
    out = _command(["info"], _env(tmp_path, TORCH_NEURONX_INSTANCE="trn9.huge"))
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert lines[0].startswith("torch-neuronx: error: TORCH_NEURONX_INSTANCE='trn9.huge'")
    assert "trn2.3xlarge" in lines[0]  # the fix: the known profiles


def test_bad_variable_read_by_the_command_is_one_line_and_exit_1(monkeypatch, capsys):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "maybe")
    assert cli.main(["info"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("torch-neuronx: error: TORCH_NEURONX_NEFF_DISABLE_CACHE='maybe'")


@pytest.mark.parametrize("argv0,orig_argv,expected", [
    ("/venv/bin/torch-neuronx", ["/venv/bin/python", "/venv/bin/torch-neuronx", "info"], True),
    ("-m", ["python", "-m", "torch_neuronx", "info"], True),
    ("-m", ["python", "-X", "importtime", "-mtorch_neuronx"], True),
    ("-m", ["python", "-m", "pytest"], False),  # another module importing torch
    ("/work/train.py", ["python", "/work/train.py"], False),
    ("-c", ["python", "-c", "import torch"], False),
])
def test_started_as_command(argv0, orig_argv, expected, monkeypatch):
    monkeypatch.setattr(sys, "argv", [argv0])
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert cli.started_as_command() is expected
    if not expected:  # other programs keep the import's ValueError
        cli.exit_if_command(ValueError("TORCH_NEURONX_INSTANCE='x'"))


def test_console_script_is_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["torch-neuronx"].partition(":")
    assert (module, name) == ("torch_neuronx.cli", "main")
    assert getattr(cli, name) is cli.main
