"""The kernel libraries (kernels/*.c) compiled once per flag set, apart from the programs.

A program used to include the libraries' whole text and compile it with its own kernels:
gcc -O3 took ~0.8 s for the packed GEMM alone and ~1.9 s with the quantized one, in every
program (docs/decisions.md). Now every library is compiled together into one shared object
per (flags, compiler), kept in the compile cache beside the programs as `eqk-<tag>.so`; a
program includes only the libraries' headers (their types and entry points, kernels/*.h)
and links against it, found next to it at load time (rpath $ORIGIN).

The entry points, and the index-error flag the kernels set, are exported under names
suffixed with the tag (`-Deq_gemm_q=eq_gemm_q_<tag>` in both compiles): two libraries in
one process (other flags, another revision of the kernels) never serve each other's
programs. Everything else in the library is hidden. A standalone project and the kernel
tests still include the whole text (emit_program's `linked=False`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .build import PROFILE_FLAG
from .emit import STATIC_LIBRARIES
from .prelude import PRELUDE

# every library a program calls, each after those it builds on (emit.py's order; the per-format
# defines, which have no header, are for a whole-text program only)
LIBRARIES = tuple(lib for lib in STATIC_LIBRARIES if lib.header)
SOURCE = PRELUDE + "".join(lib.source for lib in LIBRARIES)
# the names a program and the library share: renamed per build
SHARED_SYMBOLS = ("eq_index_error", *dict.fromkeys(
    name for lib in LIBRARIES for name in lib.entry_points))


@dataclass(frozen=True)
class LibraryBuild:
    """How the library for one flag set is compiled, and how a program calls it."""
    tag: str
    base_flags: tuple[str, ...]  # the programs' flags that its code depends on

    @property
    def file_name(self) -> str:  # (its soname too: the name a program's loader looks for)
        return f"eqk-{self.tag}.so"

    @property
    def flags(self) -> list[str]:
        """The library's own compile: its entry points exported, renamed; the rest hidden."""
        return [*self.base_flags, "-fvisibility=hidden", "-fno-semantic-interposition",
                '-DEQ_ENTRY=__attribute__((visibility("default")))', *self._renames(),
                f"-Wl,-soname,{self.file_name}"]

    @property
    def index_error_symbol(self) -> str:
        return f"eq_index_error_{self.tag}"

    def program_defines(self) -> list[str]:
        """A linked program's flags: the entry points declared extern, renamed as the
        library's."""
        return ["-DEQ_ENTRY=", "-DEQ_LINKED", *self._renames()]

    @staticmethod
    def link_flags(path: Path) -> list[str]:
        """A linked program's link: the library at `path`, found beside it when loaded."""
        return [str(path), "-Wl,-rpath,$ORIGIN"]

    def _renames(self) -> list[str]:
        return [f"-D{name}={name}_{self.tag}" for name in SHARED_SYMBOLS]


def library_flags(program_flags: list[str]) -> list[str]:
    """The program's flags that the library's code depends on: without the profiling build's
    timers and the BLAS link, which only a program's own kernels use."""
    return [f for f in program_flags if f not in (PROFILE_FLAG, "-DEQ_USE_BLAS")
            and not f.startswith(("-L", "-l", "-Wl,"))]


@cache
def library_build(flags: tuple[str, ...], compiler_id: str) -> LibraryBuild:
    """The library build for a program compiled with `flags` by the compiler `compiler_id`."""
    base = library_flags(list(flags))
    tag = hashlib.sha256("\0".join([SOURCE, *base, compiler_id]).encode()).hexdigest()[:16]
    return LibraryBuild(tag, tuple(base))
