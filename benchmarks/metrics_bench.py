"""Benchmark: images/s of Pixelsmith's GAN-metric pipeline vs torch-fidelity on the same extractor, in one run.

    python -m benchmarks.metrics_bench                         # offline MNIST extractor, 2000 images
    python -m benchmarks.metrics_bench --extractor inception --num-images 96   # FID Inception (random weights
                                                               # unless --inception-weights is given)

Both sides compute FID, KID, IS and precision/recall for the same generated images, with the real side cached
(warmed before timing: our .npz reference cache, torch-fidelity's own feature cache). Each timed call is a whole
evaluation as a script would run it: build the extractor, load the real statistics, extract the generated
images' features, compute all metrics. torch-fidelity gets uint8 images (as if decoded from PNGs); ours gets the
generator's float images and quantizes them itself. torch-fidelity runs in its default mode (a 4-worker
DataLoader) and with save_cpu_ram=True (no workers); the faster of the two is the one we compare against.
The calls alternate between the tools and the medians of ``--repeats`` runs are reported.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch_fidelity
from torch.utils.data import Dataset
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY, register_feature_extractor

from pixelsmith.data.mnist import MNIST_FILE, load_mnist
from pixelsmith.metrics.extractors import (
    InceptionFeatureExtractor,
    MnistFeatureExtractor,
    make_random_fid_inception_weights,
)
from pixelsmith.metrics.gan_metrics import GanMetrics
from pixelsmith.metrics.protocol import quantize_to_uint8, uint8_to_unit_range
from pixelsmith.metrics.reference_cache import load_or_compute_reference_stats

TORCH_FIDELITY_MNIST = "pixelsmith-mnist-digits"


class _TorchFidelityMnistExtractor(FeatureExtractorBase):
    """Our MNIST network behind torch-fidelity's extractor interface, so both tools run the same network."""

    def __init__(self, name, features_list, feature_extractor_weights_path=None, **kwargs):
        super().__init__(name, features_list)
        self.inner = MnistFeatureExtractor(feature_extractor_weights_path)

    def forward(self, images_uint8):
        features, logits = self.inner(images_uint8)
        outputs = {"128": features, "logits": logits}
        return tuple(outputs[name] for name in self.features_list)

    @staticmethod
    def get_provided_features_list():
        return "128", "logits"

    @staticmethod
    def get_default_feature_layer_for_metric(metric):
        return {"isc": "logits", "fid": "128", "kid": "128", "prc": "128"}[metric]

    @staticmethod
    def can_be_compiled():
        return False

    @staticmethod
    def get_dummy_input_for_compile():
        return torch.zeros(1, 1, 32, 32, dtype=torch.uint8)


class Uint8Images(Dataset):
    """uint8 image tensors as a Dataset of plain tensors, the input torch-fidelity takes (shared with the tests)."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.images[index]


def _images(data: Path, count: int, offset: int, noise: float) -> torch.Tensor:
    """MNIST training pixels (seeded permutation: the file is sorted by digit) as float [-1, 1], optionally noised."""
    digits, _ = load_mnist(32, data)
    order = torch.randperm(digits.shape[0], generator=torch.Generator().manual_seed(0))
    index = order[offset : offset + count]
    if index.shape[0] < count:
        raise SystemExit(f"{data} has only {digits.shape[0]} digits; ask for fewer images")
    images = uint8_to_unit_range(digits[index])
    generator = torch.Generator().manual_seed(offset)
    return (images + noise * torch.randn(images.shape, generator=generator)).clamp(-1, 1)


def main(argv: list[str] | None = None) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="pixelsmith-bench-"))
    try:
        return _run(argv, workdir)
    finally:  # the caches and random Inception weights (95 MB) are throwaway
        shutil.rmtree(workdir, ignore_errors=True)


def _run(argv: list[str] | None, workdir: Path) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extractor", choices=("mnist", "inception"), default="mnist")
    parser.add_argument(
        "--num-images", type=int, default=2000, help="generated images per evaluation (and real)"
    )
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--inception-weights", type=Path, default=None, help="real FID weights (default: random)"
    )
    parser.add_argument("--data", type=Path, default=MNIST_FILE)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    count = args.num_images
    real = _images(args.data, count, offset=0, noise=0.0)
    generated = _images(args.data, count, offset=count, noise=0.15)
    kid_subset_size = min(1000, count)

    if args.extractor == "mnist":
        weights = None

        def make_extractor():
            return MnistFeatureExtractor()

        fidelity_options = {"feature_extractor": TORCH_FIDELITY_MNIST}
        if TORCH_FIDELITY_MNIST not in FEATURE_EXTRACTORS_REGISTRY:
            register_feature_extractor(TORCH_FIDELITY_MNIST, _TorchFidelityMnistExtractor)
        fidelity_real, fidelity_generated = quantize_to_uint8(real), quantize_to_uint8(generated)
    else:
        weights = args.inception_weights or make_random_fid_inception_weights(
            workdir / "random_inception.pth"
        )

        def make_extractor():
            return InceptionFeatureExtractor(weights, feature_layer=2048)

        fidelity_options = {
            "feature_extractor": "inception-v3-compat",
            "feature_layer_isc": "logits_unbiased",
            "feature_layer_fid": "2048",
            "feature_layer_kid": "2048",
            "feature_layer_prc": "2048",
            "feature_extractor_weights_path": str(weights),
        }
        # torch-fidelity's Inception insists on 3 channels; ours repeats gray itself (same pixels either way).
        fidelity_real = quantize_to_uint8(real).expand(-1, 3, -1, -1).contiguous()
        fidelity_generated = quantize_to_uint8(generated).expand(-1, 3, -1, -1).contiguous()

    def real_batches():
        return real.split(args.batch_size)

    def run_ours() -> dict[str, float]:
        extractor = make_extractor()
        reference = load_or_compute_reference_stats(
            real_batches,
            extractor=extractor,
            dataset_fingerprint=f"bench-{args.extractor}-{count}",
            num_samples=count,
            cache_dir=workdir / "ours",
        )
        metric = GanMetrics(extractor, reference, kid_subset_size=kid_subset_size)
        for batch in generated.split(args.batch_size):
            metric.update(batch)
        return metric.compute()

    def run_theirs(save_cpu_ram: bool) -> dict[str, float]:
        return torch_fidelity.calculate_metrics(
            input1=Uint8Images(fidelity_generated),
            input2=Uint8Images(fidelity_real),
            input2_cache_name=f"pixelsmith-bench-{args.extractor}-{count}",
            cache_root=str(workdir / "torch_fidelity"),
            isc=True,
            fid=True,
            kid=True,
            prc=True,
            kid_subset_size=kid_subset_size,
            batch_size=args.batch_size,
            cuda=False,
            save_cpu_ram=save_cpu_ram,
            verbose=False,
            **fidelity_options,
        )

    runners = {
        "pixelsmith": run_ours,
        "torch-fidelity (default, 4 loader workers)": lambda: run_theirs(False),
        "torch-fidelity (save_cpu_ram=True)": lambda: run_theirs(True),
    }
    print(
        f"extractor={args.extractor}  images={count}  batch={args.batch_size}  threads={args.threads}  "
        f"repeats={args.repeats}  (warming caches...)",
        flush=True,
    )
    outputs = {name: runner() for name, runner in runners.items()}  # warm-up: fills both real-side caches
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, runner in runners.items():
            start = time.perf_counter()
            outputs[name] = runner()
            seconds[name].append(time.perf_counter() - start)

    throughput = {name: count / statistics.median(times) for name, times in seconds.items()}
    for name, times in seconds.items():
        print(
            f"{name:45s} median {statistics.median(times):7.2f} s   {throughput[name]:8.1f} img/s   "
            f"(runs: {', '.join(f'{t:.2f}' for t in times)})"
        )
    best_theirs = max(value for name, value in throughput.items() if name.startswith("torch-fidelity"))
    ratio = throughput["pixelsmith"] / best_theirs
    print(f"ratio pixelsmith / best torch-fidelity: {ratio:.2f}x")
    ours, theirs = outputs["pixelsmith"], outputs["torch-fidelity (save_cpu_ram=True)"]
    print(
        f"same numbers: FID {ours['fid']:.6g} vs {theirs['frechet_inception_distance']:.6g}, "
        f"KID {ours['kid_mean']:.6g} vs {theirs['kernel_inception_distance_mean']:.6g}, "
        f"IS {ours['is_mean']:.6g} vs {theirs['inception_score_mean']:.6g}, "
        f"precision {ours['precision']:.4f} vs {theirs['precision']:.4f}, "
        f"recall {ours['recall']:.4f} vs {theirs['recall']:.4f}"
    )
    return {
        "pixelsmith_img_per_s": throughput["pixelsmith"],
        "torch_fidelity_img_per_s": best_theirs,
        "ratio": ratio,
    }


if __name__ == "__main__":
    main()
