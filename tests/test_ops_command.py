"""`torch-neuronx ops` and docs/supported-operators.md (torch_neuronx/op_support.py).

The page is regenerated in memory and compared with the file. The command's
answers are checked against the registry and the lowering table, and the
claims against what the device does: a native op runs on the device without
the fallback, a fallback op shows up in torch_neuronx.get_fallback_ops(), a
lowered op compiles under torch.compile(backend="neuron"), an unlowered one
raises NeuronCompileError naming it, the fp64 rule holds as stated.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx import _torch_version, cli, lowering
from torch_neuronx.compiler import NeuronCompileError, decomposition_table
from torch_neuronx import op_support as support
from torch_neuronx.ops import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEVICE = "neuron"


def _ops(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["ops", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _record(capsys, name: str) -> dict:
    code, out, err = _ops(capsys, name, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["schema_version"] == 1
    (record,) = report["ops"]
    assert record["query"] == name
    return record


@pytest.fixture
def quiet():
    torch_neuronx.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch_neuronx:")
        yield


# ------------------------------------------------------------- the page


def test_supported_operators_page_is_up_to_date():
    page = support.PAGE
    assert page == ROOT / "docs" / "supported-operators.md"
    # The page names the release it was written with; on the other supported one it must hold op for op.
    assert support.page_is_current(page.read_text()), (
        f"docs/supported-operators.md is out of date: run `{support.REGENERATE}`")


def test_page_lists_the_native_set_and_every_lowered_op_once():
    rows = [line.split(" | ")[0].strip("| `") for line in support.PAGE.read_text().splitlines()
            if line.startswith("| `")]
    assert rows == sorted(rows) and len(rows) == len(set(rows))
    aten_lowered = {name for name in lowering.lowered_op_names() if hasattr(torch.ops.aten, name)}
    assert set(rows) == set(registry.NATIVE_OPS) | aten_lowered


def test_check_mode_of_the_generator(tmp_path, capsys):
    assert support.main(["--check"]) == 0
    stale = tmp_path / "page.md"
    stale.write_text("# old\n")
    assert support.main(["--check", "--output", str(stale)]) == 1
    assert support.REGENERATE in capsys.readouterr().err
    assert support.main(["--write", "--output", str(stale)]) == 0
    assert stale.read_text() == support.render_page()
    # written with another supported release: current while every op row is the same, not when one differs
    page = support.render_page()
    assert support.page_is_current(page.replace(f"(torch {torch.__version__})", "(torch 2.14.1+cu130)"))
    assert not support.page_is_current(page.replace("| `add` |", "| `add_` |", 1))


# ------------------------------------------------------------- ops add


def test_add_is_native_and_lowered(capsys, quiet):
    record = _record(capsys, "add")
    assert (record["op"], record["eager"], record["compile"]) == ("add", "native", "lowered")
    assert record["overload"] is None and record["graph_break"] is False
    # independently: the registry and the lowering table
    assert "add" in registry.NATIVE_OPS and "add" not in registry.DIRECT_KERNELS
    assert lowering.lookup(torch.ops.aten.add.Tensor) is not None
    assert "lowering/elementwise.py" in record["compile_reason"]
    overloads = {o["name"]: o for o in record["overloads"]}
    assert set(overloads) == {n[len("aten::"):] for n in torch._C._dispatch_get_all_op_names()
                              if n.split(".")[0] in ("aten::add", "aten::add_")}
    assert overloads["add_.Tensor"]["kind"] == "in-place" and overloads["add.out"]["kind"] == "out"
    assert all(o["eager"] == "native" for o in overloads.values())
    # dtypes: a compute op, under the fp64 rule
    assert "float32" in record["dtypes"]["eager"] and "TORCH_NEURONX_FP64=emulate" in record["dtypes"]["eager"]
    assert "Trainium3" in record["dtypes"]["float8"]
    # and on the device: native, no fallback, the fp64 rule as stated
    x = torch.randn(5, dtype=torch.float64)
    y = torch.randn(5, dtype=torch.float64)
    got = torch.add(x.to(DEVICE), y.to(DEVICE))
    assert torch_neuronx.get_fallback_ops() == {}
    assert "aten::add.Tensor" in torch_neuronx.get_executed_ops()
    assert got.dtype == torch.float64
    assert torch.equal(got.cpu(), (x.float() + y.float()).double())


def test_add_text_block(capsys):
    code, out, _ = _ops(capsys, "add")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "aten::add"
    labels = [line[2:17].strip() for line in lines[1:] if line[2:17].strip()]
    assert labels == ["eager", "torch.compile", "dtypes", "overloads"]
    assert lines[1].split(None, 2)[1] == "native:"
    assert lines[2].split(None, 2)[1] == "lowered:"


def test_an_overload_by_its_qualified_name(capsys, fresh_dynamo, monkeypatch, tmp_path, quiet):
    record = _record(capsys, "aten::add.Tensor")
    assert record["op"] == "add"
    assert record["overload"] == {"name": "add.Tensor", "kind": "functional", "eager": "native",
                                  "compile": "lowered"}
    code, out, _ = _ops(capsys, "aten::add.Tensor")
    assert code == 0 and out.startswith("aten::add.Tensor (an overload of aten::add)\n")
    assert any(line.split()[0] == "add.Tensor" and line.endswith("<-") for line in out.splitlines()[5:])
    # lowered: a real compile (a fresh cache, so the graph reaches the backend); an op without
    # a lowering would raise (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION is on by default)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    fn = torch.compile(lambda a, b: torch.add(a, b, alpha=2), backend="neuron", fullgraph=True)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    torch.testing.assert_close(fn(a.to(DEVICE), b.to(DEVICE)).cpu(), a + 2 * b)
    metrics = torch_neuronx.get_dynamo_metrics()
    assert metrics["compiles"] == 1 and metrics["graph_breaks"] == 0
    assert torch_neuronx.get_fallback_ops() == {}


def test_in_place_and_out_forms_name_the_same_op(capsys):
    for name in ("add_", "aten::add_.Tensor", "add.out", "torch.ops.aten.add.Scalar"):
        assert _record(capsys, name)["op"] == "add"


# ------------------------------------------------------------- a fallback op


def test_special_i0e_falls_back_and_is_not_lowered(capsys, fresh_dynamo, quiet):
    record = _record(capsys, "special_i0e")
    assert (record["eager"], record["compile"]) == ("cpu fallback", "not lowered")
    assert "not in the native op set" in record["eager_reason"]
    assert "float64 computed in float64" in record["dtypes"]["eager"]
    assert {o["name"]: o["eager"] for o in record["overloads"]} == {
        "special_i0e": "cpu fallback", "special_i0e.out": "cpu fallback"}
    # independently: the registry, the lowering table, the decomposition table
    assert "special_i0e" not in registry.NATIVE_OPS
    assert lowering.lookup(torch.ops.aten.special_i0e.default) is None
    assert torch.ops.aten.special_i0e.default not in decomposition_table()
    # on the device: it runs, through the fallback (the functional op calls the out= form)
    x = torch.randn(6)
    torch.testing.assert_close(torch.special.i0e(x.to(DEVICE)).cpu(), torch.special.i0e(x), rtol=0, atol=0)
    assert torch_neuronx.get_fallback_ops() == {"aten::special_i0e.out": 1}
    # under torch.compile: the error names it
    fn = torch.compile(lambda t: torch.special.i0e(t) + 1, backend="neuron", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="special_i0e") as failure:
        fn(x.to(DEVICE))
    assert isinstance(failure.value.inner_exception, NeuronCompileError)


def test_every_fallback_the_conformance_run_saw_is_classified_as_one():
    """docs/conformance.md lists the ATen ops that reached the CPU fallback when PyTorch's
    OpInfo database ran on the device: each is a fallback here too (sparse conversions
    excepted: ops/sparse.py now rejects them with an error of its own; so is _scaled_mm,
    FP8 compute, a direct kernel of ops/float8.py since)."""
    text = (ROOT / "docs" / "conformance.md").read_text().split("\n## CPU fallback\n", 1)[1]
    seen = [line.split("`")[1].removeprefix("aten::") for line in text.splitlines()
            if line.startswith("| `aten::")]
    assert len(seen) > 50
    known = support.aten_overloads()
    for name in seen:
        if support.base_name(name.split(".")[0]) not in known:  # an op the run's PyTorch (2.13) had and 2.14 removed (cholesky)
            assert _torch_version.release(torch.__version__) != "2.13", name
            continue
        base, overload = support.resolve(name)
        op = support.op_support(base)
        routes = {o.name: o.eager for o in op.overloads}
        if overload is None:
            overload = name
        if overload.startswith("_to_sparse"):
            assert routes[overload] == op.eager == support.NO_KERNEL, name
            continue
        if base in registry.FP8_COMPUTE:  # a direct kernel since (trn3; an error elsewhere): tests/test_fp8.py
            assert routes[overload] == op.eager == support.DIRECT, name
            continue
        assert (op.eager, routes[overload]) == (support.FALLBACK, support.FALLBACK), name


# ------------------------------------------------------------- composite, data-dependent


def test_composite_op_runs_as_other_ops(capsys, quiet):
    record = _record(capsys, "cosine_similarity")
    assert (record["eager"], record["compile"]) == ("composite", "decomposed")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::cosine_similarity", "CompositeImplicitAutograd")
    F.cosine_similarity(torch.randn(2, 3, device=DEVICE), torch.randn(2, 3, device=DEVICE))
    executed = torch_neuronx.get_executed_ops()
    assert "aten::cosine_similarity" not in executed and torch_neuronx.get_fallback_ops() == {}


def test_one_kernel_composite_is_native_in_eager_and_decomposed_when_compiled(capsys, quiet):
    # isfinite is a CompositeImplicitAutograd op the release runs as one kernel (ops/evidence.py).
    record = _record(capsys, "isfinite")
    assert (record["eager"], record["compile"]) == ("native", "decomposed")
    torch.isfinite(torch.randn(2, 3, device=DEVICE))
    assert torch_neuronx.get_executed_ops().get("aten::isfinite") == 1


def test_value_dependent_op_is_native_and_a_graph_break(capsys):
    record = _record(capsys, "nonzero")
    assert (record["eager"], record["graph_break"]) == ("native", True)
    assert "nonzero" in registry.DATA_DEPENDENT_SHAPE
    assert "float64/complex128 exact" in record["dtypes"]["eager"]  # data movement


# ------------------------------------------------------------- summary, --all, errors


def test_summary_counts(capsys):
    code, out, _ = _ops(capsys, "--json")
    assert code == 0
    report = json.loads(out)
    bases = {registry.base_name(n[len("aten::"):].partition(".")[0])
             for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
    assert report["aten_ops"] == len(bases)
    assert sum(report["eager"].values()) == sum(report["compile"].values()) == len(bases)
    assert report["eager"]["native"] == report["native_set"] == len(registry.NATIVE_OPS - registry.DIRECT_KERNELS)
    assert report["eager"]["direct"] == report["direct_kernels"] == len(registry.DIRECT_KERNELS)
    assert report["eager"]["cpu fallback"] > 0 and report["compile"]["lowered"] > 0
    code, text, _ = _ops(capsys)
    assert code == 0
    assert f"native {report['eager']['native']}, direct {report['eager']['direct']}" in text
    assert "torch-neuronx ops NAME" in text  # the hint


def test_json_fields_are_documented(capsys):
    section = (ROOT / "docs" / "tools.md").read_text().split("\n## ops\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_0-9]+)(?:\[\])?`", section))
    code, out, _ = _ops(capsys, "--json")
    fields = set(json.loads(out))
    record = _record(capsys, "add")
    fields |= set(record) | set(record["dtypes"]) | set(record["overloads"][0])
    assert fields <= documented, fields - documented


def test_all_lists_every_op(capsys):
    code, out, _ = _ops(capsys, "--all", "--json")
    assert code == 0
    ops = json.loads(out)["ops"]
    assert [op["op"] for op in ops] == list(support.aten_overloads())
    code, text, _ = _ops(capsys, "--all")
    assert code == 0 and len(text.splitlines()) == len(ops) + 1


def test_unknown_op_is_exit_1_with_close_matches(capsys):
    code, out, err = _ops(capsys, "addd")
    assert (code, out) == (1, "")
    assert err == "torch-neuronx: error: 'addd' is not an ATen op; did you mean add, addr, addcdiv?\n"
    code, _, err = _ops(capsys, "aten::add.Nope")
    assert code == 1 and err.count("\n") == 1 and "add.Tensor" in err
    code, _, err = _ops(capsys, "add", "qqqzzz")  # nothing printed for the known one
    assert code == 1 and err.startswith("torch-neuronx: error: 'qqqzzz' is not an ATen op")


def test_usage_errors_are_exit_2(capsys):
    code, out, err = _ops(capsys, "add", "--all")
    assert (code, out) == (2, "") and "NAME and --all exclude each other" in err
    assert _ops(capsys, "--nonsense")[0] == 2


def test_command_line_exit_codes(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(tmp_path)

    def command(*args):
        return subprocess.run([sys.executable, "-m", "torch_neuronx", "ops", *args], env=env,
                              capture_output=True, text=True, timeout=300, cwd=ROOT)

    out = command("mm", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ops"][0]["eager"] == "native"
    out = command("mmm")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.startswith("torch-neuronx: error: 'mmm' is not an ATen op; did you mean mm")
    assert "Traceback" not in out.stderr
