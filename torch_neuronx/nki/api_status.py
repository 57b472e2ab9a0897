"""Every name of AWS's NKI API reference with its status in this simulator: docs/nki-api.md.

The names come from torch_neuronx/nki/api_reference.py (read once from AWS's reference sources by
scripts/nki_api_reference.py). Each name is resolved here, at generation time, against
`torch_neuronx.nki` (which `import nki` and `import neuronxcc.nki` alias):

- **supported**: the name resolves (attribute by attribute, importing submodules as `import` would);
- **differs**: it resolves, and docs/nki.md documents a difference from AWS's semantics
  (`DIFFERENCES` below: one line each, the reason);
- **missing**: it does not resolve.

Nothing here lists what the simulator implements: a name added to the simulator is supported on the
next regeneration.

    python -m torch_neuronx.nki.api_status --write   # regenerates docs/nki-api.md
    python -m torch_neuronx.nki.api_status --check   # exit 1 when the page is out of date
"""

from __future__ import annotations

import importlib
import pathlib
import types

from .. import generated_page
from .api_reference import REFERENCES, REPOSITORY

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "nki-api.md"
REGENERATE = "python -m torch_neuronx.nki.api_status --write"

SUPPORTED, DIFFERS, MISSING = "supported", "differs", "missing"
STATUSES = (SUPPORTED, DIFFERS, MISSING)

# A name that resolves but behaves differently from AWS's reference, with the reason (docs/nki.md
# has the details). Only names that resolve take this status; a listed name that does not resolve
# is missing.
_BITVEC_OP = ("as an `op=` of a nisa instruction it applies to the float32 values the simulator computes "
              "in (exact below 2**24); the nl helper is exact on the bit patterns")

DIFFERENCES = {
    "nki.benchmark": "the latency is the cost model's estimate from one simulated run, not a device "
                     "measurement; `warmup`, `iters` and the NEFF/NTFF options are accepted and ignored",
    "nki.baremetal": "simulates the kernel instead of compiling and running a NEFF; `save_neff_name`, "
                     "`save_trace_name`, `additional_compile_opt` accepted and ignored",
    "nki.profile": "writes a JSON summary (estimated latency, engine busy times, instruction trace) "
                   "instead of NEFF/NTFF profiles; `save_neff_name`, `profile_nth` ignored",
    "nki.language.tile_size.total_available_sbuf_size": "the whole per-partition SBUF capacity of the "
                  "target (AWS subtracts a reserved size it does not document)",
    "nki.language.tile_size.psum_num_banks": "always 8: the bank `NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE` "
                  "reserves is not modeled",
    "nki.language.NkiTensor.offset": "the view's byte offset from the start of its allocation (AWS "
                                     "documents only `offset: int`; its access patterns count elements)",
    "nki.language.NkiTensor.ap": "`vector_offset` (per-partition indirect access) is simulated on HBM tensors "
                                 "only, without a dtype reinterpretation",
    "nki.language.loop_reduce": "usable only as the right side of `t[...] = nl.loop_reduce(...)`: the simulator "
                                "sees the reduction's destination through that assignment",
    "nki.language.rand": "the values come from the launch's NumPy generator (nl.random_seed), not the hardware's",
    "nki.language.broadcast_to": "broadcasts free dimensions only; a partition-dimension broadcast is an NKIError "
                                 "(no engine copies across partitions)",
    "nki.language.gather_flattened": "only `axis=0` (AWS does not document other axes)",
    "nki.language.bitwise_and": _BITVEC_OP,
    "nki.language.bitwise_or": _BITVEC_OP,
    "nki.language.bitwise_xor": _BITVEC_OP,
    "nki.language.left_shift": _BITVEC_OP,
    "nki.language.right_shift": _BITVEC_OP,
    "nki.language.dropout": "which elements are dropped comes from the launch's NumPy generator, not "
                            "the hardware's random number generator (the rate is right)",
    "nki.isa.dropout": "which elements are dropped comes from the launch's NumPy generator, not the "
                       "hardware's random number generator (the rate is right)",
    "nki.language.random_seed": "seeds the launch's NumPy generator (dropout), not the hardware's",
    "nki.language.shared_constant": "each call copies the data into its own HBM tensor (AWS shares one "
                                    "copy per data and dtype)",
    "nki.language.spmd_dim": "each program of the grid is a simulated core of its own; the cores take turns "
                             "on one host thread (results as on hardware, no parallel speed-up)",
    "nki.language.nc": "each program of the grid is a simulated core of its own; the cores take turns on "
                       "one host thread (results as on hardware, no parallel speed-up)",
    "nki.isa.core_barrier": "in a one-program launch (LNC 1) a barrier naming cores (0, 1) waits for nothing: "
                            "the partner core's launch is not simulated",
    "nki.collectives.all_gather_v": "raises NKIError: variable-size collectives are not simulated",
    "nki.collectives.all_to_all_v": "raises NKIError: variable-size collectives are not simulated",
    "nki.isa.dma_transpose": "`dge_mode=swdge` (indirect transpose) is not implemented",
    "nki.isa.dge_mode": "accepted by `dma_copy` and not acted on (it changes how the hardware issues a "
                        "DMA, not what it copies); `dma_transpose` checks the `hwdge` limits",
    "nki.isa.matmul_perf_mode": "accepted and not acted on: FP8 double-row throughput is not costed",
    "nki.isa.dma_engine": "accepted and not acted on (which DMA engine moves the data)",
    "nki.isa.rng": "the bits come from a per-lane XORWOW whose state the launch's NumPy generator sets "
                   "(nl.random_seed), not the hardware's state or draw order",
    "nki.isa.rand2": "the numbers come from a per-lane XORWOW whose state the launch's NumPy generator sets "
                     "(nl.random_seed), not the hardware's state or draw order",
    "nki.isa.set_rng_seed": "derives the lanes' states from the seed with NumPy's generator: a seed repeats the "
                            "simulator's numbers, not the hardware's",
    "nki.isa.rand_set_state": "the state words are the simulator's XORWOW (x, y, z, w, v, d; the Vector Engine's "
                              "other 18 words are kept unused): AWS does not document their layout",
    "nki.isa.rand_get_state": "the state words are the simulator's XORWOW (x, y, z, w, v, d; the Vector Engine's "
                              "other 18 words are kept unused): AWS does not document their layout",
    "nki.isa.NkiInstruction": "instructions run in program order; a handle only adds cost-model scheduling edges",
    "nki.isa.NkiInstruction.depends_on": "an edge changes only the cost model's schedule; a producer issued after "
                                         "its consumer is an NKIError; the dynamic-loop nesting rule is not checked",
    "nki.isa.dma_compute": "the scatter / gather read-modify-write through `vector_offset` is not simulated",
    "nki.isa.activate2": "`relu_param` must be 0 (no parameterized activation function is simulated); "
                         "`.indirect()` views are not implemented",
    "nki.isa.engine.sync": "accepted as `dma_copy(engine=)` and not acted on (which engine generates descriptors)",
    "nki.isa.nc_stream_shuffle": "AWS's rules on the start partitions of `src` and `dst` are not checked",
    "nki.isa.bn_stats": "its 6-value layout is the simulator's own (AWS does not document it); only "
                        "`bn_aggr` reads it",
    "nki.compiler.skip_middle_end_transformations": "returns the kernel unchanged: the simulator runs "
                                                    "the kernel's Python as written",
    "nki.compiler.enable_stack_allocator": "returns the kernel unchanged: the simulator allocates as "
                                           "the kernel's Python runs",
    "nki.compiler.force_auto_alloc": "returns the kernel unchanged: the simulator allocates as the "
                                     "kernel's Python runs",
}

_ROOT = "torch_neuronx.nki"


def resolve(name: str) -> bool:
    """Whether `name` (`nki.isa.nc_matmul`, `nki.language.tile_size.pmax`) names something in the
    simulator: attribute by attribute from `torch_neuronx.nki`, importing a submodule where an
    attribute of a module is absent (as `import nki.collectives` would)."""
    parts = name.split(".")
    if parts[0] != "nki":
        return False
    obj = importlib.import_module(_ROOT)
    for part in parts[1:]:
        try:
            obj = getattr(obj, part)
            continue
        except AttributeError:
            pass
        if not isinstance(obj, types.ModuleType):
            return False
        try:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
        except ImportError:
            return False
    return True


def status(name: str) -> str:
    if not resolve(name):
        return MISSING
    return DIFFERS if name in DIFFERENCES else SUPPORTED


def _module(name: str, section: str) -> str:
    return section.split(":", 1)[0]


def rows(key: str) -> list[tuple[str, str, str, str]]:
    """(name, module, section, status) for one reference, in the reference's order."""
    _title, _commit, _pages, names = REFERENCES[key]
    return [(name, _module(name, section), section.split(": ", 1)[-1], status(name)) for name, section in names]


def _counts(statuses) -> str:
    statuses = list(statuses)
    return ", ".join(f"{s} {statuses.count(s)}" for s in STATUSES)


def _cell(name: str, st: str) -> str:
    if st == DIFFERS:
        return f"**differs**: {DIFFERENCES[name]}"
    return st


def render_page() -> str:
    current_title, current_commit, current_pages, current_names = REFERENCES["current"]
    lines = [
        "# NKI API status",
        "",
        f"Generated by `{REGENERATE}`; do not edit by hand. `tests/test_nki_api_page.py` fails when it is",
        "out of date, when a name marked supported does not resolve in the simulator, or one marked",
        "missing does. The names are those of AWS's NKI API reference, read once from its Sphinx sources",
        f"in [{REPOSITORY}](https://github.com/{REPOSITORY}) into `torch_neuronx/nki/api_reference.py`",
        "(`python scripts/nki_api_reference.py GIT_DIR` reads them again): every autosummary entry, the",
        "`tile_size` attributes and the members AWS's class templates document (tensor methods, enum",
        "members). See [nki.md](nki.md) for what each supported name does here.",
        "",
        "| Status | Meaning |",
        "|---|---|",
        f"| {SUPPORTED} | `torch_neuronx.nki` has the name (so `import nki` / `import neuronxcc.nki` does, "
        "where AWS's packages are not installed); it follows AWS's documented semantics, simulated |",
        f"| {DIFFERS} | the name exists and behaves as the note says, documented in [nki.md](nki.md) |",
        f"| {MISSING} | not provided: a kernel that uses it fails with `AttributeError` / `ImportError` |",
        "",
    ]
    current_set = {name for name, _ in current_names}
    for key, heading, only_new in (("current", "The current reference", False),
                                   ("previous", "The previous reference", True)):
        title, commit, pages, _names = REFERENCES[key]
        table = [r for r in rows(key) if not (only_new and r[0] in current_set)]
        lines += [
            f"## {heading}: {title}",
            "",
            f"Read from `{REPOSITORY}` at commit `{commit}`: " + ", ".join(f"`{p}`" for p in pages) + ".",
        ]
        if only_new:
            lines += ["Names also in the current reference are listed above only; these are the ones "
                      "the current reference no longer lists (kernels written for `neuronxcc.nki` use them)."]
        modules = list(dict.fromkeys(module for _n, module, _s, _st in table))
        lines += ["", f"{len(table)} names: " + _counts(st for *_r, st in table) + ".", "",
                  "| Module | Names | " + " | ".join(STATUSES) + " |", "|---|---|---|---|---|"]
        for module in modules:
            sts = [st for _n, m, _s, st in table if m == module]
            lines.append(f"| `{module}` | {len(sts)} | " + " | ".join(str(sts.count(s)) for s in STATUSES) + " |")
        for module in modules:
            lines += ["", f"### `{module}`" + (f" ({heading.split()[1]} reference)" if only_new else ""), "",
                      "| Name | Section | Status |", "|---|---|---|"]
            for name, m, section, st in table:
                if m == module:
                    lines.append(f"| `{name}` | {section} | {_cell(name, st)} |")
        lines.append("")
    return "\n".join(lines)


def page_is_current(text: str) -> bool:
    """Whether `text` is the page the simulator and the reference names render now."""
    return text == render_page()


def main(argv: list[str] | None = None) -> int:
    return generated_page.main(argv, prog="python -m torch_neuronx.nki.api_status", description=__doc__.split("\n\n")[0], page=PAGE,
                               render=render_page, is_current=page_is_current, regenerate=REGENERATE)

if __name__ == "__main__":
    raise SystemExit(main())
