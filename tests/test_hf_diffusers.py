"""Diffusers pipelines on the neuron device (issue #6, part 5).

Tiny models built from configs (no downloads) run a few denoising steps on
neuron and are compared with the same pipeline on CPU. Fairness: both sides get
a CPU torch.Generator with the same seed. diffusers' randn_tensor samples on
CPU for neuron anyway (and moves the noise to the device), so both pipelines
start from, and add, the same noise; a generator on the neuron device draws its
first stream as a CPU generator with its seed does (DiT draws only its latents
with it), checked below.

Models are put in eval mode explicitly: a model built from its constructor is
in training mode, and DiT's class-label dropout would then draw different
random drops on each device.
"""

import copy
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers = pytest.importorskip("diffusers")

import torch_neuronx  # noqa: E402

# Float32 pipelines on identical inputs: the device runs the same CPU kernels
# (eager alias path), so only reordering-level differences are allowed.
ATOL, RTOL = 1e-4, 1e-4
STEPS = 3


def _unet():
    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8, attention_head_dim=8,
    ).eval()


def _ddpm(unet):
    pipe = diffusers.DDPMPipeline(unet=copy.deepcopy(unet), scheduler=diffusers.DDPMScheduler(num_train_timesteps=50))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _dit_parts():
    torch.manual_seed(0)
    transformer = diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2, sample_size=8,
        patch_size=2, num_embeds_ada_norm=1000, norm_num_groups=8,  # DiTPipeline's null class is id 1000
    ).eval()
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
        norm_num_groups=8, layers_per_block=1, sample_size=16,
    ).eval()
    return transformer, vae


def _dit(parts):
    transformer, vae = parts
    pipe = diffusers.DiTPipeline(transformer=copy.deepcopy(transformer), vae=copy.deepcopy(vae),
                                 scheduler=diffusers.DDIMScheduler(num_train_timesteps=50))
    pipe.set_progress_bar_config(disable=True)
    return pipe


DIT_CALL = dict(class_labels=[1, 3], num_inference_steps=STEPS, guidance_scale=2.0, output_type="np")


def _cpu_gen():
    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="module")
def dit_parts():
    return _dit_parts()


@pytest.fixture(scope="module")
def dit_reference(dit_parts):
    return _dit(dit_parts)(generator=_cpu_gen(), **DIT_CALL).images


def test_ddpm_unet2d_pipeline_matches_cpu():
    unet = _unet()
    expected = _ddpm(unet)(batch_size=2, num_inference_steps=STEPS, generator=_cpu_gen(), output_type="np").images

    pipe = _ddpm(unet).to("neuron")
    assert pipe.unet.device.type == "neuron"
    torch_neuronx.clear_op_tracking()
    got = pipe(batch_size=2, num_inference_steps=STEPS, generator=_cpu_gen(), output_type="np").images

    assert torch_neuronx.get_fallback_ops() == {}
    assert got.shape == expected.shape == (2, 16, 16, 3)
    assert np.isfinite(got).all() and np.std(got) > 0  # a real image, not a constant
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


def test_dit_pipeline_matches_cpu(dit_parts, dit_reference):
    pipe = _dit(dit_parts).to("neuron")
    torch_neuronx.clear_op_tracking()
    got = pipe(generator=_cpu_gen(), **DIT_CALL).images

    assert torch_neuronx.get_fallback_ops() == {}
    assert got.shape == dit_reference.shape == (2, 16, 16, 3)
    np.testing.assert_allclose(got, dit_reference, atol=ATOL, rtol=RTOL)


def test_dit_pipeline_with_a_neuron_generator(dit_parts, dit_reference):
    # A CUDA script passes torch.Generator("cuda"); with only the device name
    # changed it passes a neuron generator, which must give the seeded stream.
    pipe = _dit(dit_parts).to("neuron")
    got = pipe(generator=torch.Generator("neuron").manual_seed(0), **DIT_CALL).images
    np.testing.assert_allclose(got, dit_reference, atol=ATOL, rtol=RTOL)


def _devices(pipe) -> set[str]:
    return {p.device.type for m in (pipe.transformer, pipe.vae) for p in m.parameters()}


def test_model_cpu_offload_to_neuron(dit_parts, dit_reference):
    pipe = _dit(dit_parts)
    pipe.enable_model_cpu_offload(device="neuron")
    assert pipe._execution_device == torch.device("neuron", 0)
    assert _devices(pipe) == {"cpu"}

    # Where each model really ran: recorded after its forward (a pre-hook would
    # run before accelerate's own hook has moved the weights).
    seen = []
    for name, module in (("transformer", pipe.transformer), ("vae.decoder", pipe.vae.decoder)):
        module.register_forward_hook(
            lambda m, args, out, name=name: seen.append((name, next(m.parameters()).device.type)))

    weight_bytes = sum(p.numel() * p.element_size() for p in pipe.transformer.parameters())
    before = torch.neuron.memory_allocated()
    for _ in range(2):  # weights go back to CPU after each call, and the next call reloads them
        seen.clear()
        got = pipe(generator=_cpu_gen(), **DIT_CALL).images
        assert _devices(pipe) == {"cpu"}
        # and the device memory they used is released, not just the CPU copy restored
        assert torch.neuron.memory_allocated() - before < weight_bytes
        assert {name for name, _ in seen} == {"transformer", "vae.decoder"}
        assert all(device == "neuron" for _, device in seen), seen
        np.testing.assert_allclose(got, dit_reference, atol=ATOL, rtol=RTOL)


def test_model_cpu_offload_by_default_picks_neuron(dit_parts):
    # A CUDA script calls enable_model_cpu_offload() with no device: on a
    # machine whose accelerator is neuron it must offload to neuron.
    pipe = _dit(dit_parts)
    pipe.enable_model_cpu_offload()
    assert pipe._execution_device.type == "neuron"
