"""Export: TorchScript and ONNX files load back and agree with eager at sizes other than the export example."""

import pytest
import torch

from pixelsmith.style.export import EXPORT_TOLERANCE, ExportMismatchError, check_export, export_stylizer
from pixelsmith.style.networks import AdaINNet, TransformerNet

pytestmark = [
    pytest.mark.filterwarnings("ignore::pixelsmith.style.loss_network.RandomLossNetworkWeightsWarning"),
    pytest.mark.filterwarnings("ignore:.*torch.jit.load.* is deprecated:FutureWarning"),
]


def _run_onnx(path, x):
    # onnxscript (the exporter) and onnxruntime are optional for users but pinned in the dev extras: a missing
    # one fails here rather than skipping the export check.
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


@pytest.mark.slow  # the torch.export-based ONNX exporter needs ~15 s per model on 2 cores
def test_transformer_net_exports_agree_with_eager(tmp_path):
    torch.manual_seed(0)
    net = TransformerNet(base_channels=8, num_residual_blocks=2).eval()
    paths = export_stylizer(net, tmp_path, example_size=64)
    assert paths["torchscript"].suffix == ".pt" and paths["onnx"].suffix == ".onnx"
    x = torch.rand(3, 3, 45, 70)  # batch, height and width all differ from the export example
    with torch.inference_mode():
        expected = net(x)
        scripted = torch.jit.load(str(paths["torchscript"]))(x)
    onnx_out = _run_onnx(paths["onnx"], x)
    assert expected.std() > 0.01  # a non-trivial output to compare
    for got in (scripted, onnx_out):
        assert got.shape == expected.shape
        assert (got - expected).abs().max() <= EXPORT_TOLERANCE


@pytest.mark.slow
def test_adain_with_bound_style_exports_agree_with_eager(tmp_path):
    torch.manual_seed(0)
    stylizer = AdaINNet.build(pretrained=False, decoder={"width": 0.25}).bind_style(
        torch.rand(1, 3, 64, 64), 0.7
    )
    paths = export_stylizer(stylizer, tmp_path, example_size=64)
    x = torch.rand(2, 3, 50, 41)
    with torch.inference_mode():
        expected = stylizer(x)
        scripted = torch.jit.load(str(paths["torchscript"]))(x)
    assert expected.std() > 0.01
    assert (scripted - expected).abs().max() <= EXPORT_TOLERANCE
    assert (_run_onnx(paths["onnx"], x) - expected).abs().max() <= EXPORT_TOLERANCE


def test_export_check_catches_a_wrong_file_and_bad_formats(tmp_path):
    torch.manual_seed(0)
    net = TransformerNet(base_channels=8, num_residual_blocks=1).eval()
    paths = export_stylizer(net, tmp_path, formats=("torchscript",), example_size=32, check=False)
    other = TransformerNet(base_channels=8, num_residual_blocks=1).eval()  # different random weights
    with pytest.raises(ExportMismatchError, match="torchscript"):
        check_export(other, paths)
    with pytest.raises(ValueError, match="tflite"):
        export_stylizer(net, tmp_path, formats=("tflite",))
