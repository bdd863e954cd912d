"""The root of every opendpu error, so that a caller (the CLI first) can catch one type.

isa is the base layer every package imports, so the root lives here. Each package error also keeps its own
built-in base (ValueError, RuntimeError), and `except ValueError` code keeps working.
"""
from __future__ import annotations


class OpenDpuError(Exception):
    """Base class of every error opendpu raises on purpose: bad input, a rejected program, a failed run."""


__all__ = ["OpenDpuError"]
