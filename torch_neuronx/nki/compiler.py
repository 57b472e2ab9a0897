"""`nki.compiler` (also `neuronxcc.nki.compiler`, `ncc`): direct allocation and kernel decorators.

- `sbuf.mod_alloc`, `sbuf.alloc`, `psum.mod_alloc`, `psum.alloc`: place a tensor's tiles at given
  addresses (`buffer=` of `nl.ndarray`); see allocation.py for the semantics.
- `sbuf.auto_alloc()` / `psum.auto_alloc()`: the compiler's own placement, i.e. `nl.sbuf` / `nl.psum`.
- `skip_middle_end_transformations`, `enable_stack_allocator`, `force_auto_alloc` (kernel decorators)
  and `no_reorder()` (a loop directive) steer the compiler's scheduling and allocation passes; the
  simulator executes instructions in program order with the placement the kernel gives, so they
  change nothing here and return what they decorate.
"""

import types as _types

from . import allocation as _al
from .tensor import psum as _psum, sbuf as _sbuf

sbuf = _types.SimpleNamespace(
    alloc=lambda func: _al.DirectBuffer("sbuf", func),
    mod_alloc=_al.sbuf_mod_alloc,
    auto_alloc=lambda: _sbuf,
)
psum = _types.SimpleNamespace(
    alloc=lambda func: _al.DirectBuffer("psum", func),
    mod_alloc=_al.psum_mod_alloc,
    auto_alloc=lambda: _psum,
)


def _passthrough(fn=None, **_options):
    """A decorator that leaves the kernel as it is (usable with or without arguments)."""
    return fn if fn is not None else (lambda f: f)


skip_middle_end_transformations = _passthrough
enable_stack_allocator = _passthrough
force_auto_alloc = _passthrough


class no_reorder:
    """`nl.sequential_range(n, directives=ncc.no_reorder())`: keep the loop's instruction order
    (the simulator always does)."""

    def __repr__(self):
        return "nki.compiler.no_reorder()"
