"""The static C kernels: hand-written C files in kernels/ (package data), read once each.
Each library is a header (kernels/<name>.h: its types and entry points) and a body
(<name>.c). The generated programs call them through the shared kernel library
(kernel_library.py) or include their whole text (a standalone project, the kernel tests:
emit.py); the load-time helpers build them alone (build.helper_library)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

KERNELS = Path(__file__).resolve().parent / "kernels"


@dataclass(frozen=True)
class StaticLibrary:
    """A static C library a generated program uses when one of its kernels declares it calls
    it (`calling`): `source` its whole text (header first), `header` what a program built
    against the shared kernel library (kernel_library.py) sees of it: its types and entry
    points. `entry_points`: the functions kernels call; `builds_on`: the libraries it calls
    itself (included before)."""
    name: str
    source: str
    entry_points: tuple[str, ...]
    builds_on: tuple[StaticLibrary, ...] = ()
    header: str = ""


class KernelCode(str):
    """A kernel's C body and the static libraries it calls (an emitter's declaration:
    `calling(code, PACKED_GEMM)`); a program includes those and what they build on."""
    libraries: frozenset[StaticLibrary] = frozenset()


def calling(code: str, *libraries: StaticLibrary) -> KernelCode:
    """`code`, declared to call these libraries' entry points."""
    out = KernelCode(code)
    out.libraries = getattr(code, "libraries", frozenset()) | frozenset(libraries)
    return out


def included(codes: Iterable[str], order: Iterable[StaticLibrary]) -> list[StaticLibrary]:
    """The libraries the kernels' `codes` declare (calling), each with those it builds on, in
    `order`."""
    wanted: set[str] = set()

    def want(lib: StaticLibrary) -> None:
        wanted.add(lib.name)
        for base in lib.builds_on:
            want(base)
    for code in codes:
        for lib in getattr(code, "libraries", ()):
            want(lib)
    return [lib for lib in order if lib.name in wanted]


def library_text(name: str, body: str | None = None) -> tuple[str, str]:
    """(header, header + body) of the library kernels/<name>.h and .c; `body`: the .c's text
    as the caller rewrote it (its tables filled in)."""
    header = kernel_source(f"{name}.h")
    return header, header + (kernel_source(f"{name}.c") if body is None else body)


@cache
def kernel_source(name: str) -> str:
    """The text of the C file `name` in kernels/."""
    return (KERNELS / name).read_text()
