"""Parsing of on/off options given in a URL or as a keyword (the backends' own)."""

from __future__ import annotations

__all__ = ["switch"]


def switch(name: str, value: object) -> bool:
    """``value`` as a bool: a bool as it is, or ``on``/``true``/``1``/``yes`` and
    ``off``/``false``/``0``/``no`` in any case; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("on", "true", "1", "yes"):
        return True
    if isinstance(value, str) and value.lower() in ("off", "false", "0", "no"):
        return False
    raise ValueError(f"{name} must be on or off, not {value!r}")
