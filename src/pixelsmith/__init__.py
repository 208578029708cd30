"""Pixelsmith: a Lightning + Hydra template for training GANs and neural style transfer fast."""

__version__ = "0.1.0"
