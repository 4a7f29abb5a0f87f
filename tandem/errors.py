"""The error every config check raises, in a module of its own so that any part can raise it.

``python -m tandem.train`` turns it into one message and exit status 2 (no traceback).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """One or more problems with a composed config, each naming the key, the rule and the fix."""
