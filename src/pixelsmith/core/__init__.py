"""Shared training core: the machinery every Pixelsmith model (GAN, style transfer, a fork's own) runs on."""
