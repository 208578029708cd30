"""Loggers with the behaviour a resumable run needs (Lightning's own, adjusted)."""
