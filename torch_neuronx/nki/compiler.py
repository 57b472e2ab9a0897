"""`nki.compiler`: importable so that kernels which `import nki.compiler` load.

AWS's module holds the compiler's controls (Kernel Builder, target detection, direct allocation);
they steer code generation, not what a kernel computes. The simulator has only the ones that can be
honoured by doing nothing; any other fails with an AttributeError naming it.
"""

from __future__ import annotations


def skip_middle_end_transformations(kernel):
    """`@nki.compiler.skip_middle_end_transformations`: asks AWS's compiler to lower the kernel as
    written, without its loop and layout rewrites. The simulator never rewrites a kernel: it returns
    the function unchanged (on either side of `@nki.jit`)."""
    return kernel


__all__ = ["skip_middle_end_transformations"]
