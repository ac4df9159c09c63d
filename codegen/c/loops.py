"""Static loop nests over strided tensors: dims of size 1 dropped, adjacent dims merged where
every operand allows it, the innermost loop marked for SIMD, the outermost shared by OpenMP
when the work is large enough to pay for it."""

from __future__ import annotations

from collections.abc import Callable

# elements below which a kernel runs on one thread (a parallel region costs ~1-3 us here)
PARALLEL_MIN = 1 << 15


def broadcast_strides(shape: tuple[int, ...], in_shape: tuple[int, ...],
                      in_strides: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of an operand broadcast to `shape` (0 along broadcast dims)."""
    pad = len(shape) - len(in_shape)
    out = [0] * pad
    for n, m, s in zip(shape[pad:], in_shape, in_strides):
        out.append(0 if (m == 1 and n != 1) else s)
    return tuple(out)


def collapse(shape: tuple[int, ...], strides: list[tuple[int, ...]]
             ) -> tuple[list[int], list[list[int]]]:
    dims = [d for d, n in enumerate(shape) if n != 1]
    sh: list[int] = []
    st: list[list[int]] = [[] for _ in strides]
    for d in dims:
        if sh and all(st[k][-1] == s[d] * shape[d] for k, s in enumerate(strides)):
            sh[-1] *= shape[d]
            for k, s in enumerate(strides):
                st[k][-1] = s[d]
            continue
        sh.append(shape[d])
        for k, s in enumerate(strides):
            st[k].append(s[d])
    return sh, st


def loop_nest(shape: tuple[int, ...], strides: list[tuple[int, ...]],
              body: Callable[[list[str]], str], work: int | None = None,
              simd: bool = True) -> str:
    """C loops over `shape`; `body` gets one offset expression per operand. `work`: the
    kernel's work in elements (default: the loop's size), which decides on threads."""
    sh, st = collapse(shape, strides)
    numel = 1
    for n in shape:
        numel *= n
    parallel = (work or numel) >= PARALLEL_MIN
    if not sh:
        return body(["0"] * len(strides))
    idx = [f"i{d}" for d in range(len(sh))]
    offs = [" + ".join(f"{i}*{s}" for i, s in zip(idx, ss) if s) or "0" for ss in st]
    lines: list[str] = []
    depth = len(sh)
    for d in range(depth):
        if d == 0 and parallel and sh[0] >= 2:
            lines.append("#pragma omp parallel for simd schedule(static)" if depth == 1 and simd
                         else "#pragma omp parallel for schedule(static)")
        elif d == depth - 1 and simd:
            lines.append("#pragma omp simd")
        lines.append(f"for (int64_t {idx[d]} = 0; {idx[d]} < {sh[d]}; {idx[d]}++)")
    return "\n".join(lines) + " {\n" + body(offs) + "\n}"
