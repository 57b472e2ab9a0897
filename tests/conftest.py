"""Suite-wide pytest options, to check that results do not depend on the machine:

--threads N  torch.set_num_threads(N) for the run (default: PyTorch's choice, one per core)
--seed S     added to every seed the tests use (tests/seeds.py; default 0, the seeds as written)
"""

import pytest
import torch

import seeds


def pytest_addoption(parser):
    group = parser.getgroup("torch-neuronx")
    group.addoption("--threads", type=int, default=None, metavar="N",
                    help="torch.set_num_threads(N) for the whole run (default: PyTorch's choice)")
    group.addoption("--seed", type=int, default=0, metavar="S",
                    help="added to every seed the tests use (default 0: the seeds as written)")


def pytest_configure(config):
    threads = config.getoption("threads")
    if threads is not None:
        if threads < 1:
            raise pytest.UsageError(f"--threads {threads}: needs a thread count of at least 1")
        torch.set_num_threads(threads)
    seeds.OFFSET = config.getoption("seed")


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and the neuron compile metrics reset around a test."""
    import torch_neuronx

    torch._dynamo.reset()
    torch_neuronx.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def porting_audit(tmp_path_factory):
    """`torch-neuronx audit --json --html -- examples/porting_audit.py`, run once as a
    user would (a subprocess) for tests/test_audit.py and tests/test_audit_html.py:
    (the CompletedProcess, the report dict, the HTML page's path)."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    tmp = tmp_path_factory.mktemp("porting_audit")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env.update(TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp / "cache"), TORCH_NEURONX_FALLBACK="silent")
    json_path, html_path = tmp / "report.json", tmp / "report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "torch_neuronx", "audit", "--json", str(json_path), "--html", str(html_path),
         "--", "examples/porting_audit.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert html_path.exists(), "the CLI wrote no HTML file"
    return proc, json.loads(json_path.read_text()), html_path
