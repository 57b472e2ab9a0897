"""Patches for Hugging Face accelerate (see docs/huggingface.md)."""

from __future__ import annotations

from torch_neuronx.integrations import patches
