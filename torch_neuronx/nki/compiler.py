"""`nki.compiler`: importable so that kernels which `import nki.compiler` load.

AWS's module holds the compiler's controls (Kernel Builder, target detection); none of them is
emulated yet, so a kernel that calls into it fails with an AttributeError naming the function.
"""
