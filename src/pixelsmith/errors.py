"""The one exception family for problems a user fixes by changing a config key, a path or a file.

Entry points print these as one paragraph, without a traceback, and exit non-zero (a multirun job records the
failure and the sweep goes on). Each message names the cause and the fix.
"""


class PixelsmithError(Exception):
    """A user-fixable problem; the message says what to change."""
