"""What the GAN part contributes to general code, read by `pixelsmith.parts` (nothing general imports this package by
name: README "Removing a part")."""

from pixelsmith.gan.config import DCGANModelConfig, GANModelConfig, R3GANModelConfig, StyleGAN2ModelConfig
from pixelsmith.gan.rules import CONFIG_RULES, SCHEDULED_RANGES  # noqa: F401 (read by pixelsmith.parts)
from pixelsmith.gan.stylegan2_auto import register_stylegan2_resolvers

SCHEMAS = [
    ("model", "_gan_schema", GANModelConfig),  # any G/D: a fork's own networks
    ("model", "_dcgan_schema", DCGANModelConfig),
    ("model", "_stylegan2_schema", StyleGAN2ModelConfig),
    ("model", "_r3gan_schema", R3GANModelConfig),
]
SHAPING_CONFIG_PREFIXES = ("model.generator.", "model.discriminator.")
# OmegaConf resolvers the part's presets use: NVlabs' 'auto' heuristics and kimg -> iterations (experiment=stylegan2_*)
RESOLVERS = [register_stylegan2_resolvers]
