"""Generator and discriminator architectures used by the GAN training module."""
