"""What the GAN part contributes to general code, read by `pixelsmith.parts` (nothing general imports this package by
name: README "Removing a part")."""

from pixelsmith.gan.config import DCGANModelConfig, GANModelConfig, R3GANModelConfig, StyleGAN2ModelConfig

SCHEMAS = [
    ("model", "_gan_schema", GANModelConfig),  # any G/D: a fork's own networks
    ("model", "_dcgan_schema", DCGANModelConfig),
    ("model", "_stylegan2_schema", StyleGAN2ModelConfig),
    ("model", "_r3gan_schema", R3GANModelConfig),
]
SHAPING_CONFIG_PREFIXES = ("model.generator.", "model.discriminator.")
# evaluate.py ckpt_path=X.pkl: an NVlabs network pickle, read as data and converted (pixelsmith.gan.nvlabs).
CHECKPOINT_READERS = [(".pkl", "pixelsmith.gan.pretrained.read_checkpoint_pickle")]
