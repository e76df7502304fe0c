"""The one error type of the policy layer."""

from __future__ import annotations

__all__ = ["PolicyConfigError"]


class PolicyConfigError(ValueError):
    """A checkpoint or option the policy layer cannot use; the message names the file and the field."""
