"""Logical NeuronCores (NEURON_LOGICAL_NC_CONFIG) and NEURON_RT_NUM_CORES: the pure
parsing and sizing functions, in this process. What a user sees in a fresh process
(device_count, total_memory, get_device_properties().lnc, the import errors) is checked by
tests/test_device.py's forked configurations and `torch-neuronx info` by tests/test_cli.py."""

from __future__ import annotations

import pytest

from torch_neuronx import config
from torch_neuronx.neuron import profiles

GiB = 1024**3
LNC_VARS = ("NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_NUM_CORES", "NEURON_RT_VISIBLE_CORES",
            "TORCH_NEURONX_INSTANCE")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in LNC_VARS:
        monkeypatch.delenv(name, raising=False)


# (instance, LNC) -> (logical cores, HBM per logical core). A trn2 chip: 8 physical cores and
# 96 GiB; trn3: 8 and 144 GiB; trn1: 2 and 32 GiB (profiles.py cites the AWS pages).
SIZES = {
    ("trn2.3xlarge", 2): (4, 24 * GiB), ("trn2.3xlarge", 1): (8, 12 * GiB),
    ("trn2.48xlarge", 2): (64, 24 * GiB), ("trn2.48xlarge", 1): (128, 12 * GiB),
    ("trn3.3xlarge", 2): (4, 36 * GiB), ("trn3.3xlarge", 1): (8, 18 * GiB),
    ("trn3.48xlarge", 2): (64, 36 * GiB), ("trn3.48xlarge", 1): (128, 18 * GiB),
    ("trn1.2xlarge", 1): (2, 16 * GiB), ("trn1.32xlarge", 1): (32, 16 * GiB),
}


def test_every_accepted_lnc_of_every_profile_is_sized():
    assert {(n, lnc) for n, p in profiles.PROFILES.items() for lnc in profiles.LNC_CHOICES[p.platform]} \
        == set(SIZES)
    for (name, lnc), (cores, hbm) in SIZES.items():
        profile = profiles.profile(name, lnc)
        assert (profile.lnc, profile.num_cores, profile.hbm_per_core) == (lnc, cores, hbm), (name, lnc)
        # LNC regroups the same silicon: physical cores and total HBM do not change.
        assert profile.physical_cores == profile.num_cores * lnc == profiles.PROFILES[name].physical_cores
        assert profile.hbm_total == profile.num_cores * hbm == profiles.PROFILES[name].hbm_total


def test_default_lnc_is_two_on_trn2_and_trn3_and_one_on_trn1():
    for name, profile in profiles.PROFILES.items():
        assert profile.lnc == {"trn1": 1, "trn2": 2, "trn3": 2}[profile.platform], name
        assert profiles.profile(name) == profile


@pytest.mark.parametrize("raw", ["0", "3", "4", "two", "1.0", "-1", "2x"])
def test_invalid_lnc_names_the_variable_and_the_choices(monkeypatch, raw):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", raw)
    with pytest.raises(ValueError) as info:
        profiles.active_profile()
    message = str(info.value)
    assert message.startswith(f"NEURON_LOGICAL_NC_CONFIG={raw.strip()!r} is not valid")
    assert "use 1 " in message and " or 2 " in message and "trn1 accepts only 1" in message


def test_lnc_2_on_trn1_names_the_variable_and_its_only_choice():
    for name in ("trn1.2xlarge", "trn1.32xlarge"):
        with pytest.raises(ValueError) as info:
            profiles.profile(name, 2)
        assert str(info.value).startswith(f"NEURON_LOGICAL_NC_CONFIG=2 is not available on {name}")
        assert "trn1 accepts only 1" in str(info.value) and "set it to 1" in str(info.value)
    assert profiles.profile("trn1.2xlarge", 1).num_cores == 2  # 1 is accepted (and changes nothing)


def test_active_profile_follows_the_variable(monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", " 1 ")
    assert (profiles.active_profile().name, profiles.active_profile().num_cores) == ("trn2.3xlarge", 8)
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE", "trn3.48xlarge")
    assert profiles.active_profile().hbm_per_core == 18 * GiB
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "")  # empty means the default, like unset
    assert profiles.active_profile().lnc == 2


@pytest.mark.parametrize("num, expected", [(None, [0, 1, 2, 3]), ("0", [0, 1, 2, 3]), ("1", [0]),
                                           ("3", [0, 1, 2]), ("4", [0, 1, 2, 3]), (" 2 ", [0, 1])])
def test_num_cores_takes_the_first_cores(monkeypatch, num, expected):
    if num is not None:
        monkeypatch.setenv("NEURON_RT_NUM_CORES", num)
    assert profiles.visible_cores(profiles.active_profile()) == expected
    assert profiles.cores_source() == ("NEURON_RT_NUM_CORES" if num and num.strip() != "0" else "all")


def test_num_cores_counts_logical_cores(monkeypatch):
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "8")
    with pytest.raises(ValueError) as info:
        profiles.visible_cores(profiles.active_profile())
    assert str(info.value) == ("NEURON_RT_NUM_CORES=8 asks for more NeuronCores than trn2.3xlarge at "
                               "LNC=2 has (4): use 1 to 4, or 0 for all of them.")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert profiles.visible_cores(profiles.active_profile()) == list(range(8))


@pytest.mark.parametrize("raw", ["-1", "x", "1.5", "1-2", "all"])
def test_invalid_num_cores_names_the_variable_and_the_valid_values(monkeypatch, raw):
    monkeypatch.setenv("NEURON_RT_NUM_CORES", raw)
    with pytest.raises(ValueError) as info:
        profiles.visible_cores(profiles.active_profile())
    assert str(info.value).startswith(f"NEURON_RT_NUM_CORES={raw!r} is not valid")
    assert "or 0 for all of them" in str(info.value)


def test_visible_cores_take_precedence_over_num_cores(monkeypatch):
    # AWS: "NEURON_RT_VISIBLE_CORES takes precedence over NEURON_RT_NUM_CORES".
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "1")
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2-3")
    assert profiles.visible_cores(profiles.active_profile()) == [2, 3]
    assert profiles.cores_source() == "NEURON_RT_VISIBLE_CORES"
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "9")  # out of range but unused: no error
    assert profiles.visible_cores(profiles.active_profile()) == [2, 3]
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "x")  # malformed: still an error (read at import)
    with pytest.raises(ValueError, match="NEURON_RT_NUM_CORES='x'"):
        config.num_cores()


def test_visible_cores_count_logical_cores_under_the_lnc(monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "6-7")
    with pytest.raises(ValueError) as info:
        profiles.visible_cores(profiles.active_profile())
    assert str(info.value) == ("NEURON_RT_VISIBLE_CORES='6-7' names core 6, but trn2.3xlarge at LNC=2 "
                               "has cores 0-3.")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert profiles.visible_cores(profiles.active_profile()) == [6, 7]


def test_a_process_uses_at_most_127_cores(monkeypatch):
    # PyTorch's device index is 8-bit: the 128 cores of a 48xlarge at LNC=1 do not fit in one process.
    monkeypatch.setenv("TORCH_NEURONX_INSTANCE", "trn2.48xlarge")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    with pytest.raises(ValueError) as info:
        profiles.visible_cores(profiles.active_profile())
    assert str(info.value).startswith("trn2.48xlarge at LNC=1 has 128 NeuronCores, but one process can "
                                      "use at most 127")
    assert "NEURON_RT_NUM_CORES (1 to 127)" in str(info.value)
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "127")
    assert profiles.visible_cores(profiles.active_profile()) == list(range(127))
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "64-127")
    assert profiles.visible_cores(profiles.active_profile())[-1] == 127


def test_distributed_core_count_error_names_what_chose_the_cores(monkeypatch):
    from torch_neuronx import neuron
    from torch_neuronx.distributed import _backend

    assert _backend._visible_cores_origin() == f"all cores of {profiles.describe(neuron._PROFILE)}"
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "2")
    assert _backend._visible_cores_origin() == "NEURON_RT_NUM_CORES=2"
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "1-2")
    assert _backend._visible_cores_origin() == "NEURON_RT_VISIBLE_CORES='1-2'"
