"""Sparse layouts on neuron: every way to make a sparse neuron tensor raises one clear
error (not the dispatcher's key dump), and the remedies it names work."""

import pytest
import torch

import torch_neuronx

DENSE = torch.tensor([[0.0, 2.0, 0.0, 0.0], [1.0, 0.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0], [0.0, 4.0, 5.0, 0.0]])
CROW, COL, VAL = torch.tensor([0, 1, 1]), torch.tensor([1]), torch.tensor([1.0])

ENTRY_POINTS = {
    "to_sparse": lambda x: x.to_sparse(),
    "to_sparse(layout=csr)": lambda x: x.to_sparse(layout=torch.sparse_csr),
    "to_sparse_csr": lambda x: x.to_sparse_csr(),
    "to_sparse_csc": lambda x: x.to_sparse_csc(),
    "to_sparse_bsr": lambda x: x.to_sparse_bsr((2, 2)),
    "to_sparse_bsc": lambda x: x.to_sparse_bsc((2, 2)),
    "sparse_coo_tensor(device=neuron)": lambda x: torch.sparse_coo_tensor(
        torch.tensor([[0], [1]]), torch.tensor([1.0]), (2, 2), device="neuron"),
    "sparse_coo_tensor(neuron components)": lambda x: torch.sparse_coo_tensor(
        torch.tensor([[0], [1]], device="neuron"), torch.tensor([1.0], device="neuron"), (2, 2)),
    "sparse_csr_tensor(device=neuron)": lambda x: torch.sparse_csr_tensor(CROW, COL, VAL, (2, 2), device="neuron"),
    "sparse_csr_tensor(neuron components)": lambda x: torch.sparse_csr_tensor(
        CROW.to("neuron"), COL.to("neuron"), VAL.to("neuron"), (2, 2)),
    "sparse_bsr_tensor(device=neuron)": lambda x: torch.sparse_bsr_tensor(
        CROW, COL, torch.ones(1, 2, 2), (4, 4), device="neuron"),
    "coo.to(neuron)": lambda x: DENSE.to_sparse().to("neuron"),
    "coo.neuron()": lambda x: DENSE.to_sparse().neuron(),
    "csr.to(neuron)": lambda x: DENSE.to_sparse_csr().to("neuron"),
    "csc.to(neuron)": lambda x: DENSE.to_sparse_csc().to("neuron"),
    "zeros(layout=sparse_coo)": lambda x: torch.zeros(2, 2, layout=torch.sparse_coo, device="neuron"),
    "empty(layout=sparse_csr)": lambda x: torch.empty(2, 2, layout=torch.sparse_csr, device="neuron"),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_sparse_entry_point_raises_one_clear_error(entry):
    x = DENSE.to("neuron")
    torch_neuronx.clear_op_tracking()
    with pytest.raises(NotImplementedError) as error:
        ENTRY_POINTS[entry](x)
    message = str(error.value)
    assert "Sparse tensors are not supported on the neuron device" in message
    assert ".to_dense()" in message and "CPU" in message
    assert "Could not run" not in message and len(message) < 400  # no dispatcher dump
    assert not torch_neuronx.get_fallback_ops()  # rejected before any CPU fallback ran


def test_the_remedies_match_cpu():
    """Sparse @ dense kept on the CPU, and .to_dense() moved to neuron, equal CPU PyTorch."""
    rhs = torch.randn(4, 3)
    sparse = DENSE.to_sparse()
    expected = torch.sparse.mm(sparse, rhs)
    on_cpu = torch.sparse.mm(sparse, rhs.to("neuron").cpu())
    torch.testing.assert_close(on_cpu, expected, rtol=0, atol=0)
    on_neuron = sparse.to_dense().to("neuron") @ rhs.to("neuron")
    torch.testing.assert_close(on_neuron.cpu(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(DENSE.to_sparse_csr().to_dense().to("neuron").cpu(), DENSE, rtol=0, atol=0)
