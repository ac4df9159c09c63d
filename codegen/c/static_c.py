"""The static C kernels: hand-written C files in kernels/ (package data), read once each.
The generated programs include them (emit.py); the load-time helpers build them alone
(build.helper_library)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

KERNELS = Path(__file__).resolve().parent / "kernels"


@cache
def kernel_source(name: str) -> str:
    """The text of the C file `name` in kernels/."""
    return (KERNELS / name).read_text()
