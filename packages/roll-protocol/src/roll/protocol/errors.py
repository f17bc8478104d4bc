"""The root of roll's error hierarchy.

Every error roll raises on purpose derives from :class:`RollError`, so applications can catch roll's
failures in one place. Lower layers define the base; upper layers (``roll.runtime``) add their own.
"""

from __future__ import annotations


class RollError(Exception):
    """Base class of every error raised by roll on purpose."""


class ProtocolError(RollError):
    """A DataProto or dispatch contract was violated (mismatched lengths, conflicting keys, ...)."""
