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
# Keys that add tensors by their value: a regularizer with state (the path-length mean).
SHAPING_CONFIG_PATTERNS = (r"model\.objective\.regularizers\.[^.]+\._target_",)
# Keys whose other value makes the same tensors compute another function (StyleGAN2's resampling: bilinear then a
# 3x3 conv, or a transposed conv then a [1,3,3,1] blur): a resume with another value is refused (run/resume.py).
FUNCTION_CONFIG_KEYS = ("model.generator.upsampling", "model.discriminator.downsampling")
# OmegaConf resolvers the part's presets use: NVlabs' 'auto' heuristics and kimg -> iterations (experiment=stylegan2_*)
RESOLVERS = [register_stylegan2_resolvers]
# evaluate.py ckpt_path=X.pkl: an NVlabs network pickle, read as data and converted (pixelsmith.gan.nvlabs).
CHECKPOINT_READERS = [(".pkl", "pixelsmith.gan.pretrained.read_checkpoint_pickle")]
# Commands an installed package runs through general wrappers (cli/): name -> "module.function".
COMMANDS = [("convert", "pixelsmith.gan.convert.main")]
