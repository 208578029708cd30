"""NVlabs' StyleGAN2 network pickles read as data, never run, and mapped onto Pixelsmith's StyleGAN2.

A stylegan2-ada-pytorch (or stylegan3, `--cfg=stylegan2`) snapshot is a pickle of a dict {'G', 'D', 'G_ema',
'augment_pipe', 'training_set_kwargs', ...}. Each network is a `torch_utils.persistence` object: unpickling calls
`_reconstruct_persistent_obj(meta)`, which in NVlabs' code *executes* `meta['module_src']` (the source the pickle
carries) and builds the class from it. Here that call only returns a `PersistentObject` holding the class name,
the source text (never executed) and the module's `__dict__` (`_parameters`, `_buffers`, `_modules`,
`_init_kwargs`). `NVlabsUnpickler.find_class` accepts an allow-list of globals that rebuild data (tensors,
storages read back with `torch.load(weights_only=True)`, OrderedDict, EasyDict as a dict, numpy scalars and
dtypes); any other global stops the load in one paragraph naming it, before anything is called.

`convert_pickle(path)` turns the networks into Pixelsmith state dicts plus the `model.generator.*` /
`model.discriminator.*` settings that build the same networks, and refuses an architecture Pixelsmith does not
have (StyleGAN3's, a conditional discriminator, another synthesis or mapping layout), naming what differs.
"""

from __future__ import annotations

import io
import math
import pickle
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pixelsmith.errors import PixelsmithError
from pixelsmith.safe_load import UnloadableFileError

NVLABS_REPO = "https://github.com/NVlabs/stylegan2-ada-pytorch"
NETWORK_KEYS = ("G", "D", "G_ema")


class NVlabsPickleError(UnloadableFileError):
    """A file given as an NVlabs network pickle is not one, needs code to load, or holds an architecture we lack."""


@dataclass
class PersistentObject:
    """An NVlabs persistent module as data: what its class was called and the state it pickled. `module_src` is
    kept as text (it tells StyleGAN3's networks apart) and never executed."""

    class_name: str
    module_src: str
    state: dict[str, Any]

    @property
    def init_kwargs(self) -> dict[str, Any]:
        return dict(self.state.get("_init_kwargs") or {})

    @property
    def children(self) -> dict[str, Any]:
        return dict(self.state.get("_modules") or {})

    def tensors(self, prefix: str = "") -> dict[str, Tensor]:
        """Every parameter and buffer, named as NVlabs' `state_dict()` names them (frozen layers keep their weights
        as buffers: they are here too)."""
        out: dict[str, Tensor] = {}
        for group in ("_parameters", "_buffers"):
            for name, tensor in (self.state.get(group) or {}).items():
                if isinstance(tensor, Tensor):
                    out[prefix + name] = tensor
        for name, child in self.children.items():
            if isinstance(child, PersistentObject):
                out.update(child.tensors(f"{prefix}{name}."))
        return out


class _EasyDict(dict):
    """dnnlib.EasyDict read back as the plain dict it is (attribute access is all it adds)."""


def _reconstruct_persistent_obj(meta: Any) -> PersistentObject:
    if not isinstance(meta, dict) or not isinstance(meta.get("state"), dict):
        raise pickle.UnpicklingError("a persistent object without its state dict")
    return PersistentObject(
        str(meta.get("class_name")), str(meta.get("module_src") or ""), dict(meta["state"])
    )


def _load_storage(data: bytes) -> Any:
    # torch pickles each storage as a small torch.save file; read it as data only, as every other file.
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _rebuild_parameter(data: Tensor, requires_grad: bool, backward_hooks: Any, *state: Any) -> Tensor:
    return data  # a plain tensor: nothing here trains the pickle's own modules


def _numpy_scalar(dtype: Any, data: bytes | None = None) -> Any:
    import numpy as np

    if not isinstance(dtype, np.dtype) or dtype.hasobject or not isinstance(data, bytes):
        raise pickle.UnpicklingError("a numpy scalar of an object dtype")
    return np.frombuffer(data, dtype=dtype)[0].item()


def _numpy_dtype(*args: Any) -> Any:
    import numpy as np

    return np.dtype(*args)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch_utils.persistence", "_reconstruct_persistent_obj"): _reconstruct_persistent_obj,
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch.storage", "_load_from_bytes"): _load_storage,
    ("dnnlib.util", "EasyDict"): _EasyDict,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
    ("numpy", "dtype"): _numpy_dtype,
}


class RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.global_name = f"{module}.{name}"


class NVlabsUnpickler(pickle.Unpickler):
    """Unpickles NVlabs' network pickles as data: only the globals in `_ALLOWED` resolve, each to a function of
    ours that builds data; everything else raises before it is called."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise RefusedGlobal(module, name)
        return allowed

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(
            f"a persistent id ({type(pid).__name__}): a torch.save file, not a pickle"
        )


def _refusal(key: str, path: Path, what: str) -> str:
    return (
        f"{key}={path} does not load as data only: {what}. An NVlabs network pickle holds only tensors, plain "
        "containers and NVlabs' persistent modules, which Pixelsmith reads as data; Pixelsmith never runs code "
        "from a pickle, so anything else is refused unrun. Give a network pickle written by NVlabs' "
        f"stylegan2-ada-pytorch ({NVLABS_REPO}) training, or a Pixelsmith checkpoint (a .ckpt)."
    )


def read_pickle(path: str | Path, key: str = "source") -> dict[str, Any]:
    """The pickle's top-level dict with its networks as PersistentObjects, or one paragraph saying why not."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise NVlabsPickleError(
            f"{key}={path} does not exist. Give an NVlabs network pickle (e.g. ffhq.pkl, downloaded from the "
            f"links in {NVLABS_REPO}#readme) or a Pixelsmith checkpoint."
        )
    try:
        with open(path, "rb") as handle, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            data = NVlabsUnpickler(handle).load()
    except RefusedGlobal as err:
        raise NVlabsPickleError(_refusal(key, path, f"it asks for the global {err.global_name}")) from None
    except (pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError, RuntimeError) as err:
        reason = "it ends early (truncated)" if isinstance(err, EOFError) else f"{type(err).__name__}: {err}"
        raise NVlabsPickleError(
            _refusal(key, path, f"it does not read as an NVlabs network pickle ({str(reason)[:200]})")
        ) from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), PersistentObject) for k in NETWORK_KEYS):
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise NVlabsPickleError(
            f"{key}={path} is a pickle, but not an NVlabs network snapshot: it holds {found}, not the networks "
            f"{', '.join(NETWORK_KEYS)} that stylegan2-ada-pytorch's training writes (network-snapshot-*.pkl). "
            "Give such a snapshot, or one of NVlabs' published network pickles."
        )
    return data


# --------------------------------------------------------------------------------------------------------------------
# The architecture check and the mapping onto Pixelsmith's StyleGAN2.


@dataclass
class Converted:
    """Pixelsmith state dicts of G, D and G_ema, the settings that build them, and what was mapped (for the log)."""

    generator: dict[str, Any]
    discriminator: dict[str, Any]
    state_dicts: dict[str, dict[str, Tensor]]
    report: list[str] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)

    def overrides(self) -> list[str]:
        """The command-line keys that build these networks (`model.generator.z_dim=512` ...)."""
        items = [("generator", k, v) for k, v in self.generator.items()]
        items += [("discriminator", k, v) for k, v in self.discriminator.items()]
        return [f"model.{role}.{k}={'null' if v is None else v}" for role, k, v in items]


def _differs(path: Path, what: str) -> NVlabsPickleError:
    return NVlabsPickleError(
        f"{path} holds a network Pixelsmith's StyleGAN2 does not have: {what}. Pixelsmith converts "
        f"stylegan2-ada-pytorch's StyleGAN2 networks ({NVLABS_REPO}: training/networks.py, any --cfg) and "
        "stylegan3's --cfg=stylegan2 ones; train this network with NVlabs' own code instead."
    )


def _check_generator(path: Path, G: PersistentObject) -> dict[str, Any]:
    synthesis = G.children.get("synthesis")
    if not isinstance(synthesis, PersistentObject) or "b4" not in synthesis.children:
        layers = sorted(synthesis.children)[:4] if isinstance(synthesis, PersistentObject) else []
        if "input" in (layers or []) or "class SynthesisInput" in (synthesis.module_src if synthesis else ""):
            kwargs = dict(G.init_kwargs.get("synthesis_kwargs") or {})
            config = "-r" if kwargs.get("use_radial_filters") or kwargs.get("conv_kernel") == 1 else "-t"
            raise _differs(
                path,
                f"StyleGAN3 (stylegan3{config}: a Fourier-feature input and alias-free filtered layers "
                f"{', '.join(layers)}..., where StyleGAN2 starts from a learned 4x4 constant, b4.const)",
            )
        raise _differs(path, f"a generator without StyleGAN2's synthesis blocks (class {G.class_name})")
    kwargs = G.init_kwargs
    mapping_kwargs = dict(kwargs.get("mapping_kwargs") or {})
    synthesis_kwargs = dict(kwargs.get("synthesis_kwargs") or {})
    w_dim = int(kwargs["w_dim"])
    checks = [
        (synthesis_kwargs.get("architecture", "skip") == "skip", "the synthesis architecture",
         f"{synthesis_kwargs.get('architecture')} (Pixelsmith's generator is NVlabs' 'skip')"),
        (mapping_kwargs.get("layer_features") in (None, w_dim), "the mapping layers' width",
         f"{mapping_kwargs.get('layer_features')} (Pixelsmith's are w_dim={w_dim} wide)"),
        (mapping_kwargs.get("embed_features") in (None, w_dim), "the label embedding's width",
         f"{mapping_kwargs.get('embed_features')} (Pixelsmith's is w_dim={w_dim} wide)"),
        (list(synthesis_kwargs.get("resample_filter", [1, 3, 3, 1])) == [1, 3, 3, 1], "the resampling filter",
         f"{synthesis_kwargs.get('resample_filter')} (Pixelsmith's is [1, 3, 3, 1])"),
        (int(kwargs.get("z_dim", 1)) > 0, "z_dim", "0"),
    ]  # fmt: skip
    for ok, what, theirs in checks:
        if not ok:
            raise _differs(path, f"{what} is {theirs}")
    return {
        "resolution": int(kwargs["img_resolution"]),
        "channels": int(kwargs["img_channels"]),
        "z_dim": int(kwargs["z_dim"]),
        "w_dim": w_dim,
        "c_dim": int(kwargs.get("c_dim") or 0),
        "mapping_layers": int(mapping_kwargs.get("num_layers", 8)),
        "mapping_lr_multiplier": float(mapping_kwargs.get("lr_multiplier", 0.01)),
        "channel_base": int(synthesis_kwargs.get("channel_base", 32768)),
        "channel_max": int(synthesis_kwargs.get("channel_max", 512)),
        "use_noise": bool(synthesis_kwargs.get("use_noise", True)),
        "upsampling": "fir",
        "num_fp16_res": int(synthesis_kwargs.get("num_fp16_res", 0)),
        "conv_clamp": synthesis_kwargs.get("conv_clamp"),
    }


def _check_discriminator(path: Path, D: PersistentObject) -> dict[str, Any]:
    kwargs = D.init_kwargs
    if "b4" not in D.children:
        raise _differs(path, f"a discriminator without StyleGAN2's blocks (class {D.class_name})")
    epilogue = dict(kwargs.get("epilogue_kwargs") or {})
    c_dim = int(kwargs.get("c_dim") or 0)
    if c_dim:
        raise _differs(
            path,
            f"a class-conditional discriminator (c_dim={c_dim}: a label mapping network projected onto D's output, "
            "cmap), which Pixelsmith's StyleGAN2 discriminator has no counterpart for",
        )
    if int(epilogue.get("mbstd_num_channels", 1)) != 1:
        raise _differs(path, f"mbstd_num_channels={epilogue['mbstd_num_channels']} (Pixelsmith's is 1)")
    architecture = str(kwargs.get("architecture", "resnet"))
    if architecture not in ("resnet", "orig", "skip"):
        raise _differs(path, f"the discriminator architecture {architecture}")
    return {
        "resolution": int(kwargs["img_resolution"]),
        "channels": int(kwargs["img_channels"]),
        "channel_base": int(kwargs.get("channel_base", 32768)),
        "channel_max": int(kwargs.get("channel_max", 512)),
        "mbstd_group_size": int(epilogue.get("mbstd_group_size") or 4),
        "architecture": architecture,
        "downsampling": "fir",
        "num_fp16_res": int(kwargs.get("num_fp16_res", 0)),
        "conv_clamp": kwargs.get("conv_clamp"),
    }


def _generator_name(name: str, block_index: dict[str, int]) -> str | None:
    """NVlabs' G tensor name -> ours; None for the constant resampling filters."""
    parts = name.split(".")
    if parts[-1] == "resample_filter":
        return None
    if parts[0] == "mapping":
        if parts[1].startswith("fc"):
            return f"mapping.layers.{int(parts[1][2:])}.{parts[2]}"
        return name  # mapping.embed.*, mapping.w_avg
    block = f"synthesis.blocks.{block_index[parts[1]]}"
    layer, rest = parts[2], parts[3:]
    if layer == "const":
        return f"{block}.const"
    if layer == "torgb":
        return f"{block}.to_image.bias" if rest == ["bias"] else f"{block}.to_image.conv.{'.'.join(rest)}"
    if rest[0] in ("affine", "weight"):
        return f"{block}.{layer}.conv.{'.'.join(rest)}"
    return f"{block}.{layer}.{'.'.join(rest)}"  # noise_strength, noise_const, bias


def _discriminator_name(name: str, block_index: dict[str, int], top: str) -> str | None:
    parts = name.split(".")
    if parts[-1] == "resample_filter":
        return None
    block, layer, rest = parts[0], parts[1], ".".join(parts[2:])
    if block == "b4":
        epilogue = {
            "fromrgb": "epilogue_from_image",
            "conv": "epilogue_conv",
            "fc": "epilogue_fc",
            "out": "out",
        }
        return f"{epilogue[layer]}.{rest}"
    if layer == "fromrgb":
        return f"from_image.{rest}" if block == top else f"blocks.{block_index[block]}.from_image.{rest}"
    return f"blocks.{block_index[block]}.{layer}.{rest}"


def _map(tensors: dict[str, Tensor], rename) -> dict[str, Tensor]:
    out = {}
    for name, tensor in tensors.items():
        ours = rename(name)
        if ours is None:
            continue
        tensor = tensor.detach().to(torch.float32).contiguous()
        out[ours] = tensor.reshape(1) if ours.endswith("noise_strength") else tensor
    return out


def convert_pickle(path: str | Path, key: str = "source") -> Converted:
    """G, D and G_ema of an NVlabs pickle as Pixelsmith state dicts and settings (see the module docstring)."""
    path = Path(path).expanduser()
    data = read_pickle(path, key)
    G, D, G_ema = (data[k] for k in NETWORK_KEYS)
    generator = _check_generator(path, G)
    _check_generator(path, G_ema)
    discriminator = _check_discriminator(path, D)
    resolution = generator["resolution"]
    levels = range(2, int(math.log2(resolution)) + 1)
    g_blocks = {f"b{2**level}": index for index, level in enumerate(levels)}
    d_blocks = {f"b{2**level}": index for index, level in enumerate(reversed(list(levels)[1:]))}
    top = f"b{resolution}"
    try:
        state_dicts = {
            "G": _map(G.tensors(), lambda n: _generator_name(n, g_blocks)),
            "G_ema": _map(G_ema.tensors(), lambda n: _generator_name(n, g_blocks)),
            "D": _map(D.tensors(), lambda n: _discriminator_name(n, d_blocks, top)),
        }
    except (KeyError, IndexError, ValueError) as err:
        raise _differs(path, f"a tensor named where StyleGAN2 has none ({err})") from None
    report = [
        f"{k}: {len(v)} tensors, {sum(t.numel() for t in v.values()):,} values"
        for k, v in state_dicts.items()
    ]
    extras = {"training_set_kwargs": dict(data.get("training_set_kwargs") or {})}
    augment = data.get("augment_pipe")
    if isinstance(augment, PersistentObject):
        p = augment.tensors().get("p")
        extras["augment_p"] = float(p.reshape(-1)[0]) if p is not None and p.numel() else None
    return Converted(generator, discriminator, state_dicts, report, extras)


def load_into(converted: Converted, networks: dict[str, torch.nn.Module], source: Path) -> None:
    """Load the converted tensors into built networks ("G", "D", "G_ema"), strictly: a network that does not fit
    is refused with the settings that build one that does."""
    for name, network in networks.items():
        result = _load_strict(network, converted.state_dicts[name])
        if result:
            raise PixelsmithError(
                f"{source}'s {name} does not fit the {name} this config builds ({'; '.join(result[:4])}). Build "
                f"the network the pickle holds: {' '.join(converted.overrides())} (convert.py writes a checkpoint "
                "with these settings)."
            )


def _load_strict(network: torch.nn.Module, state: dict[str, Tensor]) -> list[str]:
    own = network.state_dict()
    problems = [
        f"{k}: missing in the pickle" for k in own if k not in state and not k.endswith("noise_const")
    ]
    problems += [f"{k}: not in this network" for k in state if k not in own and not k.endswith("noise_const")]
    problems += [
        f"{k}: {tuple(state[k].shape)} in the pickle, {tuple(v.shape)} here"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    if not problems:
        network.load_state_dict(state, strict=True)
    return problems
