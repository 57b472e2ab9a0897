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
