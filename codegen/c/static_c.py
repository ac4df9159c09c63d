"""The static C kernels: hand-written C files in kernels/ (package data), read once each.
The generated programs include them (emit.py); the load-time helpers build them alone
(build.helper_library)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

KERNELS = Path(__file__).resolve().parent / "kernels"


@dataclass(frozen=True)
class StaticLibrary:
    """A static C library a generated program includes when one of its kernels calls one of
    the library's entry points; `builds_on`: the libraries it calls itself (included before)."""
    name: str
    source: str
    entry_points: tuple[str, ...]
    builds_on: tuple[StaticLibrary, ...] = ()


_CALL = re.compile(r"\b(eq_\w+)\(")


def libraries_called(codes: Iterable[str], libraries: Iterable[StaticLibrary]
                     ) -> list[StaticLibrary]:
    """The libraries whose entry points the kernels' `codes` call, each after those it builds
    on, in the order `libraries` lists them."""
    called = {name for code in codes for name in _CALL.findall(code)}
    wanted: set[str] = set()

    def want(lib: StaticLibrary) -> None:
        wanted.add(lib.name)
        for base in lib.builds_on:
            want(base)
    for lib in libraries:
        if called.intersection(lib.entry_points):
            want(lib)
    return [lib for lib in libraries if lib.name in wanted]


@cache
def kernel_source(name: str) -> str:
    """The text of the C file `name` in kernels/."""
    return (KERNELS / name).read_text()
