"""Pixelsmith's evaluation metrics: GAN metrics against cached real statistics, and paired-image metrics.

GAN side (a training callback or ``evaluate.py`` calls these)::

    extractor = build_feature_extractor("mnist")          # or "inception", weights_path=...
    reference = load_or_compute_reference_stats(make_batches, extractor=extractor, dataset_fingerprint=...,
                                                dataset_protocol=..., num_samples=N)
    metric = GanMetrics(extractor, reference)             # a torchmetrics Metric: DDP-synced on compute()
    metric.update(generated_images)                       # float in [-1, 1] or uint8
    scores = metric.compute()                             # {"fid", "kid_mean", "kid_std", "is_mean", ...}

Style-transfer side: :func:`gram_matrix` / :func:`style_gram_distance` (shared with the style loss),
:class:`ContentSSIM`, :class:`ImagePSNR`, :class:`LPIPS`, :class:`StyleTransferMetrics`.
The protocol (quantization, resize, float64 statistics) is described in the README, section "Evaluation" ("The protocol").
"""

from pixelsmith.data.fingerprint import (  # the data side of a cache key
    fingerprint_file,
    fingerprint_image_folder,
)
from pixelsmith.data.mnist import mnist_reference
from pixelsmith.metrics.extractors import (
    INCEPTION_WEIGHTS_CONFIG_KEY,
    INCEPTION_WEIGHTS_FILE,
    FeatureExtractor,
    InceptionFeatureExtractor,
    MnistFeatureExtractor,
    build_feature_extractor,
    make_random_fid_inception_weights,
)
from pixelsmith.metrics.feature_metrics import (
    inception_score,
    kernel_inception_distance,
    knn_radii,
    precision_recall,
)
from pixelsmith.metrics.fid import (
    FewSamplesWarning,
    GaussianStats,
    features_to_stats,
    fid_from_features,
    frechet_distance,
)
from pixelsmith.metrics.gan_metrics import ALL_GAN_METRICS, GanMetrics
from pixelsmith.metrics.gram import gram_matrix, style_gram_distance  # the style loss imports these too
from pixelsmith.metrics.image_metrics import (
    LPIPS,
    ContentSSIM,
    ImagePSNR,
    RandomWeightsWarning,
    StyleGramDistance,
    StyleTransferMetrics,
    build_lpips_network,
    lpips_distance,
    to_unit_range,
)
from pixelsmith.metrics.protocol import quantize_to_uint8, uint8_to_unit_range
from pixelsmith.metrics.reference_cache import (
    ReferenceStats,
    default_cache_dir,
    extract_features,
    load_or_compute_reference_stats,
)
from pixelsmith.metrics.weights import MissingWeightsError, resolve_weights_file

__all__ = [
    "ALL_GAN_METRICS",
    "INCEPTION_WEIGHTS_CONFIG_KEY",
    "INCEPTION_WEIGHTS_FILE",
    "LPIPS",
    "ContentSSIM",
    "FeatureExtractor",
    "FewSamplesWarning",
    "GanMetrics",
    "GaussianStats",
    "ImagePSNR",
    "InceptionFeatureExtractor",
    "MissingWeightsError",
    "MnistFeatureExtractor",
    "RandomWeightsWarning",
    "ReferenceStats",
    "StyleGramDistance",
    "StyleTransferMetrics",
    "build_feature_extractor",
    "build_lpips_network",
    "default_cache_dir",
    "extract_features",
    "features_to_stats",
    "fid_from_features",
    "fingerprint_file",
    "fingerprint_image_folder",
    "frechet_distance",
    "gram_matrix",
    "inception_score",
    "kernel_inception_distance",
    "knn_radii",
    "load_or_compute_reference_stats",
    "lpips_distance",
    "make_random_fid_inception_weights",
    "mnist_reference",
    "precision_recall",
    "quantize_to_uint8",
    "resolve_weights_file",
    "style_gram_distance",
    "to_unit_range",
    "uint8_to_unit_range",
]
