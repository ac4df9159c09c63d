"""Kernels that differ only in where they read and write share one C function.

A decoder's layers give the same kernels layer after layer (the same op, shapes, strides and
fusion), specialised apart only by their places: arena offsets `(A + n)` and slot indices
`W[n]`, `IN[n]`, `OUT[n]`. Emitting each as its own function made the C source, and the
compile, grow with the depth (22 layers of TinyLlama: 20-40 s of gcc). Here each kernel's
places become parameters `P[k]` (numbered by first appearance, one per distinct place), and
the kernels whose bodies are then equal text are one function, called with each kernel's own
places from a static table:

    static void k12_gemm(char* restrict A, void* const* IN, void* const* W, void* const* OUT,
                         const long long* restrict P) { ... (A + P[0]) ... W[P[1]] ... }
    static const long long eq_p40[] = {4096, 17, 8192};   k12_gemm(A, IN, W, OUT, eq_p40);

Two places equal in one kernel and apart in another make different bodies (the first reads
its output in place), so sharing never merges kernels that alias differently."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PLACE = re.compile(r"\(A \+ (\d+)\)|\b(IN|W|OUT)\[(\d+)\]")


@dataclass(frozen=True)
class Parameterized:
    body: str  # the kernel's code with its places as P[k]
    places: tuple[int, ...]  # P's values for this kernel


def parameterized(code: str) -> Parameterized:
    index: dict[tuple[str, int], int] = {}

    def param(m: re.Match) -> str:
        kind, value = ("A", int(m.group(1))) if m.group(1) else (m.group(2), int(m.group(3)))
        k = index.setdefault((kind, value), len(index))
        return f"(A + P[{k}])" if kind == "A" else f"{kind}[P[{k}]]"
    body = _PLACE.sub(param, code)
    return Parameterized(body, tuple(value for _, value in index))


def function(name: str, body: str) -> str:
    """The C function of a (parameterized) kernel body."""
    return (f"static void {name}(char* restrict A, void* const* IN, void* const* W, "
            f"void* const* OUT, const long long* restrict P) {{\n"
            f"(void)A; (void)IN; (void)W; (void)OUT; (void)P;\n{body}\n}}")


def places_table(name: str, places: tuple[int, ...]) -> str:
    return f"static const long long {name}[] = {{{', '.join(map(str, places)) or '0'}}};"
