"""Errors of torch.compile(backend="neuron")."""


class NeuronCompileError(RuntimeError):
    """A graph could not be compiled for the neuron device."""
