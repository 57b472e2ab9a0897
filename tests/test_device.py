"""Devices and instance profiles (issue item 2), logical NeuronCores (issue #17).

The runtime is sized from the environment when torch_neuronx is imported, so
every variation of TORCH_NEURONX_INSTANCE / NEURON_LOGICAL_NC_CONFIG /
NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES / TORCH_DEVICE_BACKEND_AUTOLOAD
runs in a fresh interpreter. Those interpreters
are started together (module fixture) so their start-up overlaps.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

import torch_neuronx
from torch_neuronx.neuron import profiles

GiB = 1024**3
RUNTIME_ENV = (
    "TORCH_NEURONX_INSTANCE", "NEURON_RT_VISIBLE_CORES", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_NUM_CORES",
    "TORCH_DEVICE_BACKEND_AUTOLOAD", "NEURON_LAUNCH_BLOCKING", "TORCH_NEURONX_FALLBACK", "TORCH_NEURONX_FP64",
)
ENV_IS_DEFAULT = not any(os.environ.get(name) for name in RUNTIME_ENV[:4])


def _visible() -> list[int]:
    return profiles.visible_cores(profiles.active_profile())


needs_two = pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs 2 NeuronCores")


@pytest.fixture(autouse=True)
def _on_core_0():
    torch.neuron.set_device(0)
    yield
    torch.neuron.set_device(0)


# ----------------------------------------------------------------- profiles
def test_profile_table_matches_trainium_figures():
    # docs/hardware-figures.md#chip-figures: trn2 chip 96 GiB / 4 logical cores (LNC=2); trn3 chip 144 GiB / 4;
    # trn2.48xlarge has 16 chips = 64 logical cores. trn1: 2 NeuronCore-v2 and 32 GiB per chip.
    expected = {
        "trn2.3xlarge": (4, 96 * GiB // 4, "NeuronCore-v3", "trn2"),
        "trn2.48xlarge": (64, 96 * GiB // 4, "NeuronCore-v3", "trn2"),
        "trn3.3xlarge": (4, 144 * GiB // 4, "NeuronCore-v4", "trn3"),
        "trn3.48xlarge": (64, 144 * GiB // 4, "NeuronCore-v4", "trn3"),
        "trn1.2xlarge": (2, 32 * GiB // 2, "NeuronCore-v2", "trn1"),
        "trn1.32xlarge": (32, 32 * GiB // 2, "NeuronCore-v2", "trn1"),
    }
    assert set(profiles.PROFILES) == set(expected)
    for name, (cores, hbm, generation, platform) in expected.items():
        profile = profiles.PROFILES[name]
        assert (profile.num_cores, profile.hbm_per_core, profile.core_generation, profile.platform) == (
            cores, hbm, generation, platform), name
    assert profiles.DEFAULT_INSTANCE == "trn2.3xlarge"
    assert profiles.PROFILES["trn2.3xlarge"].hbm_per_core == 24 * GiB


def test_active_profile_reads_environment(monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_INSTANCE", raising=False)
    assert profiles.active_profile().name == "trn2.3xlarge"
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE", "")
    assert profiles.active_profile().name == "trn2.3xlarge"
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE", " trn2.48xlarge ")
    assert profiles.active_profile().num_cores == 64
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE", "trn1.2xlarge")
    assert profiles.active_profile().core_generation == "NeuronCore-v2"


def test_unknown_instance_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE", "trn2.huge")
    with pytest.raises(ValueError) as info:
        profiles.active_profile()
    message = str(info.value)
    assert "TORCH_NEURONX_INSTANCE='trn2.huge'" in message
    for name in profiles.PROFILES:
        assert name in message


@pytest.mark.parametrize(
    "spec, total, expected",
    [
        (None, 4, [0, 1, 2, 3]),
        ("", 4, [0, 1, 2, 3]),
        ("0-1", 4, [0, 1]),
        ("2", 4, [2]),
        ("0,2-3", 4, [0, 2, 3]),
        (" 3 , 1 ", 4, [3, 1]),
        ("2-2", 4, [2]),
        ("60-63", 64, [60, 61, 62, 63]),
    ],
)
def test_parse_visible_cores(spec, total, expected):
    assert profiles.parse_visible_cores(spec, total) == expected


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("abc", "is not valid"),
        ("3-1", "is not valid"),
        ("-1", "is not valid"),
        ("1,,2", "is not valid"),
        ("0-x", "is not valid"),
        ("4", "names core 4"),
        ("0-4", "names core 4"),
        ("1,1", "names a core twice"),
        ("0-2,1", "names a core twice"),
    ],
)
def test_bad_visible_cores_are_clear_errors(spec, fragment):
    with pytest.raises(ValueError) as info:
        profiles.parse_visible_cores(spec, 4)
    assert f"NEURON_RT_VISIBLE_CORES={spec!r}" in str(info.value)
    assert fragment in str(info.value)


# ------------------------------------------------------------ this process
def test_device_count_follows_profile():
    visible = _visible()
    assert torch.neuron.device_count() == len(visible)
    assert torch_neuronx.device_count() == len(visible)
    assert torch.neuron.is_available() and torch_neuronx.is_available()
    if ENV_IS_DEFAULT:
        assert torch.neuron.device_count() == 4


def test_device_module_registration():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.get_device_module("neuron") is torch.neuron
    assert torch.neuron.device_count is torch_neuronx.device_count
    assert torch.device("neuron:1") == torch.device("neuron", 1)


def test_device_properties():
    profile = profiles.active_profile()
    visible = _visible()
    for index in range(torch.neuron.device_count()):
        props = torch.neuron.get_device_properties(index)
        assert props.name == profile.core_generation
        assert props.core_generation == profile.core_generation
        assert props.instance == profile.name
        assert props.platform == profile.platform
        assert props.total_memory == profile.hbm_per_core
        assert props.physical_core == visible[index]
        assert props.major == int(profile.core_generation[-1])
        assert torch.neuron.get_device_capability(index) == (props.major, props.minor)
        assert torch.neuron.mem_get_info(index)[1] == props.total_memory
        # every spelling of the device resolves to the same core
        for spelling in (f"neuron:{index}", torch.device("neuron", index)):
            assert torch.neuron.get_device_properties(spelling) == props
    if ENV_IS_DEFAULT:
        props = torch.neuron.get_device_properties(0)
        assert (props.name, props.total_memory, props.instance) == (
            "NeuronCore-v3", 24 * GiB, "trn2.3xlarge")
    assert torch.neuron.get_device_properties() == torch.neuron.get_device_properties(
        torch.neuron.current_device())
    assert "total_memory=" in repr(torch.neuron.get_device_properties(0))


def test_device_properties_of_a_missing_core():
    """TorchNeuron's ValueError (CUDA raises AssertionError), for any index that names no core."""
    count = torch.neuron.device_count()
    for index in (count, count + 10, -1, 2**32):
        with pytest.raises(ValueError, match=rf"^Invalid device id: {index}\. Valid range is 0 to "
                                             rf"{count - 1} .*NEURON_RT_VISIBLE_CORES"):
            torch.neuron.get_device_properties(index)
    with pytest.raises(ValueError, match="Expected a neuron device"):
        torch.neuron.get_device_properties("cpu")


def test_device_name_is_the_device_string():
    """TorchNeuron names a device "neuron:<index>"; the core's generation is in its properties."""
    assert torch.neuron.get_device_name() == f"neuron:{torch.neuron.current_device()}"
    assert torch.neuron.get_device_name(0) == "neuron:0"
    assert torch_neuronx.get_device_name(torch.device("neuron", 0)) == "neuron:0"
    for bad in ("invalid", "neuron:0", 1.0):
        with pytest.raises(ValueError, match="^Incorrect device argument found, expected "
                                             "torch.device or int type, found <class"):
            torch.neuron.get_device_name(bad)
    with pytest.raises(ValueError, match="Expected a neuron device, got cpu"):
        torch.neuron.get_device_name(torch.device("cpu"))


@needs_two
def test_device_name_of_another_core():
    assert torch.neuron.get_device_name(1) == "neuron:1"
    with torch.neuron.device(1):
        assert torch.neuron.get_device_name() == "neuron:1"


def test_properties_keep_the_configured_profile(monkeypatch):
    # The runtime was sized at import: later environment changes do not apply.
    before = [torch.neuron.get_device_properties(i) for i in range(torch.neuron.device_count())]
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE", "trn1.2xlarge")
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "1")
    after = [torch.neuron.get_device_properties(i) for i in range(torch.neuron.device_count())]
    assert after == before


@needs_two
def test_set_device_and_current_device():
    assert torch.neuron.current_device() == 0
    try:
        torch.neuron.set_device(1)
        assert torch.neuron.current_device() == 1
        assert torch_neuronx.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
        assert torch.ones(2, device="neuron").device == torch.device("neuron", 1)
        torch.neuron.set_device("neuron:0")
        assert torch.neuron.current_device() == 0
        torch.neuron.set_device(torch.device("neuron", 1))
        assert torch.neuron.current_device() == 1
    finally:
        torch.neuron.set_device(0)
    assert torch.ones(2, device="neuron").device == torch.device("neuron", 0)


def test_set_device_rejects_bad_devices():
    """TorchNeuron's errors: set_device's ValueError, the runtime's RuntimeError for a tensor or
    a stream on a core that does not exist (both then name the variables that set the count)."""
    count = torch.neuron.device_count()
    with pytest.raises(ValueError, match=rf"^Invalid device id: {count}\. Valid range is 0 to "
                                         rf"{count - 1} .*NEURON_RT_VISIBLE_CORES"):
        torch.neuron.set_device(count)
    with pytest.raises(ValueError, match="Expected a neuron device"):
        torch.neuron.set_device("cpu")
    out_of_range = (rf"^Device index {count + 16} is out of range\. Valid range is 0 to {count - 1} "
                    r"for this process .*NEURON_RT_VISIBLE_CORES")
    with pytest.raises(RuntimeError, match=out_of_range):
        torch.ones(1, device=f"neuron:{count + 16}")
    with pytest.raises(RuntimeError, match=out_of_range):
        torch.tensor([2.0]).to(f"neuron:{count + 16}")
    with pytest.raises(RuntimeError, match=out_of_range):
        torch.neuron.Stream(device=count + 16)
    assert torch.neuron.current_device() == 0


def test_device_context_manager_rejects_a_missing_core():
    count = torch.neuron.device_count()
    context = torch.neuron.device(count)
    with pytest.raises(ValueError, match=rf"^Invalid device id: {count}\."):
        context.__enter__()
    with pytest.raises(ValueError, match=rf"^Invalid device id: {count}\."):
        with torch_neuronx.device(f"neuron:{count}"):
            pass
    assert torch.neuron.current_device() == 0


@needs_two
def test_device_context_manager_nests_and_restores():
    last = torch.neuron.device_count() - 1
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        with torch.neuron.device(f"neuron:{last}"):
            assert torch.neuron.current_device() == last
            assert torch.empty(1, device="neuron").device.index == last
        assert torch.neuron.current_device() == 1
        with torch.neuron.device(None):
            assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0
    with pytest.raises(KeyError):
        with torch.neuron.device(1):
            raise KeyError("boom")
    assert torch.neuron.current_device() == 0
    with torch_neuronx.device(torch.device("neuron", 1)):
        assert torch.neuron.current_device() == 1


@needs_two
def test_device_of():
    x = torch.zeros(2, device="neuron:1")
    with torch.neuron.device_of(x):
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0
    with torch.neuron.device_of(torch.zeros(2)):  # a CPU tensor changes nothing
        assert torch.neuron.current_device() == 0


def test_torch_accelerator_sees_neuron():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.current_accelerator(check_available=True).type == "neuron"
    assert torch.accelerator.device_count() == torch.neuron.device_count()


@needs_two
def test_torch_accelerator_device_index():
    try:
        torch.accelerator.set_device_index(1)
        assert torch.neuron.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
    finally:
        torch.accelerator.set_device_index(0)
    with torch.accelerator.device_index(1):
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0


def test_tensors_live_on_every_core():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    expected = (base * 2 + 1) @ base.T
    for index in range(min(torch.neuron.device_count(), 4)):
        x = base.to(f"neuron:{index}")
        assert x.device == torch.device("neuron", index)
        assert x.get_device() == index and x.is_neuron
        y = (x * 2 + 1) @ x.T
        assert y.device == torch.device("neuron", index)
        torch.testing.assert_close(y.cpu(), expected, rtol=1e-6, atol=1e-5)


@needs_two
def test_ops_run_on_the_tensor_core_not_the_current_one():
    x = torch.full((4,), 3.0, device="neuron:1")
    assert torch.neuron.current_device() == 0
    y = torch.sqrt(x) + x
    assert y.device == torch.device("neuron", 1)
    torch.testing.assert_close(y.cpu(), torch.sqrt(torch.full((4,), 3.0)) + 3.0)


@needs_two
def test_mixing_cores_in_one_op_is_an_error():
    a = torch.ones(2, device="neuron:0")
    b = torch.ones(2, device="neuron:1")
    with pytest.raises(RuntimeError, match="same device"):
        a + b


@needs_two
def test_copy_between_cores():
    x = torch.arange(6, dtype=torch.float32, device="neuron:1")
    y = x.to("neuron:0")
    assert y.device == torch.device("neuron", 0)
    torch.testing.assert_close(y.cpu(), torch.arange(6, dtype=torch.float32))
    z = torch.empty(6, device="neuron:0").copy_(x)
    torch.testing.assert_close(z.cpu(), torch.arange(6, dtype=torch.float32))


@needs_two
def test_current_device_is_per_thread():
    seen = {}

    def worker():
        seen["start"] = torch.neuron.current_device()
        torch.neuron.set_device(1)
        seen["set"] = torch.neuron.current_device()
        seen["tensor"] = torch.ones(1, device="neuron").device.index

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"start": 0, "set": 1, "tensor": 1}
    assert torch.neuron.current_device() == 0


def test_generated_tensor_and_module_methods():
    x = torch.ones(3)
    assert x.neuron().device == torch.device("neuron", 0)
    assert x.neuron().is_neuron and not x.is_neuron
    assert torch.nn.Linear(2, 2).neuron().weight.device.type == "neuron"
    assert x.untyped_storage().neuron().device.type == "neuron"


def test_public_names_follow_one_rule():
    """torch_neuronx.* mirrors torch.neuron's __all__ (the same objects), plus the backend's
    own functions; every name AWS documents for torch_neuronx is among them."""
    assert set(torch_neuronx.__all__) == set(torch.neuron.__all__) | set(torch_neuronx.OWN_NAMES)
    for name in torch.neuron.__all__:
        assert getattr(torch_neuronx, name) is getattr(torch.neuron, name)
    for name in torch_neuronx.OWN_NAMES:
        assert callable(getattr(torch_neuronx, name)) and not hasattr(torch.neuron, name)
    documented = {
        "device_count", "current_device", "set_device", "get_device_properties", "synchronize",
        "current_stream", "default_stream", "set_stream", "stream", "Stream", "Event", "device",
        "empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
        "max_memory_reserved", "memory_stats", "memory_summary", "reset_peak_memory_stats",
        "get_fallback_ops", "get_executed_ops", "clear_op_tracking", "nki_op", "wrap_nki",
        "get_dynamo_metrics", "reset_dynamo_metrics",
    }
    assert documented | {"is_available"} <= set(torch_neuronx.__all__)


def test_import_is_idempotent():
    count = torch.neuron.device_count()
    x = torch.arange(4.0, device="neuron")
    import torch_neuronx as again

    assert again is torch_neuronx
    reloaded = importlib.reload(torch_neuronx)
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert reloaded.device_count() == count == torch.neuron.device_count()
    torch.testing.assert_close((x + 1).cpu(), torch.arange(4.0) + 1)


# ------------------------------------------------------- fresh interpreters
# PROBE runs in a process where torch_neuronx was not imported yet, with one
# configuration in os.environ; it prints one JSON line.
PROBE = r"""
def probe():
    import torch
    import torch_neuronx  # no-op under autoload; sizes the runtime otherwise
    out = {}
    n = torch.neuron
    out["count"] = n.device_count()
    props = [n.get_device_properties(i) for i in range(n.device_count())]
    out["props"] = [[p.name, p.total_memory, p.instance, p.core_generation, p.physical_core] for p in props]
    out["lnc"] = sorted({p.lnc for p in props})
    out["repr"] = repr(props[0])
    try:  # one byte over the core's HBM: refused before any host memory is taken
        torch.empty(props[0].total_memory + 1, dtype=torch.uint8, device="neuron:0")
        out["over_capacity"] = "no error"
    except torch.OutOfMemoryError as error:
        out["over_capacity"] = str(error).splitlines()[0]
    last = n.device_count() - 1
    x = torch.arange(6, dtype=torch.float32, device=f"neuron:{last}")
    y = (x * x).sum()
    out["last_device"] = str(y.device)
    out["value"] = y.item()
    try:
        torch.ones(1, device=f"neuron:{n.device_count()}")
        out["beyond"] = "no error"
    except RuntimeError as error:
        out["beyond"] = str(error)
    return out
"""

# `import torch` alone, as a user would: autoload must bring the device.
AUTOLOAD = PROBE + r"""
import json, sys
import torch
autoloaded = "torch_neuronx" in sys.modules and hasattr(torch, "neuron")
x = torch.randn(2, device="neuron")
result = probe()
result.update(autoloaded=autoloaded, randn_device=str(x.device))
print(json.dumps(result))
"""

# One interpreter with autoload disabled checks that the device is absent, then
# forks one child per configuration; each child sets its environment and imports
# torch_neuronx (which reads it then), so torch is imported once for all of them.
CONFIGS = {
    "trn2.48xlarge": {"TORCH_NEURONX_INSTANCE": "trn2.48xlarge"},
    "trn3_cores_2_3": {"TORCH_NEURONX_INSTANCE": "trn3.3xlarge", "NEURON_RT_VISIBLE_CORES": "2-3"},
    "core_2": {"NEURON_RT_VISIBLE_CORES": "2"},
    "trn1": {"TORCH_NEURONX_INSTANCE": "trn1.2xlarge", "NEURON_RT_VISIBLE_CORES": "0-1"},
    "bad_instance": {"TORCH_NEURONX_INSTANCE": "trn9.tiny"},
    "bad_cores": {"NEURON_RT_VISIBLE_CORES": "0-7"},
    "lnc1": {"NEURON_LOGICAL_NC_CONFIG": "1"},
    "lnc1_trn3_48_num_cores": {"TORCH_NEURONX_INSTANCE": "trn3.48xlarge", "NEURON_LOGICAL_NC_CONFIG": "1",
                               "NEURON_RT_NUM_CORES": "127"},
    "num_cores_and_visible": {"NEURON_RT_NUM_CORES": "1", "NEURON_RT_VISIBLE_CORES": "1-3"},
    "lnc1_trn1": {"TORCH_NEURONX_INSTANCE": "trn1.2xlarge", "NEURON_LOGICAL_NC_CONFIG": "1"},
    "lnc2_trn1": {"TORCH_NEURONX_INSTANCE": "trn1.2xlarge", "NEURON_LOGICAL_NC_CONFIG": "2"},
    "bad_lnc": {"NEURON_LOGICAL_NC_CONFIG": "4"},
    "bad_num_cores": {"NEURON_RT_NUM_CORES": "5"},
    "autoload_off": {},
}
ZYGOTE = PROBE + r"""
import json, os, sys
import torch
configs = json.loads(sys.argv[1])
results = {"parent": {"autoloaded": "torch_neuronx" in sys.modules, "has_neuron": hasattr(torch, "neuron")}}
try:
    torch.randn(2, device="neuron")
    results["parent"]["randn"] = "no error"
except RuntimeError as error:
    results["parent"]["randn"] = str(error)
for name, env in configs.items():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.environ.update(env)
        try:
            out = {"ok": probe()}
        except BaseException as error:
            out = {"error": f"{type(error).__name__}: {error}"}
        os.write(write_end, json.dumps(out).encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    results[name] = json.loads(b"".join(chunks))
print(json.dumps(results))
"""


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_ENV}
    env.update(extra)
    return env


@pytest.fixture(scope="module", autouse=True)
def _interpreters():
    """Starts both interpreters before the first test of the module, so their
    start-up overlaps the in-process tests; killed if still running at the end."""
    procs = {
        "autoload": subprocess.Popen(
            [sys.executable, "-c", AUTOLOAD], env=_clean_env({}),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ),
        "zygote": subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, json.dumps(CONFIGS)],
            env=_clean_env({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ),
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def fresh(_interpreters):
    """{"autoload": json, "zygote": json} once both interpreters finished."""
    results = {}
    for name, proc in _interpreters.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        results[name] = json.loads(out.strip().splitlines()[-1])
    return results


def _config(fresh, name):
    result = fresh["zygote"][name]
    assert "ok" in result, result.get("error")
    return result["ok"]


def test_autoload_with_default_profile(fresh):
    # `import torch` alone makes the device available: no `import torch_neuronx`.
    data = fresh["autoload"]
    assert data["autoloaded"]
    assert data["randn_device"] == "neuron:0"
    assert data["count"] == 4
    assert data["props"] == [
        ["NeuronCore-v3", 24 * GiB, "trn2.3xlarge", "NeuronCore-v3", i] for i in range(4)
    ]
    assert data["last_device"] == "neuron:3"
    assert data["value"] == float(sum(i * i for i in range(6)))
    assert "Device index 4 is out of range" in data["beyond"]


def test_autoload_can_be_disabled(fresh):
    parent = fresh["zygote"]["parent"]
    assert not parent["autoloaded"] and not parent["has_neuron"]
    assert "neuron" in parent["randn"]  # the device string is not known yet
    data = _config(fresh, "autoload_off")  # an explicit import then brings the device
    assert data["count"] == 4 and data["last_device"] == "neuron:3"


def test_trn2_48xlarge_has_64_cores(fresh):
    data = _config(fresh, "trn2.48xlarge")
    assert data["count"] == 64
    assert [p[4] for p in data["props"]] == list(range(64))
    assert {p[1] for p in data["props"]} == {24 * GiB}
    assert {p[2] for p in data["props"]} == {"trn2.48xlarge"}
    assert data["last_device"] == "neuron:63"
    assert data["value"] == 55.0


def test_visible_cores_on_trn3(fresh):
    data = _config(fresh, "trn3_cores_2_3")
    assert data["count"] == 2
    assert data["props"] == [
        ["NeuronCore-v4", 36 * GiB, "trn3.3xlarge", "NeuronCore-v4", core] for core in (2, 3)
    ]
    assert data["last_device"] == "neuron:1"
    assert "Device index 2 is out of range" in data["beyond"]


def test_single_visible_core(fresh):
    data = _config(fresh, "core_2")
    assert data["count"] == 1
    assert data["props"] == [["NeuronCore-v3", 24 * GiB, "trn2.3xlarge", "NeuronCore-v3", 2]]
    assert data["last_device"] == "neuron:0"
    assert "Device index 1 is out of range" in data["beyond"]


def test_trn1_profile(fresh):
    data = _config(fresh, "trn1")
    assert data["count"] == 2
    assert [p[:2] for p in data["props"]] == [["NeuronCore-v2", 16 * GiB]] * 2


def test_bad_instance_fails_at_import_with_a_clear_message(fresh):
    error = fresh["zygote"]["bad_instance"].get("error", "")
    assert error.startswith("ValueError")
    assert "TORCH_NEURONX_INSTANCE='trn9.tiny' is not a known instance profile" in error
    assert "trn2.3xlarge" in error


def test_bad_visible_cores_fail_at_import_with_a_clear_message(fresh):
    error = fresh["zygote"]["bad_cores"].get("error", "")
    assert error.startswith("ValueError")
    assert "NEURON_RT_VISIBLE_CORES='0-7' names core 4" in error


# ------------------------------------------------- logical NeuronCores (#17)
def test_default_lnc_is_reported_and_caps_memory(fresh):
    data = fresh["autoload"]
    assert data["lnc"] == [2]
    assert data["repr"] == ("NeuronDeviceProperties(name='NeuronCore-v3', total_memory=24576MB, "
                            "instance='trn2.3xlarge', core_generation='NeuronCore-v3', physical_core=0, lnc=2)")
    assert "NeuronCore 0 has a total capacity of 24.00 GiB" in data["over_capacity"]


def test_lnc1_doubles_the_cores_and_halves_their_hbm(fresh):
    data = _config(fresh, "lnc1")
    assert data["count"] == 8 and data["lnc"] == [1]
    assert data["props"] == [["NeuronCore-v3", 12 * GiB, "trn2.3xlarge", "NeuronCore-v3", i] for i in range(8)]
    assert data["last_device"] == "neuron:7" and data["value"] == 55.0
    assert "Device index 8 is out of range" in data["beyond"]
    assert "NeuronCore 0 has a total capacity of 12.00 GiB" in data["over_capacity"]


def test_num_cores_takes_the_first_logical_cores(fresh):
    # 128 logical cores at LNC=1, the first 127 (a process's most: PyTorch's device index is 8-bit).
    data = _config(fresh, "lnc1_trn3_48_num_cores")
    assert data["count"] == 127 and data["lnc"] == [1]
    assert [p[4] for p in data["props"]] == list(range(127))
    assert {(p[1], p[2]) for p in data["props"]} == {(18 * GiB, "trn3.48xlarge")}
    assert data["last_device"] == "neuron:126"
    assert "Valid range is 0 to 126 for this process (it sees 127 NeuronCore(s)" in data["beyond"]


def test_visible_cores_win_over_num_cores(fresh):
    data = _config(fresh, "num_cores_and_visible")
    assert data["count"] == 3 and [p[4] for p in data["props"]] == [1, 2, 3]


def test_trn1_takes_lnc1_only(fresh):
    data = _config(fresh, "lnc1_trn1")
    assert data["count"] == 2 and data["lnc"] == [1]
    error = fresh["zygote"]["lnc2_trn1"].get("error", "")
    assert error.startswith("ValueError: NEURON_LOGICAL_NC_CONFIG=2 is not available on trn1.2xlarge")
    assert "trn1 accepts only 1" in error


def test_bad_lnc_and_num_cores_fail_at_import_naming_the_variable(fresh):
    error = fresh["zygote"]["bad_lnc"].get("error", "")
    assert error.startswith("ValueError: NEURON_LOGICAL_NC_CONFIG='4' is not valid: use 1 ")
    error = fresh["zygote"]["bad_num_cores"].get("error", "")
    assert error == ("ValueError: NEURON_RT_NUM_CORES=5 asks for more NeuronCores than trn2.3xlarge at "
                     "LNC=2 has (4): use 1 to 4, or 0 for all of them.")
