"""Environment variables as a user sets them (issue #17 item 7): each test runs a
fresh Python process with the variable set and checks what the user observes
(docs/env-vars.md says what each one does, and what is not emulated).

TORCH_NEURONX_LOG_LEVEL (names and AWS's 0-3), TORCH_NEURONX_LOG_FILE,
TORCH_NEURONX_METRICS_ENABLED, TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS,
NEURON_LAUNCH_BLOCKING.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROJECT_PREFIXES = ("TORCH_NEURONX_", "NEURON_")

# One compile of a small module, then the metrics as JSON on the last stdout line.
COMPILE = textwrap.dedent("""
    import json, torch, torch_neuronx
    m = torch.compile(torch.nn.Linear(4, 4).to('neuron'), backend='neuron')
    m(torch.randn(2, 4, device='neuron'))
    print(json.dumps(dict(torch_neuronx.get_dynamo_metrics())))  # the counters (dict(m))
""")
LOGGER_STATE = ("import logging, torch; log = logging.getLogger('torch_neuronx'); "
                "print(logging.getLevelName(log.level), [type(h).__name__ for h in log.handlers])")


def run(code: str, **variables: str) -> subprocess.CompletedProcess:
    """`python -c code` with the project's variables cleared, then `variables` set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(PROJECT_PREFIXES)}
    env.update(variables)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


# ------------------------------------------------------- TORCH_NEURONX_LOG_LEVEL


@pytest.mark.parametrize("value,level", [("0", "ERROR"), ("1", "WARNING"), ("2", "INFO"), ("3", "DEBUG"),
                                         ("debug", "DEBUG"), (" Warning ", "WARNING"), ("4", None),
                                         ("-1", None), ("loud", None)])
def test_log_level_numbers_are_aws_levels_and_names_still_work(value, level):
    from torch_neuronx import log

    assert log.level_name(value) == level


def test_log_level_set_at_import_configures_the_logger():
    """The same rule through the variable, as a user sets it (one process)."""
    out = run(LOGGER_STATE, TORCH_NEURONX_LOG_LEVEL="2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "INFO"
    assert "StreamHandler" in out.stdout


def test_log_level_3_shows_debug_lines_and_0_hides_info_lines():
    debug = run(COMPILE, TORCH_NEURONX_LOG_LEVEL="3")
    assert debug.returncode == 0, debug.stderr
    assert "[torch_neuronx.compiler DEBUG] received a forward graph" in debug.stderr
    assert "[torch_neuronx.compiler INFO] compiled the forward graph" in debug.stderr
    quiet = run(COMPILE, TORCH_NEURONX_LOG_LEVEL="0")
    assert quiet.returncode == 0, quiet.stderr
    assert "[torch_neuronx" not in quiet.stderr


@pytest.mark.parametrize("value", ["4"])
def test_unknown_log_level_warns_naming_the_variable_and_the_choices(value):
    out = run(LOGGER_STATE, TORCH_NEURONX_LOG_LEVEL=value)
    assert out.returncode == 0, out.stderr
    assert f"TORCH_NEURONX_LOG_LEVEL={value.upper()!r} is not a log level" in out.stderr
    assert "DEBUG, INFO, WARNING, ERROR, CRITICAL or 0 (ERROR), 1 (WARNING), 2 (INFO), 3 (DEBUG)" in out.stderr
    assert out.stdout.split()[0] == "NOTSET"  # left unconfigured


# -------------------------------------------------------- TORCH_NEURONX_LOG_FILE


def test_log_file_is_appended_to_instead_of_stderr(tmp_path):
    path = tmp_path / "neuron.log"
    path.write_text("line of an earlier run\n")
    out = run(COMPILE, TORCH_NEURONX_LOG_LEVEL="2", TORCH_NEURONX_LOG_FILE=str(path))
    assert out.returncode == 0, out.stderr
    text = path.read_text()
    assert text.startswith("line of an earlier run\n")  # appended, not truncated
    assert "[torch_neuronx.compiler INFO] compiled the forward graph" in text
    assert "[torch_neuronx" not in out.stderr


def test_log_file_without_a_level_logs_warnings(tmp_path):
    out = run(LOGGER_STATE, TORCH_NEURONX_LOG_FILE=str(tmp_path / "neuron.log"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "WARNING" and "FileHandler" in out.stdout


def test_log_file_that_cannot_be_opened_warns_and_logs_to_stderr(tmp_path):
    out = run(LOGGER_STATE, TORCH_NEURONX_LOG_LEVEL="INFO", TORCH_NEURONX_LOG_FILE=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert f"TORCH_NEURONX_LOG_FILE={str(tmp_path)!r} cannot be opened" in out.stderr
    assert "StreamHandler" in out.stdout and "FileHandler" not in out.stdout


# ------------------------------------------------- TORCH_NEURONX_METRICS_ENABLED


def test_metrics_are_collected_by_default_and_not_with_0():
    on = run(COMPILE)
    assert on.returncode == 0, on.stderr
    metrics = json.loads(on.stdout.splitlines()[-1])
    assert metrics["enabled"] is True and metrics["compiles"] >= 1 and metrics["forward_graphs"] >= 1
    off = run(COMPILE, TORCH_NEURONX_METRICS_ENABLED="0")
    assert off.returncode == 0, off.stderr
    metrics = json.loads(off.stdout.splitlines()[-1])
    assert metrics["enabled"] is False
    assert metrics["compiles"] == 0 and metrics["forward_graphs"] == 0 and metrics["compile_seconds"] == 0


def test_metrics_enabled_bad_value_is_an_error_naming_the_variable():
    out = run(COMPILE, TORCH_NEURONX_METRICS_ENABLED="yes")
    assert out.returncode != 0
    assert "TORCH_NEURONX_METRICS_ENABLED='yes': expected '0' or '1'" in out.stderr


# ------------------------------ TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS

FALLBACK_AND_ERROR = textwrap.dedent("""
    import torch, torch_neuronx
    x = torch.rand(4, device='neuron')
    torch.special.bessel_j0(x)          # outside the native op set: CPU fallback
    print('fallback', sorted(torch_neuronx.get_fallback_ops()))
    try:
        torch.ones(2, 3, device='neuron') @ torch.ones(2, 3, device='neuron')
    except RuntimeError as error:       # a native op's error is raised, never retried on the CPU
        print('raised', 'cannot be multiplied' in str(error))
""")


@pytest.mark.parametrize("value", [None, "0", "1"])
def test_fallback_only_for_unimplemented_ops(value):
    """Unimplemented ops fall back with every value; an op that fails raises with
    every value (the emulator never retries on the CPU: what 1 asks for)."""
    out = run(FALLBACK_AND_ERROR, **({} if value is None else
                                     {"TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS": value}))
    assert out.returncode == 0, out.stderr
    assert "special_bessel_j0" in out.stdout.splitlines()[0]
    assert out.stdout.splitlines()[1] == "raised True"


# Each call breaks one limit of Trainium's device kernels; prints "ok <values>" or "raised <message>".
DEVICE_LIMITS = textwrap.dedent("""
    import torch
    def attempt(name, call):
        try:
            print(name, 'ok', call().cpu().flatten().tolist())
        except RuntimeError as error:
            print(name, 'raised', str(error).replace(chr(10), ' '))
    m = torch.ones(3, 3, device='neuron')
    attempt('add_', lambda: m[:, 1].add_(2))                 # an in-place fast-path kernel
    attempt('exp_', lambda: m.t()[0].exp_())                  # an in-place alias kernel
    attempt('fill_', lambda: m[:, 2].fill_(5))                # data movement writes any view
    attempt('channels_last', lambda: torch.ones(1, 2, 1, 2, device='neuron').contiguous(
        memory_format=torch.channels_last))
    attempt('to_channels_last', lambda: torch.ones(1, 2, 1, 2).to('neuron', memory_format=torch.channels_last))
    attempt('cross_core', lambda: torch.zeros(2, device='neuron:1').copy_(torch.ones(2, device='neuron:0')))
    attempt('same_core', lambda: torch.zeros(2, device='neuron:0').copy_(torch.ones(2, device='neuron:0')))
""")
PREFIX = ("CPU fallback disabled because TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1. "
          "Operation aten::")


def test_device_kernel_limits_raise_only_when_fallback_is_only_for_unimplemented_ops():
    """Trainium retries these calls on the CPU unless the variable is 1; with 1 they raise in
    AWS's words (the limit, then what to do)."""
    lines = {}
    for value in ("0", "1"):
        out = run(DEVICE_LIMITS, TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=value)
        assert out.returncode == 0, out.stderr
        lines[value] = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    exp_ = lines["0"].pop("exp_").split(" ", 1)
    assert exp_[0] == "ok" and json.loads(exp_[1]) == pytest.approx([2.718281828] * 3)
    assert lines["0"] == {
        "add_": "ok [3.0, 3.0, 3.0]", "fill_": "ok [5.0, 5.0, 5.0]",
        "channels_last": "ok [1.0, 1.0, 1.0, 1.0]", "to_channels_last": "ok [1.0, 1.0, 1.0, 1.0]",
        "cross_core": "ok [1.0, 1.0]", "same_core": "ok [1.0, 1.0]"}
    strict = lines["1"]
    assert strict["add_"].startswith("raised " + PREFIX + "add_.Tensor failed to execute on Neuron: "
                                     "Cannot process non-contiguous tensors: 'self' is written in place")
    assert strict["exp_"].startswith("raised " + PREFIX + "exp_ failed to execute on Neuron: Cannot "
                                     "process non-contiguous tensors")
    assert "copy_ it into the view" in strict["exp_"]
    assert strict["fill_"] == "ok [5.0, 5.0, 5.0]"
    # Not emulated (docs/env-vars.md): Trainium refuses these two but accepts empty() and clone()
    # in channels-last, which allocate alike here.
    assert strict["channels_last"] == strict["to_channels_last"] == "ok [1.0, 1.0, 1.0, 1.0]"
    assert strict["cross_core"].startswith("raised " + PREFIX + "copy_ failed to execute on Neuron: "
                                           "Device-to-device copy requires tensors on same Neuron core, "
                                           "got neuron:1 and neuron:0")
    assert strict["same_core"] == "ok [1.0, 1.0]"


# ------------------------------------------------------------ NEURON_LAUNCH_BLOCKING

ERROR_AT_LAUNCH = textwrap.dedent("""
    import torch
    a = torch.ones(2, 3, device='neuron')
    try:
        c = a @ a                       # the error comes from this call, not from a later synchronize
    except RuntimeError:
        print('raised at launch')
""")


@pytest.mark.parametrize("value", ["0", "1"])
def test_launch_blocking_errors_are_raised_by_the_launching_call(value):
    out = run(ERROR_AT_LAUNCH, NEURON_LAUNCH_BLOCKING=value)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "raised at launch"


@pytest.mark.parametrize("name", ["NEURON_LAUNCH_BLOCKING", "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS"])
def test_bad_value_read_at_import_fails_naming_the_variable(name):
    out = run("import torch; print('started')", **{name: "on"})
    assert out.returncode != 0 and "started" not in out.stdout
    assert f"{name}='on': expected '0' or '1'" in out.stderr
