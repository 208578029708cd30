"""The Gram matrix and Gram distance, kept importable here for code written against this older place.

They live in `pixelsmith.metrics.gram` (general code, which the style part imports, never the other way round).
"""

from pixelsmith.metrics.gram import gram_matrix, style_gram_distance

__all__ = ["gram_matrix", "style_gram_distance"]
