"""Neural style transfer: stylizer networks, the frozen VGG loss network, losses, tiled inference and export.

The LightningModule that trains these lives on the shared training core; everything here is plain `nn.Module`s and
functions so that training, `stylize.py` and the tests call the same code.
"""
