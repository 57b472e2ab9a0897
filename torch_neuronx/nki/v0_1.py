"""What a kernel written for NKI 0.1.0 (`neuronxcc.nki`) keeps of that version where AWS changed it.

Which kernels: those whose module imports `neuronxcc.nki` and not `nki` (written_for_nki_0_1); the
launch marks their programs (`Run.nki_0_1`). The rules that differ, each from AWS's documents:

- nl loops traced once (LoopTrace, here). AWS's NKI migration guide, "Changes in NKI 0.2.0 from NKI
  0.1.0", "Consistent control flow behavior": in NKI 0.1.0 range iterators were special objects
  that captured the loop body, so "loops were only executed once by the Python evaluator"; NKI
  0.2.0 and later run the body per iteration, as the simulator does (it executes, it does not
  trace). Where that shows in AWS's 0.1.0 kernels: direct allocation from Python state the body
  updates (nki-samples' allocated attention adds to a `cur_addr` in an `nl.affine_range` body and
  places the body's tensors at it). Traced once, every iteration's tensor has the first (only)
  trace's address; run per iteration, the addresses walk past the end of SBUF. So a direct
  allocation made in a later iteration of an `nl.affine_range` / `nl.sequential_range` loop takes
  the placement that the same call (same line, same call stack, same occurrence in the iteration)
  made in the loop's first iteration. Nothing else is replayed: other Python state in a body is the
  kernel's own, and AWS's 0.1.0 kernels do not depend on it. `nl.static_range` (unrolled at trace
  time) and Python's `range` run per iteration in both versions here.
- `nisa.affine_select` reads a PSUM `on_true_tile` (isa.select_where): 0.1.0's reference gives it no
  buffer rule and AWS's 0.1.0 kernels select from the matmul's PSUM tile; 0.2.0+: GpSimd cannot
  access PSUM.
- `nisa.tensor_tensor` (0.1.0's value-returning form) broadcasts an input along the free axes
  (isa/value_forms.py): 0.1.0's reference points kernels that need "broadcasting capability in the
  free dimension for either input tile" to tensor_scalar as the faster way, and nki-samples'
  double-row matmul multiplies a [128, 1024] tile by a [128, 1] one; 0.2.0+'s reference requires the
  same number of elements per partition and drops the remark.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections import Counter

from .errors import _PACKAGE_DIR
from .runtime import active

# `import neuronxcc.nki...` / `from neuronxcc.nki... import` / `from neuronxcc import nki`.
_NKI_0_1_IMPORT = re.compile(r"^\s*(import\s+neuronxcc\.nki|from\s+neuronxcc\.nki[\s.]|from\s+neuronxcc\s+import\s+nki)",
                             re.MULTILINE)
# `import nki...` / `from nki... import`: NKI 0.2.0+ (nki-library's router_topk imports both).
_NKI_0_2_IMPORT = re.compile(r"^\s*(import\s+nki\b|from\s+nki[\s.])", re.MULTILINE)
_SOURCES: dict = {}


def written_for_nki_0_1(func) -> bool:
    """Whether the module that defines `func` imports `neuronxcc.nki` (NKI 0.1.0's package name)
    and not `nki` (NKI 0.2.0+'s, whose modules may still take `neuronxcc.nki.typing`). A function
    without readable source is taken as NKI 0.2.0+."""
    code = getattr(func, "__code__", None)
    filename = code.co_filename if code is not None else None
    if filename is None:
        return False
    if filename not in _SOURCES:
        source = "".join(linecache.getlines(filename))
        _SOURCES[filename] = bool(_NKI_0_1_IMPORT.search(source)) and not _NKI_0_2_IMPORT.search(source)
    return _SOURCES[filename]


def in_nki_0_1_kernel() -> bool:
    """Whether the kernel being simulated was written for NKI 0.1.0."""
    run = active()
    return run is not None and run.nki_0_1


class LoopTrace:
    """One program's open nl loops and, while any is open, the placements made in first iterations."""

    def __init__(self):
        self.open: list[Counter] = []  # per open loop, innermost last: call sites seen this iteration
        self.placements: dict = {}

    def loop(self, iterations):
        """An nl.affine_range / nl.sequential_range over `iterations` (a range)."""
        return _Loop(self, iterations)

    def once(self, key, compute):
        """`compute()`'s result for a placement `key` made at the caller's call stack: inside an open
        loop, the result the same call had in the first iteration (computed then)."""
        if not self.open:
            return compute()
        site = _user_stack()
        seen = self.open[-1]
        nth = seen[site]
        seen[site] += 1
        memo_key = (key, site, nth)
        if memo_key not in self.placements:
            self.placements[memo_key] = compute()
        return self.placements[memo_key]


class _Loop:
    """An nl loop's range that tells its LoopTrace when it starts, steps and ends."""

    __slots__ = ("trace", "iterations")

    def __init__(self, trace: LoopTrace, iterations: range):
        self.trace = trace
        self.iterations = iterations

    def __len__(self):
        return len(self.iterations)

    def __getitem__(self, index):
        return self.iterations[index]

    def __iter__(self):
        trace = self.trace
        seen = Counter()
        trace.open.append(seen)
        try:
            for i in self.iterations:
                seen.clear()
                yield i
        finally:
            del trace.open[next(k for k, s in enumerate(trace.open) if s is seen)]
            if not trace.open:  # the outermost loop ended: a later loop is traced anew
                trace.placements.clear()

    def __repr__(self):
        return f"nl loop over {self.iterations!r}"


def _user_stack() -> tuple:
    """(file, line) of the kernel's frames that made the current call, innermost first."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    sites = []
    while frame is not None and not frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        sites.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(sites)
