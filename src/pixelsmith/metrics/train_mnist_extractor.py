"""Train the offline MNIST feature extractor and write src/pixelsmith/assets/mnist_extractor.pt.

    python -m pixelsmith.metrics.train_mnist_extractor [--epochs 10] [--out PATH]

The classifier sees exactly what the metric feeds it: the GAN's training pixels (pixelsmith.data.mnist.load_mnist:
data/mnist_5k.npz resized to 32x32 uint8, bilinear with antialias, rounded) mapped to [-1, 1]. The file is sorted by digit, so
the held-out test split is the last 100 images *of each digit* (1000 images), not the last 1000 rows (which would
be only 8s and 9s). Training uses small random affine jitter so that features of imperfect GAN digits stay
meaningful, and label smoothing (0.05), which bounds the logits and with them the scale of the penultimate
features: trained without it, the features grew ~4x larger, KID's cubic kernel became dominated by a few large
samples (real-vs-real KID std 400 against a mean of 16) and blurred, noised digits reached a precision of 0.85. Seeded; on a 2-core CPU it takes about a minute.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pixelsmith.data.mnist import MNIST_FILE, load_mnist
from pixelsmith.hashing import file_sha256
from pixelsmith.metrics.extractors import MNIST_EXTRACTOR_WEIGHTS, MnistDigitNet, MnistFeatureExtractor
from pixelsmith.metrics.protocol import uint8_to_unit_range

TEST_PER_CLASS = 100


def stratified_split(
    labels: np.ndarray, test_per_class: int = TEST_PER_CLASS
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test): the last ``test_per_class`` occurrences of every label go to test."""
    test = np.concatenate([np.flatnonzero(labels == label)[-test_per_class:] for label in np.unique(labels)])
    train = np.setdiff1d(np.arange(labels.shape[0]), test)
    return train, np.sort(test)


def load_split(data_path: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train uint8 [N,1,32,32], train labels, test uint8, test labels): the GAN's own training pixels."""
    pixels, labels = load_mnist(32, data_path)
    train, test = stratified_split(labels.numpy())
    return pixels[train], labels[train], pixels[test], labels[test]


def random_affine(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Rotate +-10 degrees, scale 0.9-1.1, translate +-2 px; background stays -1 (black)."""
    batch = images.shape[0]
    angle = (torch.rand(batch, generator=generator) * 2 - 1) * math.radians(10)
    scale = 0.9 + torch.rand(batch, generator=generator) * 0.2
    shift = (torch.rand(batch, 2, generator=generator) * 2 - 1) * (2.0 / 16.0)  # 2 px in [-1, 1] coordinates
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack(
        [torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1
    )
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images + 1, grid, mode="bilinear", padding_mode="zeros", align_corners=False) - 1


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=MNIST_FILE, help="mnist_5k.npz (images, labels)")
    parser.add_argument(
        "--out", type=Path, default=MNIST_EXTRACTOR_WEIGHTS, help="where to write the weights"
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    train_pixels, train_labels, test_pixels, test_labels = load_split(args.data)
    train_images = uint8_to_unit_range(train_pixels)

    net = MnistDigitNet()
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    steps_per_epoch = math.ceil(train_images.shape[0] / args.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch, pct_start=0.15
    )
    start = time.perf_counter()
    for epoch in range(args.epochs):
        net.train()
        order = torch.randperm(train_images.shape[0], generator=generator)
        total_loss = 0.0
        for first in range(0, order.shape[0], args.batch_size):
            batch = order[first : first + args.batch_size]
            _, logits = net(random_affine(train_images[batch], generator))
            loss = F.cross_entropy(logits, train_labels[batch], label_smoothing=0.05)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total_loss += loss.item() * batch.shape[0]
        print(
            f"epoch {epoch + 1}/{args.epochs}  loss {total_loss / order.shape[0]:.4f}  "
            f"{time.perf_counter() - start:.0f}s",
            flush=True,
        )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {
        "state_dict": {name: tensor.contiguous() for name, tensor in net.state_dict().items()},
        "feature_dim": 128,
        "test_accuracy": 0.0,
        "test_split": f"last {TEST_PER_CLASS} images of each digit in {args.data.name} (1000 images)",
        "train_size": int(train_images.shape[0]),
        "epochs": args.epochs,
        "seed": args.seed,
    }
    # Measure accuracy through the extractor itself (uint8 in, eval mode), i.e. exactly as the metric runs.
    descriptor, temporary_name = tempfile.mkstemp(dir=args.out.parent, suffix=".tmp")
    os.close(descriptor)
    torch.save(checkpoint, temporary_name)
    accuracy = evaluate(MnistFeatureExtractor(temporary_name), test_pixels, test_labels)
    checkpoint["test_accuracy"] = accuracy
    torch.save(checkpoint, temporary_name)
    os.replace(temporary_name, args.out)
    print(f"test accuracy {accuracy:.4f} on {test_labels.shape[0]} held-out digits")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB, sha256 {file_sha256(args.out)[:16]})")
    return accuracy


@torch.no_grad()
def evaluate(extractor: MnistFeatureExtractor, pixels: torch.Tensor, labels: torch.Tensor) -> float:
    _, logits = extractor(pixels)
    return float((logits.argmax(dim=1) == labels).float().mean())


if __name__ == "__main__":
    main()
