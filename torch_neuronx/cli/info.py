"""``torch-neuronx info [--json]``: the instance the emulator presents (what
``neuron-ls -j`` shows on a real one) and the emulator's own state.

Everything comes from the modules that own it: the profile and visible cores
read when torch_neuronx was imported (neuron/profiles.py), the compile cache
(compiler/cache.py), the fallback and fp64 policies (ops), the patches
(patching.py). Nothing here imports JAX (its versions come from the package
metadata), so the command takes as long as ``import torch``.

The JSON object's fields are documented in docs/tools.md; SCHEMA_VERSION
changes when a field is renamed or removed (adding one does not).
"""

from __future__ import annotations

import json
import platform
from importlib import metadata

SCHEMA_VERSION = 1
HELP = "show the emulated instance (type, cores, LNC, HBM), versions, compile cache and policies"


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (fields: docs/tools.md) instead of the text block")


def run(args) -> int:
    report = collect()
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


# ------------------------------------------------------------------ the report


def collect() -> dict:
    """The whole report, as the JSON object --json prints."""
    return {
        "schema_version": SCHEMA_VERSION,
        "versions": _versions(),
        "instance": _instance(),
        "visible_cores": _visible_cores(),
        "host_memory": _host_memory(),
        "compile_cache": _compile_cache(),
        "policies": _policies(),
        "integrations": _integrations(),
    }


def _package_version(name: str) -> str | None:
    """An installed distribution's version, read from its metadata (importing
    jax would take seconds), or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _versions() -> dict:
    import torch

    import torch_neuronx

    return {"torch_neuronx": torch_neuronx.__version__, "torch": torch.__version__,
            "jax": _package_version("jax"), "jaxlib": _package_version("jaxlib"),
            "python": platform.python_version()}


def _source(variable, default: str) -> str:
    """The variable's name when it is set (it decided the value), else `default`
    (config's rule: unset, empty or spaces means the default)."""
    return variable.name if (variable.raw() or "").strip() else default


def _instance() -> dict:
    from torch_neuronx import config, neuron

    profile = neuron._PROFILE  # the profile in force: read once, at import, like the C++ core's sizes
    return {
        "type": profile.name,
        "source": _source(config.instance, "default"),
        "platform": profile.platform,
        "core_generation": profile.core_generation,
        "chips": profile.chips,
        "logical_cores": profile.num_cores,
        "physical_cores": profile.physical_cores,
        "lnc": profile.lnc,
        "lnc_source": _source(config.logical_nc_config, "default"),
        "hbm_per_logical_core_bytes": profile.hbm_per_core,
        "hbm_total_bytes": profile.hbm_total,
        "fp8": profile.fp8,
    }


def _visible_cores() -> dict:
    from torch_neuronx import neuron
    from torch_neuronx.neuron import profiles

    cores = list(neuron._VISIBLE_CORES)
    return {"cores": cores, "count": len(cores), "source": profiles.cores_source(),
            "hbm_bytes": len(cores) * neuron._PROFILE.hbm_per_core}


def _host_memory() -> dict:
    """The machine's memory, which holds the emulated HBM (/proc/meminfo; None where unknown)."""
    values = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"total_bytes": values.get("MemTotal"), "available_bytes": values.get("MemAvailable")}


def _compile_cache() -> dict:
    from torch_neuronx import config
    from torch_neuronx.compiler import cache

    stats = cache.stats()
    source = "TORCH_NEURONX_NEFF_DISABLE_CACHE" if stats["directory"] is None else \
        _source(config.neff_cache_dir, "default")
    return {"enabled": stats["directory"] is not None, "source": source, **stats}


def _policies() -> dict:
    from torch_neuronx import ops

    return {"fallback": ops.get_fallback_mode(), "fp64": ops.get_fp64_mode()}


def _integrations() -> dict:
    from torch_neuronx import config, integrations, patching

    applied = set(integrations.applied_patches())
    return {
        "enabled": not config.disable_integrations(),
        # Library patches run when their library is imported: in this process, none is.
        "waiting": [name for name in integrations.registered_patches() if name not in applied],
        "patches_applied": [{"target": p.target, "by": p.by, "why": p.why} for p in patching.applied()],
    }


# ------------------------------------------------------------------ text output


def render(report: dict) -> str:
    """The report as an aligned block of `label  value` lines."""
    rows = _instance_rows(report) + _state_rows(report)
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(f"{label:<{width}}{value}".rstrip() for label, value in rows)


def _instance_rows(report: dict) -> list[tuple[str, str]]:
    versions, instance, visible = report["versions"], report["instance"], report["visible_cores"]
    chosen = "default; set TORCH_NEURONX_INSTANCE to change" if instance["source"] == "default" \
        else f"from {instance['source']}"
    return [
        ("versions", ", ".join(f"{name.replace('_', '-')} {version or 'not installed'}"
                                    for name, version in versions.items())),
        ("instance", f"{instance['type']} ({chosen})"),
        ("chips", f"{instance['chips']} x {instance['platform']}"),
        ("cores", f"{instance['logical_cores']} logical {instance['core_generation']}, "
                  f"{instance['physical_cores']} physical (LNC={instance['lnc']}, {instance['lnc_source']})"),
        ("HBM", f"{size(instance['hbm_per_logical_core_bytes'])} per logical core, "
                f"{size(instance['hbm_total_bytes'])} total"),
        ("FP8", "yes" if instance["fp8"] else "no (Trainium3 only)"),
        ("visible cores", f"{core_ranges(visible['cores'])} ({visible['source']}), "
                          f"{size(visible['hbm_bytes'])} HBM"),
        ("host memory", _host_text(report["host_memory"], visible["hbm_bytes"])),
    ]


def _host_text(host: dict, hbm_bytes: int) -> str:
    if host["total_bytes"] is None:
        return "unknown"
    text = f"{size(host['total_bytes'])} total, {size(host['available_bytes'] or 0)} available"
    if host["available_bytes"] is not None and host["available_bytes"] < hbm_bytes:
        text += " (less than the visible cores' HBM: the host runs out first, with its own error)"
    return text


def _state_rows(report: dict) -> list[tuple[str, str]]:
    cache, policies, integrations = report["compile_cache"], report["policies"], report["integrations"]
    waiting = len(integrations["waiting"])
    rows = [
        ("compile cache", _cache_text(cache)),
        ("fallback", policies["fallback"]),
        ("fp64", policies["fp64"]),
        ("integrations", (f"enabled, {waiting} library patches wait for their library's import"
                          if integrations["enabled"] else "disabled (TORCH_NEURONX_DISABLE_INTEGRATIONS)")),
        ("patches", f"{len(integrations['patches_applied'])} applied"),
    ]
    rows += [("", f"{p['target']}: {p['why']}") for p in integrations["patches_applied"]]
    return rows


def _cache_text(cache: dict) -> str:
    if not cache["enabled"]:
        return "disabled (TORCH_NEURONX_NEFF_DISABLE_CACHE)"
    limit = "no limit" if cache["max_size_bytes"] is None else f"limit {size(cache['max_size_bytes'])}"
    return (f"{cache['directory']} ({cache['source']}): {cache['entries']} entries, "
            f"{size(cache['size_bytes'])} ({limit})")


def size(count: int) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (24 GiB, 1.5 MiB, 120 B)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} B"


def core_ranges(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (NEURON_RT_VISIBLE_CORES's own notation)."""
    parts, start = [], None
    for index, core in enumerate(cores):
        if start is None:
            start = core
        if index + 1 == len(cores) or cores[index + 1] != core + 1:
            parts.append(str(start) if start == core else f"{start}-{core}")
            start = None
    return ",".join(parts)
