"""Runs AWS's nki-samples kernels against their own references in this simulator
(issue #27; docs/nki.md, "The older dialect", and scripts/nki_suite/README.md).

AWS's repository is a source of facts, not part of this project: this script
exports it at a commit from a local mirror (bring it with the search tool's
`fetch` of github:aws-neuron/nki-samples) into a work folder with `git archive`
and runs it there, `neuronxcc.nki` being this simulator through the project's
import alias (torch_neuronx-nki-aliases.pth). No kernel body, test or driver is
edited. CI never runs it.

    python scripts/nki_suite/samples.py --label dec4 [--only unit tutorials/...] [--skip-unit]
    python scripts/nki_suite/samples.py --label dec4 --report-only

What runs (the manifest, MANIFEST below, one entry per kernel):

1. `unit`: the repository's own unit tests at c4b806e^ (the last commit that has
   the reference kernels they import), as its CI runs them:
   `PYTHONPATH=src pytest test/unit --simulation-only`, with its conftest, unchanged.
   Each test file is one kernel; its cases are the parametrized tests.
2. `driver`: a tutorial's or contributed kernel's own script that compares the
   kernel with NumPy / torch / JAX (`*_nki_kernels.py`, `*_torch.py`, `*_jax.py`,
   `main()`), run unchanged as `__main__` in its folder. A script that ends
   without an exception and prints no mismatch line ("differ", "Is close? False",
   "matches? False") passes. Scripts written for torch-xla get a stand-in
   `torch_xla` whose device is this project's `neuron` device (the only change
   around them: `xm.xla_device()`, `torch_xla.device()`, `xm.mark_step()`).
3. `call`: a kernel the repository gives no device-free driver for, run by a
   function here on small inputs against the repository's own reference function
   or a NumPy reference written here.

Each entry runs in a process of its own, with a time limit. Results:
<results>/<label>/summary.tsv (kernel, status, first failure reason),
cases.tsv (kernel, case, status, reason), and the logs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MIRROR = "/work/.mirror/aws-neuron+nki-samples/repo"
UNIT_COMMIT = "c4b806e^"          # the unit tests with the reference kernels they import
HEAD = "6905a68"                  # tutorials now (mxfp-matmul added, older ones removed)
OLD = "8370e11^"                  # the tutorials before the legacy ones were removed
OLD_MATMUL = "7af4e4d^"           # the matmul tutorial before its beta-2 rework

TUT = "src/nki_samples/tutorials"
MISMATCH = re.compile(r"\bdiffer\b|Is close\? False|matches\? False")


@dataclass
class Entry:
    kernel: str
    commit: str
    kind: str                     # "unit" | "driver" | "call"
    where: str                    # folder (driver, call) or test file (unit)
    scripts: list = field(default_factory=list)   # driver: [(script, argv)]
    call: str = ""                # call: name of a function below
    torch_xla: bool = False       # provide the torch_xla stand-in
    split: str = ""               # driver: a stdout line that starts a new case ("Checking correctness of X")
    timeout: int = 600


def _unit(test_file: str, kernel: str) -> Entry:
    return Entry(f"unit/{kernel}", UNIT_COMMIT, "unit", f"test/unit/{test_file}")


MANIFEST: list[Entry] = [
    # 1. the unit tests (reference kernels at c4b806e^)
    _unit("test_SD_attention_small_head.py", "attention.fused_self_attn_for_SD_small_head_size"),
    _unit("test_adaptive_avg_pool2d.py", "vision.adaptive_avg_pool2d_kernel"),
    _unit("test_allocated_SD_attention_small_head.py",
          "allocated_attention.allocated_fused_self_attn_for_SD_small_head_size"),
    _unit("test_double_row_matmul.py", "double_row_matmul.quantized_double_row_matmul"),
    # the same test's recipe, run here at a smaller K (its test returns at once off a trn2 instance; see NOT_COUNTED)
    Entry("unit-recipe/double_row_matmul.quantized_double_row_matmul", UNIT_COMMIT, "call", "test/unit",
          call="double_row_matmul"),
    _unit("test_flash_attn_bwd.py", "attention.flash_attn_bwd"),
    _unit("test_flash_attn_fwd.py", "attention.flash_fwd"),
    _unit("test_resize_nearest.py", "vision.resize_nearest_fixed_dma_kernel"),
    _unit("test_rmsnorm_qkv.py", "allocated_fused_linear.allocated_fused_rms_norm_qkv"),
    _unit("test_select_and_scatter.py", "vision.select_and_scatter_kernel"),
    # 2. tutorials at HEAD, their own drivers
    Entry("tutorials/tensor_addition", HEAD, "driver", f"{TUT}/tensor_addition",
          [("tensor_addition_nki_kernels.py", []), ("tensor_addition_torch.py", []),
           ("tensor_addition_jax.py", [])], torch_xla=True),
    Entry("tutorials/spmd_tensor_addition", HEAD, "driver", f"{TUT}/tensor_addition",
          [("spmd_tensor_addition_nki_kernels.py", []), ("spmd_tensor_addition_torch.py", []),
           ("spmd_tensor_addition_jax.py", [])], torch_xla=True),
    Entry("tutorials/spmd_multiple_nc_tensor_addition", HEAD, "driver", f"{TUT}/tensor_addition",
          [("spmd_multiple_nc_tensor_addition_nki_kernels.py", []),
           ("spmd_multiple_nc_tensor_addition_torch.py", []),
           ("spmd_multiple_nc_tensor_addition_jax.py", [])], torch_xla=True),
    Entry("tutorials/transpose2d", HEAD, "driver", f"{TUT}/transpose2d",
          [("transpose2d_nki_kernels.py", []), ("transpose2d_torch.py", []), ("transpose2d_jax.py", [])],
          torch_xla=True),
    Entry("tutorials/average_pool2d", HEAD, "driver", f"{TUT}/average_pool2d",
          [("average_pool2d_nki_kernels.py", []), ("average_pool2d_torch.py", []),
           ("average_pool2d_jax.py", [])], torch_xla=True),
    # mamba_v1 against PyTorch (mamba_torch.py); v2 and v3 against v1 (mamba_nki_kernels.py), as AWS chains them
    Entry("tutorials/fused_mamba.mamba_v1", HEAD, "driver", f"{TUT}/fused_mamba",
          [("mamba_torch.py", [])], torch_xla=True),
    Entry("tutorials/fused_mamba.mamba_v2", HEAD, "driver", f"{TUT}/fused_mamba",
          [("mamba_nki_kernels.py", ["--version", "v2", "--seq_len", "512"])]),
    Entry("tutorials/fused_mamba.mamba_v3", HEAD, "driver", f"{TUT}/fused_mamba",
          [("mamba_nki_kernels.py", ["--version", "v3", "--seq_len", "512"])]),
    Entry("tutorials/matrix_multiplication", HEAD, "driver", f"{TUT}/matrix_multiplication",
          [("matrix_multiplication_torch.py", [])], torch_xla=True, split="Checking correctness of "),
    Entry("tutorials/mxfp-matmul", HEAD, "driver", f"{TUT}/mxfp-matmul",
          [("mx_toplevel.py", [])], torch_xla=True),
    *[Entry(f"tutorials/attention_fwd_performance.attn_fwd_{v}", HEAD, "call",
            f"{TUT}/attention_fwd_performance", call="attention_tutorial")
      for v in ("v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v8a", "v9", "v10", "v11")],
    # 3. tutorials removed since (8370e11^) and the matmul tutorial before its rework (7af4e4d^)
    Entry("tutorials-old/matrix_multiplication", OLD_MATMUL, "driver", f"{TUT}/matrix_multiplication",
          [("matrix_multiplication_torch.py", [])], torch_xla=True, split="Checking correctness of "),
    Entry("tutorials-old/layernorm.nki_layernorm_kernel_v1", OLD, "call", f"{TUT}/layernorm", call="layernorm"),
    Entry("tutorials-old/layernorm.nki_layernorm_kernel_v2", OLD, "call", f"{TUT}/layernorm", call="layernorm"),
    Entry("tutorials-old/rmsnorm", OLD, "driver", f"{TUT}/rmsnorm",
          [("rmsnorm_torch.py", []), ("rmsnorm_jax.py", [])], torch_xla=True),
    Entry("tutorials-old/softmax", OLD, "driver", f"{TUT}/softmax", [("softmax_torch.py", [])], torch_xla=True),
    Entry("tutorials-old/sd_attention", OLD, "driver", f"{TUT}/sd_attention",
          [("sd_attention_torch.py", [])], torch_xla=True),
    Entry("tutorials-old/rotary", OLD, "call", f"{TUT}/rotary", call="rotary", torch_xla=True),
    # 4. contributed kernels (HEAD)
    Entry("contributed/interpolate_bilinear_fwd", HEAD, "call", "contributed", call="contributed_check"),
    Entry("contributed/interpolate_trilinear_fwd", HEAD, "call", "contributed", call="contributed_check",
          torch_xla=True),
    Entry("contributed/matmul", HEAD, "call", "contributed", call="contributed_check", timeout=1500),
    Entry("contributed/maxpooling", HEAD, "call", "contributed", call="contributed_check"),
    # its own module-level driver (seqlen 16K, bfloat16, against its cpu_attention_forward)
    Entry("contributed/pipelined_attention", HEAD, "driver", "contributed", [("pipelined_attention.py", [])]),
]


# Entries left out of the yardstick, with the reason (they are still run and listed).
NOT_COUNTED = {
    "unit/double_row_matmul.quantized_double_row_matmul":
        "its test reads /sys/devices/virtual/dmi/id/product_name and returns before running the kernel unless "
        "the instance is a trn2 (so on AWS's CI it passes without running it); the file is absent in this "
        "container and its fallback calls `warnings` without importing it (NameError). The kernel is counted "
        "through unit-recipe/double_row_matmul instead",
}


# Why the kernels that still fail fail (December 5 2026, triaged by hand from the logs), for the
# summary's last column. "owner:" marks a simulator gap another change owns.
TRIAGE = {
    "unit/attention.flash_attn_bwd":
        "nisa.nc_matmul takes a value-returned nisa.nc_transpose (Tensor Engine: its result is in PSUM) as "
        "stationary; NKI 0.1.0's reference says too that nc_matmul reads SBUF only (the rule stays; its "
        "affine_select from PSUM is NKI 0.1.0's and passes now); at seqlen 8192 / 4 heads the test's own NumPy "
        "reference outgrows the harness's 14 GiB cap (MemoryError)",
    "unit/vision.resize_nearest_fixed_dma_kernel":
        "nl.floor(int32_tile / out_w, dtype=int32): by AWS's type promotion (a Python int is a weak int32, in "
        "NKI 0.1.0's rules too) the quotient is int32, computed in float32 and converted on output, to nearest "
        "here (AWS does not document the conversion; its nki-library floors through it as round(x / y - 0.5)), "
        "so 2241 / 38 = 58.97 -> 59 and the floor changes nothing: the last rows' source index leaves the input",
    "contributed/pipelined_attention":
        "its module-level driver launches flash_fwd[0] (a grid of 0 programs; the file says it is tested only "
        "against AWS's internal nightly builds)",
}


def _clean(reason: str) -> str:
    return re.sub(r"/tmp/nki-suite/samples/[0-9a-f]+/", "", reason).replace("torch_neuronx.nki.errors.", "")


# ----------------------------------------------------------------------------- export
def export(mirror: str, commit: str, root: Path) -> Path:
    sha = subprocess.run(["git", "--git-dir", mirror, "rev-parse", "--short", commit], check=True,
                         capture_output=True, text=True).stdout.strip()
    work = root / sha
    if not (work / ".exported").exists():
        work.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "--git-dir", mirror, "archive", sha], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        (work / ".exported").write_text(commit + "\n")
    return work


def _shim(root: Path) -> Path:
    """The torch_xla stand-in: the XLA device is this project's `neuron` device."""
    shim = root / "torch_xla_shim"
    core = shim / "torch_xla" / "core"
    core.mkdir(parents=True, exist_ok=True)
    (shim / "torch_xla" / "__init__.py").write_text(
        '"""nki_suite stand-in for torch-xla: the device is torch_neuronx\'s `neuron` device."""\n'
        "import torch\n\n\ndef device(n=None):\n    return torch.device('neuron')\n")
    (core / "__init__.py").write_text("")
    (core / "xla_model.py").write_text(
        "import torch\n\n\ndef xla_device(n=None, devkind=None):\n    return torch.device('neuron')\n\n\n"
        "def mark_step(wait=False):\n    pass\n")
    return shim


def check_alias(python: str) -> str:
    """`neuronxcc.nki` and `nki` must be this simulator in the processes the suite starts (the
    project's .pth alias, active only where AWS's packages are absent). Returns its location."""
    probe = ("import neuronxcc.nki as a, nki as b, torch_neuronx.nki as c; "
             "assert a is c and b is c, (a, b, c); print(c.__file__)")
    got = subprocess.run([python, "-c", probe], env=_env([]), capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit("samples.py: `import neuronxcc.nki` is not torch_neuronx.nki in this interpreter "
                         "(install the alias: python -m torch_neuronx._nki_aliases):\n" + got.stderr[-2000:])
    return got.stdout.strip()


def _env(pythonpath: list[str]) -> dict:
    caller = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join([*pythonpath, *([caller] if caller else [])]))


# ----------------------------------------------------------------------------- the unit tests
@contextlib.contextmanager
def _alarm(seconds: int):
    def on_alarm(signum, frame):
        raise TimeoutError(f"nki_suite: over the {seconds} s time limit")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


try:  # the per-test time limit, a pytest hook (run_unit loads this file with `-p samples`)
    import pytest as _pytest

    @_pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item):
        with _alarm(int(os.environ.get("NKI_SUITE_TIMEOUT", "300"))):
            yield
except ImportError:
    pass


def _memory_limit(gib: float):
    """A preexec_fn capping the child's address space: a test that outgrows it fails with MemoryError
    instead of waking the kernel's OOM killer on a shared machine."""
    def limit():
        import resource
        size = int(gib * 2 ** 30)
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    return limit if gib > 0 else None


def run_unit(entries: list[Entry], work: Path, out: Path, python: str, timeout: int, mem_gib: float) -> None:
    """One pytest process per test file (its memory returns between files), results in unit-<file>.xml."""
    env = _env([str(work / "src"), str(HERE)])
    env["NKI_SUITE_TIMEOUT"] = str(timeout)
    for entry in entries:
        name = Path(entry.where).stem
        xml = out / f"unit-{name}.xml"
        xml.unlink(missing_ok=True)
        (out / f"unit-{name}.died").unlink(missing_ok=True)  # a rerun's result is not an earlier run's death
        with open(out / f"unit-{name}.log", "w") as log:
            subprocess.run([python, "-m", "pytest", entry.where, "--simulation-only", "-p", "samples", "-p",
                            "no:cacheprovider", "-o", "junit_family=xunit1", f"--junitxml={xml}",
                            "-q", "--no-header", "-rN", "--tb=short", "--continue-on-collection-errors"],
                           cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                           preexec_fn=_memory_limit(mem_gib))
        if not xml.exists():
            tail = (out / f"unit-{name}.log").read_text(errors="replace").strip().splitlines()[-1:] or [""]
            (out / f"unit-{name}.died").write_text(tail[0][:200] + "\n")
        print(f"{entry.kernel}: {name} done", flush=True)


def unit_cases(out: Path) -> dict[str, list]:
    """{test file: [(case, status, reason)]} from unit.xml."""
    got: dict[str, list] = {}
    for died in out.glob("unit-*.died"):
        got[f"test/unit/{died.stem[5:]}.py"] = [("(file)", "error", "the test process died: " + died.read_text().strip())]
    cases = [c for xml in sorted(out.glob("unit*.xml")) for c in ET.parse(xml).getroot().iter("testcase")]
    for case in cases:
        status, reason = "passed", ""
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                status = tag
                reason = _first_line(node.get("message") or node.text or "")
        if case.find("skipped") is not None:
            status = "skipped"
        file = case.get("file") or ""
        if not file:  # junit_family xunit2 has no file attribute: test.unit.test_x.TestClass -> test/unit/test_x.py
            parts = (case.get("classname") or "").split(".")
            names = [p for p in parts if p.startswith("test_")]
            file = "/".join(parts[:parts.index(names[0]) + 1]) + ".py" if names else ""
        got.setdefault(file, []).append((case.get("name"), status, reason))
    return got


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300].replace("\t", " ")


# ----------------------------------------------------------------------------- drivers and calls
def run_entry(entry: Entry, work: Path, out: Path, python: str, shim: Path, mem_gib: float = 0,
              deps: str = "") -> list:
    """Runs one entry in a child process (this file with --child); returns [(case, status, reason)].
    `deps`: a folder of the pure-Python packages a driver imports that the project does not install
    (loguru for the rotary tutorial; README.md), last on the path."""
    folder = work / entry.where
    path = [str(folder), str(work / "src")] + ([str(shim)] if entry.torch_xla else []) + ([deps] if deps else [])
    result = out / "cases" / (entry.kernel.replace("/", "__") + ".json")
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    log = out / "logs" / (entry.kernel.replace("/", "__") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log, "w") as f:
            subprocess.run([python, str(Path(__file__).resolve()), "--child", entry.kernel, "--work",
                            str(work), "--child-out", str(result)], cwd=folder, env=_env(path),
                           stdout=f, stderr=subprocess.STDOUT, timeout=entry.timeout,
                           preexec_fn=_memory_limit(mem_gib))
    except subprocess.TimeoutExpired:
        return [("(entry)", "error", f"over the {entry.timeout} s time limit")]
    if not result.exists():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        return [("(entry)", "error", f"the process died: {tail[0][:200]}")]
    return json.loads(result.read_text())


def _run_script(script: str, argv: list) -> str:
    """Runs a script as __main__ (its stdout captured and echoed); returns its stdout."""
    buf = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, s):
            buf.write(s)
            sys.__stdout__.write(s)
            return len(s)

    old_argv = sys.argv
    sys.argv = [script, *argv]
    try:
        with contextlib.redirect_stdout(Tee()):
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = old_argv
    return buf.getvalue()


def _reason(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    text = _first_line(f"{type(exc).__name__}: {exc}") or type(exc).__name__
    return (text + where)[:300]


def child_driver(entry: Entry) -> list:
    cases = []
    for script, argv in entry.scripts:
        name = script + (" " + " ".join(argv) if argv else "")
        try:
            stdout = _run_script(script, argv)
        except SystemExit as e:
            if e.code not in (0, None):
                cases.append((name, "failure", f"exit {e.code}"))
                continue
            stdout = ""
        except BaseException as e:  # noqa: BLE001 - every failure is a result
            traceback.print_exc()
            cases.append((name, "failure", _reason(e)))
            continue
        if entry.split:
            parts = stdout.split(entry.split)
            for part in parts[1:]:
                title = part.splitlines()[0].strip()
                bad = MISMATCH.search(part)
                cases.append((f"{name}: {title}", "failure" if bad else "passed",
                              f"mismatch: {bad.group(0)!r} printed" if bad else ""))
            head = MISMATCH.search(parts[0])
            if head:
                cases.append((name, "failure", f"mismatch: {head.group(0)!r} printed"))
            continue
        bad = MISMATCH.search(stdout)
        cases.append((name, "failure" if bad else "passed", f"mismatch: {bad.group(0)!r} printed" if bad else ""))
    return cases


def _case(cases: list, name: str, fn) -> None:
    """Runs fn() (which asserts); records the case."""
    try:
        fn()
        cases.append((name, "passed", ""))
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        cases.append((name, "failure", _reason(e)))


def call_attention_tutorial(entry: Entry) -> list:
    """The tutorial's own test (test_attention.py, unchanged): its module runs
    test_attn_tutorial("accuracy", attn_fwd_v1) when loaded; the other versions are
    the same function called with them (seqlen 4096, float32, against its
    numpy_attention at atol 1e-2)."""
    version = entry.kernel.rsplit("attn_fwd_", 1)[1]
    source = Path("test_attention.py").read_text()
    ns = {"__name__": "test_attention", "__file__": str(Path("test_attention.py").resolve())}
    import pytest  # noqa: F401  (the test file uses pytest.xfail through `from attention_kernels import *`)
    ns.setdefault("pytest", pytest)
    cases = []
    try:
        exec(compile(source, "test_attention.py", "exec"), ns)
        loaded = None
    except BaseException as e:  # noqa: BLE001 - the module's own v1 call failed
        traceback.print_exc()
        loaded = e
    if version == "v1":
        cases.append(("test_attn_tutorial('accuracy', attn_fwd_v1) [module level]",
                      "failure" if loaded else "passed", _reason(loaded) if loaded else ""))
        return cases
    if "test_attn_tutorial" not in ns:
        return [("(load)", "failure", _reason(loaded))]
    fn = ns["test_attn_tutorial"]
    kernel = ns[f"attn_fwd_{version}"]
    _case(cases, f"test_attn_tutorial('accuracy', attn_fwd_{version})", lambda: fn("accuracy", kernel))
    return cases


def call_double_row_matmul(entry: Entry) -> list:
    """test_double_row_matmul.py's own recipe (its reshape, column_wise_quantize, casts, simulate_kernel
    and its check, rtol 2e-2 against the float64 matmul) at K 2048 instead of 16384."""
    import numpy as np
    mod = runpy.run_path("test_double_row_matmul.py", run_name="test_double_row_matmul")
    nl = mod["nl"]
    cases = []
    for m, k, n, tiles in ((256, 2048, 1024, (2, 2, 16)), (512, 4096, 1024, (4, 1, 32))):
        def check(m=m, k=k, n=n, tiles=tiles):
            rng = np.random.default_rng(k)
            lhs, rhs = rng.random((m, k)), rng.random((k, n))
            golden = lhs @ rhs
            scale, quantized = mod["column_wise_quantize"](rhs)
            lhs_c = nl.static_cast(lhs, nl.bfloat16)
            scale_c = nl.static_cast(scale, nl.bfloat16)
            rhs_c = nl.static_cast(mod["reshape"](quantized), nl.float8_e4m3)
            got = mod["simulate_kernel"](mod["baremetal"](mod["quantized_double_row_matmul"]), lhs_c, rhs_c, scale_c,
                                         *tiles)
            assert np.allclose(golden, got.astype(np.float32), rtol=2e-2)
        _case(cases, f"M={m} K={k} N={n} tiles={tiles}", check)
    return cases


def call_layernorm(entry: Entry) -> list:
    """layernorm_torch.py imports the kernels from neuronxcc's own docs package, so it
    cannot run here; the kernels of layernorm_nki_kernel.py against a NumPy layernorm
    with that driver's tolerances (atol 1e-3, rtol 1e-2)."""
    import numpy as np
    version = entry.kernel.rsplit(".", 1)[1]
    mod = runpy.run_path("layernorm_nki_kernel.py", run_name="layernorm_nki_kernel")
    kernel = mod[version]
    cases = []
    for rows, cols in ((300, 1000), (128, 512), (257, 64)):
        rng = np.random.default_rng(rows)
        x = rng.random((rows, cols), dtype=np.float32)
        gamma = rng.random(cols, dtype=np.float32)
        beta = rng.random(cols, dtype=np.float32)

        def check(x=x, gamma=gamma, beta=beta):
            got = kernel(x, 1e-5, gamma, beta)
            x64 = x.astype(np.float64)
            ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * gamma + beta
            np.testing.assert_allclose(got, ref, atol=1e-3, rtol=1e-2)
        _case(cases, f"{version} [{rows}x{cols}] float32", check)
    return cases


def call_rotary(entry: Entry) -> list:
    """rotary_nki_kernels.py needs loguru (from --deps), transformers and torch_xla at import. Its
    run_test compares the kernel with `torch_neuronx.trace(neuron_apply_rotary_embedding, ...)`:
    the XLA-era torch-neuronx's inference tracing API, which TorchNeuron does not have. Here run_test's
    steps without the tracing and profiling: the same inputs (generate_pos_embedding), the file's own
    reference function run by PyTorch on the CPU (what the trace compiles), the kernel launched on the
    `neuron` device as run_test launches it, and the file's own verify_results at run_test's default
    rtol / atol 1e-5."""
    import importlib
    missing = [m for m in ("loguru", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return [("(import)", "not-run", f"needs {', '.join(missing)} (not installed here)")]
    import torch
    mod = runpy.run_path("rotary_nki_kernels.py", run_name="rotary_nki_kernels")
    cases = []

    def run(bs, nh, sl, hd):
        cache_ids = torch.stack([torch.arange(sl) for _ in range(bs)])
        q, k = torch.randn(bs, nh, sl, hd), torch.randn(bs, nh, sl, hd)
        cos, sin = mod["generate_pos_embedding"](hd, cache_ids)
        expected_q, expected_k = mod["neuron_apply_rotary_embedding"](q, k, cos, sin)
        device = torch.device("neuron")
        result = mod["nki_apply_rotary_embedding"][bs, nh](q.to(device), k.to(device), cos.to(device),
                                                           sin.to(device))
        assert mod["verify_results"](result, expected_q, expected_k, rtol=1e-5, atol=1e-5), "verify_results: False"

    for shape in ((1, 2, 128, 64), (2, 4, 256, 128)):
        _case(cases, f"run_test{shape} without torch_neuronx.trace", lambda shape=shape: run(*shape))
    return cases


def call_contributed_check(entry: Entry) -> list:
    """The file's own check_correct() (its main() also benchmarks; the benchmark is not the yardstick)."""
    name = entry.kernel.rsplit("/", 1)[1]
    buf = io.StringIO()
    cases = []

    def check():
        mod = runpy.run_path(f"{name}.py", run_name=name)
        with contextlib.redirect_stdout(buf):
            mod["check_correct"]()
        sys.stdout.write(buf.getvalue())
        bad = MISMATCH.search(buf.getvalue())
        assert not bad, f"mismatch: {bad.group(0)!r} printed"
    _case(cases, f"{name}.check_correct()", check)
    return cases


def child(kernel: str, result: Path) -> None:
    entry = next(e for e in MANIFEST if e.kernel == kernel)
    sys.path[:0] = [os.getcwd()]
    try:
        if entry.kind == "driver":
            cases = child_driver(entry)
        else:
            cases = globals()[f"call_{entry.call}"](entry)
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        cases = [("(entry)", "error", _reason(e))]
    result.write_text(json.dumps(cases))


# ----------------------------------------------------------------------------- report
def report(out: Path) -> None:
    rows = []
    all_cases = []
    units = unit_cases(out)
    for entry in MANIFEST:
        if entry.kind == "unit":
            cases = units.get(entry.where)
        else:
            f = out / "cases" / (entry.kernel.replace("/", "__") + ".json")
            cases = json.loads(f.read_text()) if f.exists() else None
        if cases is None:
            continue
        if entry.kernel in NOT_COUNTED:
            cases = [(c[0], "not-counted", c[2]) for c in cases]
        all_cases += [(entry.kernel, *c) for c in cases]
        failed = [c for c in cases if c[1] in ("failure", "error")]
        ran = [c for c in cases if c[1] in ("passed", "failure", "error")]
        status = "not-run" if not ran else ("failed" if failed else "passed")
        reason = failed[0][2] if failed else (cases[0][2] if status == "not-run" and cases else "")
        if entry.kernel in NOT_COUNTED:
            status, reason = "not-counted", NOT_COUNTED[entry.kernel]
            cases = [(c[0], "not-counted", c[2]) for c in cases]
        triage = "" if status == "passed" else TRIAGE.get(entry.kernel, "")
        rows.append((entry.kernel, status, f"{len(ran) - len(failed)}/{len(ran)}", _clean(reason), triage))
    with open(out / "summary.tsv", "w") as f:
        f.write("kernel\tstatus\tcases passed\tfirst failure reason\twhy (triage)\n")
        for row in rows:
            f.write("\t".join(row) + "\n")
    with open(out / "cases.tsv", "w") as f:
        f.write("kernel\tcase\tstatus\treason\n")
        for row in all_cases:
            f.write("\t".join(_clean(str(x)) for x in row) + "\n")
    width = max((len(r[0]) for r in rows), default=10)
    for kernel, status, frac, reason, _ in rows:
        print(f"{kernel:{width}}  {status:8} {frac:>7}  {reason[:110]}")
    ran = [r for r in rows if r[1] in ("passed", "failed")]
    passed = sum(r[1] == "passed" for r in rows)
    cases_ran = [c for c in all_cases if c[2] in ("passed", "failure", "error")]
    cases_ok = sum(c[2] == "passed" for c in cases_ran)
    print(f"kernels: {passed}/{len(ran)} pass ({len(rows) - len(ran)} not run); "
          f"cases: {cases_ok}/{len(cases_ran)} pass")
    print(f"summary: {out / 'summary.tsv'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label")
    parser.add_argument("--mirror", default=DEFAULT_MIRROR)
    parser.add_argument("--work", default="/tmp/nki-suite/samples", help="where the commits are exported")
    parser.add_argument("--results", default="/tmp/nki-suite-results/samples")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch_neuronx")
    parser.add_argument("--only", nargs="*", help="kernels whose id starts with one of these")
    parser.add_argument("--deps", default="/tmp/nki-suite-deps",
                        help="pure-Python packages some drivers import (pip --target; README.md)")
    parser.add_argument("--skip-unit", action="store_true")
    parser.add_argument("--unit-timeout", type=int, default=300, help="seconds per unit test")
    parser.add_argument("--mem-limit-gb", type=float, default=14,
                        help="address-space limit of each test process (0: none); a test past it fails "
                             "with MemoryError")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, Path(args.child_out))
        return 0
    if not args.label:
        parser.error("--label is required")
    out = Path(args.results) / args.label
    out.mkdir(parents=True, exist_ok=True)
    root = Path(args.work)
    if not args.report_only:
        print(f"neuronxcc.nki is {check_alias(args.python)}", flush=True)
        chosen = [e for e in MANIFEST if not args.only or any(e.kernel.startswith(o) for o in args.only)]
        units = [e for e in chosen if e.kind == "unit" and not args.skip_unit]
        if units:
            start = time.perf_counter()
            run_unit(units, export(args.mirror, UNIT_COMMIT, root), out, args.python, args.unit_timeout,
                     args.mem_limit_gb)
            print(f"unit: {time.perf_counter() - start:.0f} s", flush=True)
        shim = _shim(root)
        for entry in chosen:
            if entry.kind == "unit":
                continue
            start = time.perf_counter()
            cases = run_entry(entry, export(args.mirror, entry.commit, root), out, args.python, shim,
                              args.mem_limit_gb, args.deps if os.path.isdir(args.deps) else "")
            f = out / "cases" / (entry.kernel.replace("/", "__") + ".json")
            f.write_text(json.dumps(cases))
            ok = sum(c[1] == "passed" for c in cases)
            print(f"{entry.kernel}: {ok}/{len(cases)} cases pass, {time.perf_counter() - start:.0f} s", flush=True)
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
