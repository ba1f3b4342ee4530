"""The version of luft-redis, kept in this one place (the build reads it: ``[tool.hatch.version]``
in pyproject.toml). A module of its own, so that any module of the package can import it
without importing the package's face (``luft_redis/__init__.py``)."""

from __future__ import annotations

__version__ = "0.1.0"
