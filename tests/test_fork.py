"""The neuron runtime and multiprocessing (issue item 10): a forked child of an
initialized parent cannot use the device (as with CUDA); forking before the
first device use is fine; the 'spawn' start method always works."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import traceback

import pytest
import torch

import torch_neuronx  # noqa: F401  (explicit, though autoload already imported it)

MESSAGE = (
    "Cannot re-initialize Neuron runtime in forked subprocess. To use Neuron with "
    "multiprocessing, use the 'spawn' start method"
)


def _in_child(target, *args):
    """Runs target(*args) in a forked child; returns what it put on the queue."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_report, args=(queue, target, args))
    proc.start()
    result = queue.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    return result


def _report(queue, target, args):
    try:
        queue.put(("ok", target(*args)))
    except BaseException as error:  # reported to the parent, which asserts on it
        queue.put(("error", f"{type(error).__name__}: {error}", traceback.format_exc()))


def _allocate():
    return torch.ones(3, device="neuron").sum().item()


def _use_inherited(tensor):
    return (tensor * 2).sum().item()


def _copy_inherited(tensor):
    return tensor.cpu().tolist()


def _cpu_only_work():
    a = torch.arange(6.0).reshape(2, 3)
    return {
        "value": (a @ a.T).sum().item(),
        "device_count": torch.neuron.device_count(),
        "is_initialized": torch.neuron.is_initialized(),
        "bad_fork": torch.neuron._is_in_bad_fork(),
    }


def _explicit_init():
    torch.neuron.init()


@pytest.fixture
def initialized_parent():
    x = torch.arange(4.0, device="neuron")
    assert torch.neuron.is_initialized()
    return x


def test_fork_after_init_raises_on_allocation(initialized_parent):
    status, message, *_ = _in_child(_allocate)
    assert status == "error"
    assert message == f"RuntimeError: {MESSAGE}"


def test_fork_after_init_raises_on_ops_with_inherited_tensors(initialized_parent):
    status, message, *_ = _in_child(_use_inherited, initialized_parent)
    assert status == "error" and MESSAGE in message
    status, message, *_ = _in_child(_explicit_init)
    assert status == "error" and MESSAGE in message


def test_fork_after_init_raises_on_copy_to_host(initialized_parent):
    status, message, *_ = _in_child(_copy_inherited, initialized_parent)
    assert status == "error" and MESSAGE in message


def test_forked_child_may_still_use_the_cpu(initialized_parent):
    status, result = _in_child(_cpu_only_work)
    assert status == "ok"
    a = torch.arange(6.0).reshape(2, 3)
    assert result["value"] == (a @ a.T).sum().item()
    assert result["device_count"] == torch.neuron.device_count()
    assert result["bad_fork"] is True
    assert result["is_initialized"] is False  # as torch.cuda.is_initialized() in a bad fork
    # the parent keeps working
    torch.testing.assert_close((initialized_parent * 2).cpu(), torch.arange(4.0) * 2)
    assert not torch.neuron._is_in_bad_fork()


FORK_BEFORE_INIT = r"""
import multiprocessing as mp
import torch

def child(queue):
    x = torch.arange(6.0, device="neuron").reshape(2, 3)
    queue.put(((x @ x.T).sum().item(), torch.neuron.is_initialized()))

if __name__ == "__main__":
    assert not torch.neuron.is_initialized()
    torch.neuron.manual_seed(1)  # seeding does not start the runtime
    torch.neuron.device_count()
    assert not torch.neuron.is_initialized()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    value, child_initialized = queue.get(timeout=120)
    proc.join()
    assert proc.exitcode == 0
    # the parent can still start its own runtime afterwards
    y = torch.arange(6.0, device="neuron").reshape(2, 3)
    print(value, child_initialized, (y @ y.T).sum().item())
"""


@pytest.fixture(scope="module")
def fork_before_init(tmp_path_factory):
    """Starts the fresh interpreter early so it overlaps the spawn test."""
    script = tmp_path_factory.mktemp("fork") / "fork_before_init.py"
    script.write_text(FORK_BEFORE_INIT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX", "NEURON_"))}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _spawn_worker(seed):
    # Runs in a fresh interpreter: `import torch` autoloads the device there.
    torch.manual_seed(seed)
    a = torch.randn(16, 8)
    b = torch.randn(8, 4)
    out = torch.relu(a.to("neuron") @ b.to("neuron")) + 1
    return a, b, out.cpu(), str(out.device)


def test_spawn_works(initialized_parent, fork_before_init):
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        a, b, out, device = pool.apply(_spawn_worker, (3,))
    assert device == "neuron:0"
    torch.testing.assert_close(out, torch.relu(a @ b) + 1, rtol=1e-5, atol=1e-5)


def test_fork_before_init_works(fork_before_init):
    out, err = fork_before_init.communicate(timeout=180)
    assert fork_before_init.returncode == 0, err
    a = torch.arange(6.0).reshape(2, 3)
    expected = (a @ a.T).sum().item()
    value, child_initialized, parent_value = out.split()
    assert float(value) == expected and float(parent_value) == expected
    assert child_initialized == "True"
