"""Each performance switch changes what it claims: weight memory format, compiled networks, matmul precision and the
CUDA backend flags, the Adam implementation (and fused Adam under a real fp16 GradScaler with clipping), the CUDA
memory fraction and allocator settings, the data-loader settings, and gradient checkpointing's saved activations.
The switches are fields of the one HardwareSettings (`pixelsmith.hardware.settings.resolve_hardware_settings`), set by
`apply_hardware` once per run."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from hydra.errors import ConfigCompositionException
from torch import nn

# General code checked with the GAN part as its vehicle: a fork without it (README "Removing a part") skips
# this file rather than failing to import it.
pytest.importorskip("pixelsmith.gan", reason="the GAN part is removed from this fork")

from pixelsmith.core.optim import adam_implementation  # noqa: E402
from pixelsmith.errors import PixelsmithError  # noqa: E402
from pixelsmith.gan.networks.stylegan2 import StyleGAN2Discriminator  # noqa: E402
from pixelsmith.hardware.settings import apply_hardware  # noqa: E402
from pixelsmith.run.build import build_core_settings, build_datamodule, build_model, resolve_hardware  # noqa: E402
from pixelsmith.run.fit import run  # noqa: E402


def _model(cfg):
    hardware = resolve_hardware(cfg)
    return build_model(cfg, build_core_settings(cfg, hardware)), hardware


def _conv_weights(module: nn.Module) -> list[torch.Tensor]:
    # Weights with >1 input channel and a >1 kernel: for those "contiguous" and "channels_last" differ.
    return [p for p in module.parameters() if p.ndim == 4 and p.shape[1] > 1 and p.shape[2] > 1]


@pytest.mark.parametrize("channels_last", [True, False])
def test_channels_last_switch_sets_the_memory_format_of_every_network(make_cfg, channels_last):
    model, _ = _model(make_cfg(f"hardware.channels_last={str(channels_last).lower()}"))
    model.configure_model()
    for name, net in model.networks().items():
        weights = _conv_weights(net)
        assert weights, name
        for w in weights:
            assert w.is_contiguous(memory_format=torch.channels_last) is channels_last, name
            assert w.is_contiguous() is not channels_last, name


def test_compile_switch_compiles_the_networks_not_the_module(make_cfg):
    model, hardware = _model(make_cfg("hardware.compile=true", "hardware.compile_mode=reduce-overhead"))
    assert hardware.compile and hardware.compile_mode == "reduce-overhead"
    nets = model.networks()
    assert all(net._compiled_call_impl is None for net in nets.values())
    model.configure_model()
    # Every trained network compiles; an EMA copy only samples and evaluates (batch sizes of its own) and stays eager.
    averages = {id(ema.model) for _, ema, _ in model._ema_pairs}
    assert all((net._compiled_call_impl is None) == (id(net) in averages) for net in nets.values())
    assert any(id(net) not in averages for net in nets.values())
    assert (
        model._compiled_call_impl is None
    )  # the LightningModule itself stays eager (self.log keeps working)
    assert not any(k.startswith("_orig_mod") or "._orig_mod." in k for k in model.state_dict())


def test_matmul_precision_switch_sets_torch_global(make_cfg):
    before = torch.get_float32_matmul_precision()
    try:
        apply_hardware(resolve_hardware(make_cfg("hardware.matmul_precision=medium")))
        assert torch.get_float32_matmul_precision() == "medium"
        apply_hardware(resolve_hardware(make_cfg()))  # the cpu profile: highest
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)


def test_cuda_backend_switches_set_cudnn_and_tf32_flags(make_cfg, monkeypatch):
    """The CUDA branch runs without a GPU: these are process-wide flags."""
    hardware = dataclasses.replace(
        resolve_hardware(make_cfg()),
        accelerator="cuda",
        cudnn_benchmark=True,
        allow_tf32=True,
        matmul_precision="high",
        cuda_alloc_conf="expandable_segments:True",
    )
    saved = (
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    try:
        torch.backends.cudnn.benchmark = False
        apply_hardware(hardware)
        assert torch.backends.cudnn.benchmark is True
        assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    finally:
        torch.backends.cudnn.benchmark = saved[0]
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]
        torch.set_float32_matmul_precision(saved[3])


@pytest.mark.parametrize(
    "impl, fused, foreach",
    [("fused", True, None), ("foreach", None, True), ("for_loop", None, False), ("auto", True, None)],
)
def test_optimizer_impl_switch_builds_that_adam(make_cfg, impl, fused, foreach):
    cfg = make_cfg(f"hardware.optimizer_impl={impl}")
    model, _ = _model(cfg)  # the hardware settings carry hardware.optimizer_impl into the core settings
    optimizers, _ = model.configure_optimizers()
    for opt in optimizers:
        assert isinstance(opt, torch.optim.Adam)
        assert opt.defaults["fused"] == fused and opt.defaults["foreach"] == foreach


def test_cpu_profile_defaults_to_fused_adam_and_the_user_key_wins(make_cfg):
    assert resolve_hardware(make_cfg()).optimizer_impl == "fused"
    assert resolve_hardware(make_cfg("hardware.optimizer_impl=foreach")).optimizer_impl == "foreach"
    # an unknown value is refused by the schema at composition (pixelsmith/config/choices.py), before the hardware
    # settings resolve
    with pytest.raises((PixelsmithError, ConfigCompositionException), match="optimizer_impl"):
        resolve_hardware(make_cfg("hardware.optimizer_impl=turbo"))
    with pytest.raises(PixelsmithError, match="fused"):
        adam_implementation("fused", [torch.zeros(3, dtype=torch.int64)])


def test_fused_adam_trains_under_a_real_fp16_grad_scaler_with_clipping(make_cfg, tmp_path):
    cfg = make_cfg(
        "precision=16-mixed",
        "hardware.optimizer_impl=fused",
        "train.clip_grad_norm=1.0",
        "data.resolution=16",  # fp16 convolutions are slow on CPU: keep it tiny
        "data.batch_size=8",
        "max_steps=3",
        "train.sample_every_n_steps=0",
        "eval.every_n_steps=0",  # no FID at start/end: not what these tests measure
    )
    initial, _ = _model(cfg)
    initial_g = {k: v.clone() for k, v in initial.generator.state_dict().items()}
    metrics = run(cfg)
    assert metrics["iteration"] == 3
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["optimizer_states"][0]["param_groups"][0]["fused"] is True
    trained = {
        k[len("generator.") :]: v for k, v in state["state_dict"].items() if k.startswith("generator.")
    }
    changed = [k for k, v in initial_g.items() if v.is_floating_point() and not torch.equal(v, trained[k])]
    assert changed and all(torch.isfinite(trained[k]).all() for k in changed)


def test_memory_fraction_and_allocator_settings_reach_cuda(make_cfg, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    cfg = make_cfg(
        "hardware.memory_fraction=0.5",
        "hardware.cuda_alloc_conf='expandable_segments:True,max_split_size_mb:256'",
    )
    cpu_hardware = resolve_hardware(cfg)
    assert (cpu_hardware.optimizer_impl, cpu_hardware.memory_fraction, cpu_hardware.cuda_alloc_conf) == (
        "fused",
        0.5,
        "expandable_segments:True,max_split_size_mb:256",
    )
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
    )
    try:
        apply_hardware(cpu_hardware)  # CPU: nothing to apply
        assert calls == [] and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
        apply_hardware(dataclasses.replace(cpu_hardware, accelerator="cuda"))
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]
        torch.backends.cudnn.benchmark = saved[3]
    assert calls == [(0.5, 1)]  # this process's device (LOCAL_RANK)
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,max_split_size_mb:256"
    with pytest.raises(PixelsmithError, match="memory_fraction"):
        resolve_hardware(make_cfg("hardware.memory_fraction=1.5"))


def test_loader_switches_reach_the_dataloader(make_cfg):
    cfg = make_cfg(
        "data.num_workers=2", "data.prefetch_factor=4", "data.persistent_workers=true", "data.on_device=false"
    )
    loader = build_datamodule(cfg, resolve_hardware(cfg))
    loader.setup("fit")
    dl = loader.train_dataloader()
    assert (dl.num_workers, dl.prefetch_factor, dl.persistent_workers) == (2, 4, True)
    cfg = make_cfg("data.num_workers=0", "data.prefetch_factor=4", "data.on_device=false")
    dm = build_datamodule(cfg, resolve_hardware(cfg))
    dm.setup("fit")
    dl = dm.train_dataloader()
    assert (dl.num_workers, dl.prefetch_factor, dl.persistent_workers) == (0, None, False)


def test_gradient_checkpointing_saves_fewer_activations_and_the_same_gradients():
    def saved_bytes_and_grads(checkpointing: bool):
        torch.manual_seed(0)
        D = StyleGAN2Discriminator(
            16, 3, channel_base=256, channel_max=32, gradient_checkpointing=checkpointing
        )
        x = torch.randn(2, 3, 16, 16)
        saved = []

        def pack(t):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = D(x).sum()
        out.backward()
        return sum(saved), [p.grad.clone() for p in D.parameters()]

    plain_bytes, plain_grads = saved_bytes_and_grads(False)
    ckpt_bytes, ckpt_grads = saved_bytes_and_grads(True)
    assert ckpt_bytes < 0.5 * plain_bytes  # block inputs only, not every intermediate activation
    for a, b in zip(plain_grads, ckpt_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_num_threads_switch_sets_torch_threads_and_rejects_zero(make_cfg):
    before = torch.get_num_threads()
    try:
        apply_hardware(resolve_hardware(make_cfg("hardware.num_threads=1")))
        assert torch.get_num_threads() == 1
        apply_hardware(resolve_hardware(make_cfg()))  # null: leaves the current setting alone
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(PixelsmithError, match="hardware.num_threads=0 must be at least 1"):
        resolve_hardware(make_cfg("hardware.num_threads=0"))


def test_num_threads_of_one_run_does_not_leak_into_the_next(make_cfg):
    before = torch.get_num_threads()
    run(make_cfg("hardware.num_threads=1", "max_steps=1", "precision=32-true", "logger=none"))
    assert torch.get_num_threads() == before
