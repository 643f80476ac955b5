"""The ``delayq`` command (see :mod:`delayq.cli._main`)."""

from ._main import main

__all__ = ["main"]
