"""Instance profiles: how many logical NeuronCores a Trainium instance has and
how much HBM each one owns (REFERENCE.md §2), plus NEURON_RT_VISIBLE_CORES.

The emulated runtime sizes itself from the active profile, so an out-of-memory
error on a laptop happens where it would happen on the instance.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_neuronx import config
from torch_neuronx.config import DEFAULT_INSTANCE  # noqa: F401  (re-exported)

GiB = 1024**3


@dataclass(frozen=True)
class InstanceProfile:
    name: str
    platform: str  # trn1 | trn2 | trn3
    core_generation: str  # NeuronCore-v2 | -v3 | -v4
    chips: int
    logical_cores_per_chip: int
    hbm_per_core: int  # bytes

    @property
    def num_cores(self) -> int:
        return self.chips * self.logical_cores_per_chip

    @property
    def lnc(self) -> int:
        """Physical cores per logical core: the platform's default LNC (setting
        it through NEURON_LOGICAL_NC_CONFIG is issue #17)."""
        return DEFAULT_LNC[self.platform]

    @property
    def physical_cores(self) -> int:
        return self.num_cores * self.lnc

    @property
    def hbm_total(self) -> int:
        return self.num_cores * self.hbm_per_core

    @property
    def fp8(self) -> bool:
        """FP8 compute (aten::_scaled_mm, MXFP8) is documented for Trainium3 only (REFERENCE.md §6)."""
        return self.platform == "trn3"


def _profile(name, platform, generation, chips, cores_per_chip, hbm_per_chip_gib):
    return InstanceProfile(
        name, platform, generation, chips, cores_per_chip, hbm_per_chip_gib * GiB // cores_per_chip
    )


# Logical NeuronCore config: trn2/trn3 pair two physical cores into one logical
# device by default; trn1 has no LNC (one physical core per logical core).
DEFAULT_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}

# trn2/trn3 default to LNC=2: two physical cores form one logical device, so a
# chip of 8 physical cores shows 4 logical ones. trn1 has no LNC (2 cores/chip).
# The trn3 instance sizes are modelled on trn2's (AWS had not published them all).
PROFILES: dict[str, InstanceProfile] = {
    p.name: p
    for p in (
        _profile("trn1.2xlarge", "trn1", "NeuronCore-v2", 1, 2, 32),
        _profile("trn1.32xlarge", "trn1", "NeuronCore-v2", 16, 2, 32),
        _profile("trn2.3xlarge", "trn2", "NeuronCore-v3", 1, 4, 96),
        _profile("trn2.48xlarge", "trn2", "NeuronCore-v3", 16, 4, 96),
        _profile("trn3.3xlarge", "trn3", "NeuronCore-v4", 1, 4, 144),
        _profile("trn3.48xlarge", "trn3", "NeuronCore-v4", 16, 4, 144),
    )
}


def active_profile() -> InstanceProfile:
    name = config.instance()
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"TORCH_NEURONX_INSTANCE={name!r} is not a known instance profile. "
            f"Known profiles: {', '.join(sorted(PROFILES))}."
        ) from None


def parse_visible_cores(spec: str | None, total: int) -> list[int]:
    """Parses NEURON_RT_VISIBLE_CORES ("2", "0-1", "0,2-3") into physical core ids."""
    if spec is None or not spec.strip():
        return list(range(total))
    cores: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                first, last = (int(x) for x in part.split("-", 1))
                if last < first:
                    raise ValueError
                cores.extend(range(first, last + 1))
            else:
                cores.append(int(part))
        except ValueError:
            raise ValueError(
                f"NEURON_RT_VISIBLE_CORES={spec!r} is not valid: use core ids and ranges "
                "such as '0', '0-1' or '0,2-3' (ranges ascending, both ends included)."
            ) from None
    for core in cores:
        if not 0 <= core < total:
            raise ValueError(
                f"NEURON_RT_VISIBLE_CORES={spec!r} names core {core}, but the instance "
                f"profile has cores 0-{total - 1}."
            )
    if len(set(cores)) != len(cores):
        raise ValueError(f"NEURON_RT_VISIBLE_CORES={spec!r} names a core twice.")
    return cores


def visible_cores(profile: InstanceProfile) -> list[int]:
    return parse_visible_cores(config.visible_cores(), profile.num_cores)
