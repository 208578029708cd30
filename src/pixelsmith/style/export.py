"""Export a trained one-input stylizer to TorchScript (.pt) and ONNX (.onnx), and check both against eager.

Both exports take any input size (B, 3, H, W) in [0, 1] and return the stylized image at that size. TorchScript uses
`torch.jit.script` (the size-dependent padding stays dynamic, tracing would freeze it); ONNX uses the torch.export
based exporter (`dynamo=True`, needs the `onnx` and `onnxscript` packages) with dynamic batch/height/width.
An AdaIN model is exported with its style bound (`AdaINNet.bind_style(style, alpha)`), so the file is
"this style at this alpha".

Tolerance of the agreement check: max |export - eager| <= 1e-3 on outputs in [0, 1]. That is below half an 8-bit
step (1/510 ~ 2e-3), so a saved image differs from the eager one by at most one level in rare rounding cases;
fp32 kernels in other runtimes reorder sums and differ by ~1e-5 after instance norm, so 1e-3 does not flake,
while any real export bug (a frozen shape, a wrong op) gives errors of order 0.1.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

EXPORT_TOLERANCE = 1e-3
EXPORT_FORMATS = ("torchscript", "onnx")


class ExportMismatchError(RuntimeError):
    """An exported model's output disagrees with the eager model beyond the tolerance."""


def _example_input(size: int, multiple: int, seed: int = 0) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Smooth random image (not white noise): closer to a photo's statistics, so the check exercises real ranges.
    coarse = torch.rand(1, 3, max(2, size // 16), max(2, size // 16), generator=generator)
    # Batch of 2 (torch.export specialises size-1 dims) and sides that are not multiples of the network stride.
    coarse = torch.cat([coarse, coarse.flip(-1)])
    return torch.nn.functional.interpolate(
        coarse, size=(size + 1, size + multiple + 3), mode="bicubic"
    ).clamp(0, 1)


def export_torchscript(model: nn.Module, path: Path) -> Path:
    with warnings.catch_warnings():
        # torch 2.14 marks torch.jit as deprecated (FutureWarning) in favour of torch.export; TorchScript files
        # are still what C++/mobile runtimes and many serving stacks load, and the issue asks for them.
        warnings.filterwarnings("ignore", message=".*torch.jit.*deprecated", category=FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(model)
    scripted.save(str(path))
    return path


def export_onnx(model: nn.Module, path: Path, example: Tensor, opset: int | None = None) -> Path:
    try:
        import onnxscript  # noqa: F401  (the torch.export based ONNX exporter needs it)
    except ImportError as error:
        raise ImportError(
            "ONNX export needs the 'onnx' and 'onnxscript' packages: pip install onnxscript (it pulls onnx)."
        ) from error
    batch = torch.export.Dim("batch", min=1, max=64)
    height = torch.export.Dim("height", min=16, max=16384)
    width = torch.export.Dim("width", min=16, max=16384)
    kwargs = {"opset_version": opset} if opset is not None else {}
    with warnings.catch_warnings(), torch.no_grad():  # no_grad: inference graph, no checkpointing wrappers
        warnings.simplefilter("ignore")  # the exporter reports every decomposition it applies
        program = torch.onnx.export(
            model,
            (example,),
            dynamo=True,
            input_names=["image"],
            output_names=["stylized"],
            dynamic_shapes=({0: batch, 2: height, 3: width},),
            verbose=False,
            **kwargs,
        )
    program.save(str(path))
    return path


def run_onnx(path: Path, image: Tensor) -> Tensor:
    """Run an exported .onnx with onnxruntime on CPU (needs the onnxruntime package)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {session.get_inputs()[0].name: image.numpy().astype(np.float32)})
    return torch.from_numpy(output)


def check_export(
    model: nn.Module, paths: dict[str, Path], sizes: Sequence[int] = (64, 96)
) -> dict[str, float]:
    """Max abs difference to eager for each exported format, at sizes other than the export example (shapes must be
    dynamic). Raises ExportMismatchError above EXPORT_TOLERANCE. ONNX is checked only if onnxruntime is installed."""
    multiple = int(getattr(model, "size_multiple", 1))
    errors: dict[str, float] = {}
    for fmt, path in paths.items():
        if fmt == "onnx":
            try:
                import onnxruntime  # noqa: F401
            except ImportError:
                warnings.warn("onnxruntime is not installed: the ONNX export was not checked.", stacklevel=2)
                continue
            runner = lambda x, p=path: run_onnx(p, x)  # noqa: E731
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*torch.jit.*deprecated", category=FutureWarning)
                runner = torch.jit.load(str(path), map_location="cpu")
        worst = 0.0
        for size in sizes:
            x = _example_input(size, multiple, seed=size)
            with torch.inference_mode():
                expected = model(x).float()
                got = runner(x).float()
            if got.shape != expected.shape:
                raise ExportMismatchError(
                    f"{fmt} export returned shape {tuple(got.shape)}, eager {tuple(expected.shape)}."
                )
            worst = max(worst, (got - expected).abs().max().item())
        if worst > EXPORT_TOLERANCE:
            raise ExportMismatchError(
                f"{fmt} export at {path} differs from eager by up to {worst:.2e} (tolerance {EXPORT_TOLERANCE:.0e})."
            )
        errors[fmt] = worst
    return errors


def export_stylizer(
    model: nn.Module,
    out_dir: str | Path,
    formats: Sequence[str] = EXPORT_FORMATS,
    example_size: int = 256,
    name: str = "stylizer",
    check: bool = True,
    opset: int | None = None,
) -> dict[str, Path]:
    """Write `out_dir/<name>.pt` (TorchScript) and/or `out_dir/<name>.onnx`; returns {format: path}.

    model: one-input stylizer in eval mode on CPU (TransformerNet, or AdaINNet.bind_style(style, alpha)); it is
    moved to CPU fp32 contiguous format for export. check=True compares each file with eager at sizes different
    from the example (see module docstring for the tolerance).
    """
    unknown = sorted(set(formats) - set(EXPORT_FORMATS))
    if unknown:
        raise ValueError(f"Unknown export format(s) {unknown}; choose from {list(EXPORT_FORMATS)}.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model.eval().to(device="cpu", dtype=torch.float32, memory_format=torch.contiguous_format)
    multiple = int(getattr(model, "size_multiple", 1))
    paths: dict[str, Path] = {}
    if "torchscript" in formats:
        paths["torchscript"] = export_torchscript(model, out_dir / f"{name}.pt")
    if "onnx" in formats:
        paths["onnx"] = export_onnx(
            model, out_dir / f"{name}.onnx", _example_input(example_size, multiple), opset
        )
    if check:
        check_export(model, paths)
    return paths
