"""Range rules of the GAN part's config keys (objective regularisers, StyleGAN2's networks, the two optimizers),
handed to the general start-up check through part.py's CONFIG_RULES, and the ranges of its scheduled values."""

from __future__ import annotations

from pixelsmith.config.rules import (
    PENALTY_WEIGHT,
    Rule,
    non_negative,
    optimizer_rules,
    optional,
    positive,
    positive_int,
)

MAX_MAPPING_LAYERS = 64
MAX_RESOLUTION = 8192

CONFIG_RULES: list[Rule] = [
    PENALTY_WEIGHT.rule("model.objective.regularizers.r1.gamma"),
    PENALTY_WEIGHT.rule("model.objective.gamma", "0.05"),  # R3GAN's R1 + R2 weight
    PENALTY_WEIGHT.rule("model.objective.gp_weight"),  # WGAN-GP's gradient penalty
    Rule(
        "model.objective.regularizers.r1.interval",
        positive_int,
        "must be at least 1 (R1 every N iterations)",
        "16",
    ),
    Rule(
        "model.objective.regularizers.path_length.weight",
        non_negative,
        "must be >= 0 (0 disables it)",
        "2.0",
    ),
    Rule("model.objective.regularizers.path_length.interval", positive_int, "must be at least 1", "4"),
    *(
        rule
        for net in ("generator", "discriminator")
        for rule in (
            Rule(
                f"model.{net}.num_fp16_res",
                optional(lambda v: non_negative(v) and isinstance(v, int)),
                "must be >= 0 (the number of highest resolutions run in fp16 under 16-mixed, 0 = none), or null "
                "(the whole network under the run's autocast)",
                "4",
            ),
            Rule(
                f"model.{net}.conv_clamp",
                optional(positive),
                "must be > 0 (conv outputs clamped to +-this; NVlabs uses 256 with fp16), or null (no clamp)",
                "256",
            ),
        )
    ),
    Rule(
        "model.generator.style_mixing_prob",
        lambda v: non_negative(v) and v <= 1,
        "must be a probability in [0, 1] (NVlabs' StyleGAN2 uses 0.9; 0 turns style mixing off)",
        "0.9",
    ),
    Rule(
        "model.generator.c_dim",
        lambda v: non_negative(v) and isinstance(v, int),
        "must be an integer >= 0 (0 = unconditional, else the number of classes of the one-hot labels)",
        "0",
    ),
    Rule(
        "model.sample_grid_size",
        lambda v: positive_int(v) and v <= 1024,
        "must be in 1..1024 (images in each sample grid)",
        "64",
    ),
    # The networks' sizes: at 0 a layer has no inputs or no channels, and would fail (or train nothing) only later.
    Rule("model.generator.z_dim", positive_int, "must be at least 1 (the latent's size)", "128"),
    Rule("model.generator.w_dim", positive_int, "must be at least 1 (StyleGAN2's style vector size)", "128"),
    Rule(
        "model.generator.mapping_layers",
        lambda v: positive_int(v) and v <= MAX_MAPPING_LAYERS,
        f"must be in 1..{MAX_MAPPING_LAYERS} (NVlabs: 8; 2 for CIFAR)",
        "4",
    ),
    Rule("model.generator.ngf", positive_int, "must be at least 1 (DCGAN's generator width)", "64"),
    Rule("model.discriminator.ndf", positive_int, "must be at least 1 (DCGAN's discriminator width)", "64"),
    Rule(
        "model.discriminator.mbstd_group_size",
        positive_int,
        "must be at least 1 (images per minibatch-stddev group; 1 compares none)",
        "4",
    ),
    *(
        rule
        for net in ("generator", "discriminator")
        for rule in (
            Rule(
                f"model.{net}.channel_base",
                positive_int,
                "must be at least 1 (channels at resolution r: min(channel_base / r, channel_max); at least "
                "data.resolution, so the top block has a channel)",
                "4096",
            ),
            Rule(
                f"model.{net}.channel_max",
                positive_int,
                "must be at least 1 (the widest layer's channels)",
                "256",
            ),
            Rule(
                f"model.{net}.widths",
                lambda v: isinstance(v, list) and bool(v) and all(positive_int(w) for w in v),
                "must list one width of at least 1 per stage, from 4x4 up (R3GAN)",
                "[768,768,768,768]",
            ),
            Rule(
                f"model.{net}.groups",
                lambda v: isinstance(v, list) and bool(v) and all(positive_int(g) for g in v),
                "must list one group count of at least 1 per stage, from 4x4 up (R3GAN)",
                "[96,96,96,96]",
            ),
            Rule(
                f"model.{net}.blocks",
                lambda v: (
                    positive_int(v) or (isinstance(v, list) and bool(v) and all(positive_int(b) for b in v))
                ),
                "must be the residual blocks per stage: a number of at least 1, or one per stage (R3GAN)",
                "2",
            ),
            Rule(
                f"model.{net}.expansion", positive_int, "must be at least 1 (R3GAN's block width factor)", "2"
            ),
            Rule(
                f"model.{net}.kernel",
                lambda v: positive_int(v) and v % 2 == 1,
                "must be an odd number (R3GAN's grouped conv: an even one would shrink the feature maps)",
                "3",
            ),
        )
    ),
    *optimizer_rules("model.g_optimizer"),
    *optimizer_rules("model.d_optimizer"),
]

# model.schedules.<name> of the GAN objectives' own scalars (R1/R2's gamma, WGAN-GP's weight).
SCHEDULED_RANGES = [("gamma", PENALTY_WEIGHT), ("gp_weight", PENALTY_WEIGHT)]


# Bounds a file's stored network config meets before a network is built from it (the counts that size Python lists
# and modules, which the meta-device check of the weights would meet only after building them). Not in CONFIG_RULES:
# a training config's networks take data.resolution and data.channels, whose own rules say it once.
STORED_NETWORK_RULES: list[Rule] = [
    *(
        Rule(
            f"model.{net}.resolution",
            lambda v: positive_int(v) and 4 <= v <= MAX_RESOLUTION,
            f"must be in 4..{MAX_RESOLUTION} pixels",
            "256",
        )
        for net in ("generator", "discriminator")
    ),
    *(
        Rule(
            f"model.{net}.channels",
            lambda v: positive_int(v) and v <= 4,
            "must be 1 to 4 image channels",
            "3",
        )
        for net in ("generator", "discriminator")
    ),
]
