"""Imports every patch module so that its ``@patches`` registrations take effect.

One module per patched library; add new ones here."""

from torch_neuronx.integrations import accelerate  # noqa: F401
from torch_neuronx.integrations import trainer  # noqa: F401
from torch_neuronx.integrations import peft  # noqa: F401
from torch_neuronx.integrations import safetensors  # noqa: F401
from torch_neuronx.integrations import transformers  # noqa: F401
from torch_neuronx.integrations import trl  # noqa: F401
