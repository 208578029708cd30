"""GAN models for Pixelsmith: networks, losses and the Lightning training module."""
