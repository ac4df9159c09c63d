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

from .emit_routing import EXPERTS, QUANT_EXPERTS, TOPK
from .packed_gemm import PACKED_GEMM
from .prelude import PRELUDE
from .quant_gemm import QUANT_GEMM
from .sparse_gemm import SPARSE_GEMM
from .static_c import StaticLibrary
from .w8a8_gemm import W8A8_GEMM

# every library, each after those it builds on
LIBRARIES: tuple[StaticLibrary, ...] = (PACKED_GEMM, QUANT_GEMM, SPARSE_GEMM, W8A8_GEMM, EXPERTS,
                                        QUANT_EXPERTS, TOPK)
SOURCE = PRELUDE + "".join(lib.source for lib in LIBRARIES)
# the names a program and the library share: renamed per build
SHARED_SYMBOLS = ("eq_index_error", *dict.fromkeys(
    name for lib in LIBRARIES for name in lib.entry_points))


@dataclass(frozen=True)
class LibraryBuild:
    """How the library for one flag set is compiled, and how a program calls it."""
    tag: str
    flags: tuple[str, ...]  # the library's own compile

    @property
    def file_name(self) -> str:  # (its soname too: the name a program's loader looks for)
        return f"eqk-{self.tag}.so"

    @property
    def index_error_symbol(self) -> str:
        return f"eq_index_error_{self.tag}"

    def program_defines(self) -> list[str]:
        """A linked program's flags: the entry points declared extern, renamed as the
        library's."""
        return ["-DEQ_ENTRY=", "-DEQ_LINKED", *_renames(self.tag)]


def _renames(tag: str) -> list[str]:
    return [f"-D{name}={name}_{tag}" for name in SHARED_SYMBOLS]


def library_flags(program_flags: list[str]) -> list[str]:
    """The program's flags that the library's code depends on: without the profiling build's
    timers and the BLAS link, which only a program's own kernels use."""
    return [f for f in program_flags if f not in ("-DEQ_PROFILE", "-DEQ_USE_BLAS")
            and not f.startswith(("-L", "-l", "-Wl,"))]


@cache
def library_build(flags: tuple[str, ...], compiler_id: str) -> LibraryBuild:
    """The library build for a program compiled with `flags` by the compiler `compiler_id`."""
    base = library_flags(list(flags))
    tag = hashlib.sha256("\0".join([SOURCE, *base, compiler_id]).encode()).hexdigest()[:16]
    own = [*base, "-fvisibility=hidden", "-fno-semantic-interposition",
           '-DEQ_ENTRY=__attribute__((visibility("default")))', *_renames(tag),
           f"-Wl,-soname,eqk-{tag}.so"]
    return LibraryBuild(tag, tuple(own))
