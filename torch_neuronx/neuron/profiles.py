"""Instance profiles: how many logical NeuronCores a Trainium instance presents
and how much HBM each one owns, under the Logical NeuronCore configuration (LNC)
in force; plus which of those cores this process uses (NEURON_RT_VISIBLE_CORES,
NEURON_RT_NUM_CORES).

The emulated runtime sizes itself from the active profile, so an out-of-memory
error on a laptop happens where it would happen on the instance.

Semantics follow AWS's Neuron documentation (sources next to each rule):

- LNC groups physical cores into one logical core. "LNC can only be set to 1 or 2";
  "LNC applies only to Trn2 and Trn3 instances"; LNC=2 is the Trainium2 default
  (about-neuron/arch/neuron-features/logical-neuroncore-config.rst, "Logical NeuronCore
  configuration"). "On trn1, only lnc=1 is supported" (compiler error code NCC_EARG001).
- A chip's HBM is split into banks, each shared by two physical cores: "Trainium2 devices
  contain four 24GB HBM banks. Each bank is shared by two physical NeuronCore-v3"
  (same LNC page). Under LNC=1 the two cores of a bank share it ("noisy neighbor problems";
  neuron-runtime/explore/device-memory.rst, "Neuron Device Memory"). The emulator gives each
  logical core an even share of its chip's HBM (12 GiB per core on trn2 at LNC=1) and does
  not let a core borrow its neighbour's unused half: it runs out of memory no later than
  Trainium, possibly earlier.
- NEURON_RT_VISIBLE_CORES and NEURON_RT_NUM_CORES count the NeuronCores the runtime presents,
  i.e. logical cores under the LNC in force ("a Trn2.48xlarge instance presents 64 available
  NeuronCores" at LNC=2, 128 at LNC=1; VISIBLE_CORES takes "any value or range between 0 to
  Max NeuronCore in the system"). "NEURON_RT_VISIBLE_CORES takes precedence over
  NEURON_RT_NUM_CORES"; NUM_CORES "0 ... is interpreted as all" (neuron-runtime/guides/
  configuration-guide.rst, "Neuron Runtime configuration"). The runtime picks NUM_CORES free
  cores; the emulator has no cross-process reservation and takes the first ones (0..N-1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch_neuronx import config
from torch_neuronx.config import DEFAULT_INSTANCE  # noqa: F401  (re-exported)

GiB = 1024**3
# PyTorch numbers devices with an 8-bit index (c10::DeviceIndex), so a count of 128 does not fit:
# a process can use at most 127 NeuronCores (csrc/Runtime.h kMaxDevices). Only a 48xlarge at
# LNC=1 (128 cores) has more.
MAX_CORES_PER_PROCESS = 127

# Physical cores per logical core each platform accepts, and its default (see the module doc).
LNC_CHOICES = {"trn1": (1,), "trn2": (1, 2), "trn3": (1, 2)}
DEFAULT_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}


@dataclass(frozen=True)
class InstanceProfile:
    name: str
    platform: str  # trn1 | trn2 | trn3
    core_generation: str  # NeuronCore-v2 | -v3 | -v4
    chips: int
    physical_cores_per_chip: int
    hbm_per_chip: int  # bytes
    lnc: int  # physical cores per logical core

    @property
    def logical_cores_per_chip(self) -> int:
        return self.physical_cores_per_chip // self.lnc

    @property
    def num_cores(self) -> int:
        """Logical cores: the neuron:N devices a process may see."""
        return self.chips * self.logical_cores_per_chip

    @property
    def hbm_per_core(self) -> int:
        """HBM of one logical core: an even share of its chip's."""
        return self.hbm_per_chip // self.logical_cores_per_chip

    @property
    def physical_cores(self) -> int:
        return self.chips * self.physical_cores_per_chip

    @property
    def hbm_total(self) -> int:
        return self.chips * self.hbm_per_chip

    @property
    def fp8(self) -> bool:
        """FP8 compute (aten::_scaled_mm, MXFP8) is documented for Trainium3 only (docs/hardware-figures.md#fp8-compute)."""
        return self.platform == "trn3"

    def with_lnc(self, lnc: int | None) -> InstanceProfile:
        """This instance under another LNC (None: the platform's default); a ValueError
        naming NEURON_LOGICAL_NC_CONFIG and the platform's choices if it does not accept it."""
        lnc = DEFAULT_LNC[self.platform] if lnc is None else lnc
        choices = LNC_CHOICES[self.platform]
        if lnc not in choices:
            valid = " or ".join(map(str, choices))
            raise ValueError(
                f"NEURON_LOGICAL_NC_CONFIG={lnc} is not available on {self.name}: {self.platform} "
                f"accepts {'only ' if len(choices) == 1 else ''}{valid} (only trn2 and trn3 group "
                f"physical NeuronCores into logical ones). Unset it or set it to {valid}.")
        return dataclasses.replace(self, lnc=lnc)


def _profile(name, platform, generation, chips, physical_cores_per_chip, hbm_per_chip_gib):
    return InstanceProfile(name, platform, generation, chips, physical_cores_per_chip,
                           hbm_per_chip_gib * GiB, DEFAULT_LNC[platform])


# Chips per instance, physical cores and HBM per chip. Sources (AWS Neuron docs, stored copies
# of github.com/aws-neuron/aws-neuron-sdk under about-neuron/arch/neuron-hardware/):
# - trn1: trn1-arch.rst, "AWS Trn1/Trn1n Architecture" (Trn1.2xlarge 1 device, Trn1.32xlarge 16,
#   32 GiB per device); trainium.rst, "Trainium Architecture" (two NeuronCore-v2 per chip).
# - trn2: trainium2.rst / logical-neuroncore-config.rst (8 NeuronCore-v3 and four 24GB banks =
#   96 GiB per chip); trn2-arch.rst, "Amazon EC2 Trn2 Architecture" (trn2.48xlarge: 16 chips,
#   1,536 GiB). trn2.3xlarge (1 chip): https://aws.amazon.com/ec2/instance-types/trn2/ (docs/hardware-figures.md#instance-profiles).
# - trn3: trainium3.rst, "Trainium3 Architecture" (8 NeuronCore-v4, 144 GiB per chip);
#   trn3-arch.rst, "Amazon EC2 Trn3 Architecture": AWS publishes Trn3 as UltraServers only,
#   Gen1 = 4 servers x 16 Trainium3 (9,216 GiB), Gen2 = 36 servers x 4; it lists no instance
#   sizes (the EC2 page https://aws.amazon.com/ec2/instance-types/trn3/ neither).
#   trn3.48xlarge (16 chips, one Gen1 server): the name is in AWS's open-source driver
#   (github.com/aws-neuron/aws-neuron-driver, v4/neuron_dhal_v4.c, v4_platform_map, a 16-device
#   "PDS" platform); AWS has not documented it. trn3.3xlarge (1 chip) is modelled: no AWS
#   source names it; the same driver file lists one-device "3xlarge" Trn3 types under other
#   names (trn3pd98.3xlarge, trn3sn.3xlarge, ...), none documented.
PROFILES: dict[str, InstanceProfile] = {
    p.name: p
    for p in (
        _profile("trn1.2xlarge", "trn1", "NeuronCore-v2", 1, 2, 32),
        _profile("trn1.32xlarge", "trn1", "NeuronCore-v2", 16, 2, 32),
        _profile("trn2.3xlarge", "trn2", "NeuronCore-v3", 1, 8, 96),
        _profile("trn2.48xlarge", "trn2", "NeuronCore-v3", 16, 8, 96),
        _profile("trn3.3xlarge", "trn3", "NeuronCore-v4", 1, 8, 144),
        _profile("trn3.48xlarge", "trn3", "NeuronCore-v4", 16, 8, 144),
    )
}


def profile(name: str, lnc: int | None = None) -> InstanceProfile:
    """The named instance under `lnc` (None: its platform's default)."""
    try:
        base = PROFILES[name]
    except KeyError:
        raise ValueError(
            f"TORCH_NEURONX_INSTANCE={name!r} is not a known instance profile. "
            f"Known profiles: {', '.join(sorted(PROFILES))}."
        ) from None
    return base.with_lnc(lnc)


def active_profile() -> InstanceProfile:
    """TORCH_NEURONX_INSTANCE under NEURON_LOGICAL_NC_CONFIG."""
    return profile(config.instance(), config.logical_nc_config())


def parse_core_list(spec: str, what: str) -> list[int]:
    """Core ids and ascending ranges ("2", "0-1", "0,2-3") -> [0, 2, 3]; the grammar of
    NEURON_RT_VISIBLE_CORES, also used by the profiler's capture_enabled_for_nc (`what`
    names the setting in the error)."""
    cores: list[int] = []
    for part in str(spec).split(","):
        first, _, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last or first)
            if high < low or low < 0:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{what}={spec!r} is not valid: use core ids and ranges "
                "such as '0', '0-1' or '0,2-3' (ranges ascending, both ends included)."
            ) from None
        cores.extend(range(low, high + 1))
    return cores


def parse_visible_cores(spec: str | None, total: int, of: str = "the instance profile") -> list[int]:
    """Parses NEURON_RT_VISIBLE_CORES ("2", "0-1", "0,2-3") into core ids of `of`, which has
    `total` (logical) cores."""
    if spec is None or not spec.strip():
        return list(range(total))
    cores = parse_core_list(spec, "NEURON_RT_VISIBLE_CORES")
    for core in cores:
        if not 0 <= core < total:
            raise ValueError(
                f"NEURON_RT_VISIBLE_CORES={spec!r} names core {core}, but {of} "
                f"has cores 0-{total - 1}."
            )
    if len(set(cores)) != len(cores):
        raise ValueError(f"NEURON_RT_VISIBLE_CORES={spec!r} names a core twice.")
    return cores


def first_cores(count: int | None, total: int, of: str = "the instance profile") -> list[int]:
    """NEURON_RT_NUM_CORES: the first `count` cores (None or 0: all `total`)."""
    if not count:
        return list(range(total))
    if count > total:
        raise ValueError(
            f"NEURON_RT_NUM_CORES={count} asks for more NeuronCores than {of} has ({total}): "
            f"use 1 to {total}, or 0 for all of them.")
    return list(range(count))


def describe(profile: InstanceProfile) -> str:
    """'trn2.3xlarge at LNC=2', for messages about core ids."""
    return f"{profile.name} at LNC={profile.lnc}"


def visible_cores(profile: InstanceProfile) -> list[int]:
    """The profile's logical cores this process uses: NEURON_RT_VISIBLE_CORES if set (it
    takes precedence), else the first NEURON_RT_NUM_CORES, else all."""
    spec = config.visible_cores()
    if spec is not None:
        cores = parse_visible_cores(spec, profile.num_cores, describe(profile))
    else:
        cores = first_cores(config.num_cores(), profile.num_cores, describe(profile))
    if len(cores) > MAX_CORES_PER_PROCESS:
        raise ValueError(
            f"{describe(profile)} has {len(cores)} NeuronCores, but one process can use at most "
            f"{MAX_CORES_PER_PROCESS} (PyTorch numbers devices with an 8-bit index): set "
            f"NEURON_RT_NUM_CORES (1 to {MAX_CORES_PER_PROCESS}) or NEURON_RT_VISIBLE_CORES to use "
            "fewer, or NEURON_LOGICAL_NC_CONFIG=2.")
    return cores


def cores_source() -> str:
    """Which variable chose the visible cores: NEURON_RT_VISIBLE_CORES, NEURON_RT_NUM_CORES or 'all'."""
    if config.visible_cores() is not None:
        return config.visible_cores.name
    return config.num_cores.name if config.num_cores() else "all"
