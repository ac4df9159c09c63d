"""Reductions (sum, mean, amax, amin, any over a list of dims, keepdim or not) and cumsum.

Two loop shapes, chosen by where the input is contiguous:

- the innermost (smallest-stride) dim of x is reduced: one accumulator per output element, the
  reduced dims as inner loops (`omp simd reduction`, contiguous innermost); outputs shared by
  the threads, or, with few outputs and much work, each output's outer reduced loop;
- it is kept: outputs in chunks of `CHUNK` along that dim, a local array of accumulators per
  chunk updated by a SIMD loop for each reduced position; tasks (chunk x other kept dims)
  shared by the threads.

Float sums accumulate in double (torch's CPU cumsum does too; its sum is a float32 cascade,
within 1e-6 of this), integer and bool sums in int64; amax/amin propagate NaN as torch does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from ...ir import Node
from .loops import PARALLEL_MIN, collapse, loop_nest
from .values import Ref

REDUCE_OPS = frozenset({"sum", "mean", "amax", "amin", "any", "cumsum"})
CHUNK = 256  # columns per task in the kept-innermost shape (a 2 KiB stack array of doubles)
FEW_OUTPUTS = 64  # below this many outputs a large reduction splits each output's loop
FLOAT_CT = ("float", "double")
LIMITS = {"int64_t": ("INT64_MIN", "INT64_MAX"), "int32_t": ("INT32_MIN", "INT32_MAX"),
          "int16_t": ("INT16_MIN", "INT16_MAX"), "int8_t": ("INT8_MIN", "INT8_MAX"),
          "uint8_t": ("0", "UINT8_MAX"), "_Bool": ("0", "1")}


@dataclass(frozen=True)
class Fold:
    """How one output folds its elements: accumulator `a` of C type `acc` starting at `init`;
    `load` makes the element `v` (of type acc) from `{x}`; `step` folds `v` into `a` in a SIMD
    loop carrying `clause` as its reduction; `column` is the same on `a[j]` (no clause needed);
    `done` is the result from `{a}`; `nan`: a NaN flag is carried too (amax/amin on floats)."""
    acc: str
    init: str
    load: str
    step: str
    clause: str
    column: str
    done: str = "{a}"
    nan: bool = False


def _fold(op: str, xt: str, ot: str, count: int) -> Fold | None:
    fl = xt in FLOAT_CT
    if op in ("sum", "mean"):
        if (op == "mean" and not fl) or (fl and ot != xt) or (not fl and ot != "int64_t"):
            return None
        acc = "double" if fl else "int64_t"
        done = f"{{a}} / {count}.0" if op == "mean" else "{a}"
        return Fold(acc, "0", f"({acc}){{x}}", "a += v;", "reduction(+:a)", "a[j] += v;", done)
    if op == "any":
        return Fold("int", "0", "({x} != 0)", "a |= v;", "reduction(|:a)", "a[j] |= v;")
    if op in ("amax", "amin") and ot == xt:
        c, m = (">", "max") if op == "amax" else ("<", "min")
        if fl:
            init = "-INFINITY" if op == "amax" else "INFINITY"
            return Fold(xt, init, "{x}", f"a = v {c} a ? v : a; nan |= v != v;",
                        f"reduction({m}:a) reduction(|:nan)",
                        f"a[j] = (v != v || v {c} a[j]) ? v : a[j];", nan=True)
        lo, hi = LIMITS[xt]
        acc = "int" if xt == "_Bool" else xt
        return Fold(acc, lo if op == "amax" else hi, f"({acc}){{x}}", f"a = v {c} a ? v : a;",
                    f"reduction({m}:a)", f"a[j] = v {c} a[j] ? v : a[j];")
    return None


def flat_offset(var: str, shape: list[int], strides: list[int]) -> str:
    """The offset of flat index `var` (row-major over `shape`) under `strides`."""
    if 0 in shape:  # no index: the loop around it does not run
        return "0"
    terms = []
    for d, (n, s) in enumerate(zip(shape, strides)):
        inner = prod(shape[d + 1:])
        i = var if inner == 1 else f"({var} / {inner})"
        i = i if d == 0 else f"({i} % {n})"
        if s:
            terms.append(f"{i} * {s}")
    return " + ".join(terms) or "0"


def _innermost(x: Ref) -> int | None:
    """x's dim of smallest positive stride among those longer than 1."""
    dims = [d for d, n in enumerate(x.shape) if n > 1 and x.strides[d] != 0]
    return min(dims, key=lambda d: x.strides[d]) if dims else None


def _loops(shape: list[int], strides: list[int], body: Callable[[str], str],
           first: str | None = None, last: str | None = None) -> str:
    """Plain nested loops over `shape` (collapsed; indices r0, r1, ..); `body` gets the offset
    under `strides`; `first`/`last`: pragmas of the outermost/innermost loop."""
    sh, (st,) = collapse(tuple(shape), [tuple(strides)])
    if not sh:
        return "{ " + body("0") + " }"
    lines = []
    for k, n in enumerate(sh):
        if k == 0 and first:
            lines.append(first.replace("for", "for simd", 1) if len(sh) == 1 and last
                         else first)
        elif k == len(sh) - 1 and last:
            lines.append(last)
        lines.append(f"for (int64_t r{k} = 0; r{k} < {n}; r{k}++)")
    off = " + ".join(f"r{k}*{s}" for k, s in enumerate(st) if s) or "0"
    return "\n".join(lines) + " {\n" + body(off) + "\n}"


def _out_strides(out: Ref, x: Ref, dims: set[int], keepdim: bool) -> tuple[int, ...]:
    """out's strides over x's shape: 0 along the reduced dims."""
    if keepdim:
        return tuple(0 if d in dims else s for d, s in enumerate(out.strides))
    it = iter(out.strides)
    return tuple(0 if d in dims else next(it) for d in range(len(x.shape)))


def emit_reduce(node: Node, out: Ref, ins: list[Ref]) -> str | None:
    x = ins[0]
    if x.space == "scalar":
        return None
    if node.op == "cumsum":
        return _cumsum(node, out, x)
    nd = len(x.shape)
    given = node.attrs["dims"] if nd else []
    dims = {d % nd for d in given} if given else set(range(nd))
    count = prod(x.shape[d] for d in dims)
    fold = _fold(node.op, x.ctype, out.ctype, count)
    if fold is None:
        return None
    ost = _out_strides(out, x, dims, node.attrs["keepdim"])
    red = sorted(dims, key=lambda d: -x.strides[d])  # innermost loop on the smallest stride
    c = _innermost(x)
    if c is not None and c not in dims and any(x.shape[d] > 1 for d in dims):
        return _by_columns(out, x, ost, red, c, fold)
    return _by_outputs(out, x, ost, red, fold)


def _header(out: Ref, x: Ref) -> str:
    return f"{out.ctype}* o = {out.ptr(const=False)};\nconst {x.ctype}* x = {x.ptr()};\n"


def _by_outputs(out: Ref, x: Ref, ost: tuple[int, ...], red: list[int], fold: Fold) -> str:
    kept = [d for d in range(len(x.shape)) if d not in red]
    n_out, work = prod(x.shape[d] for d in kept), prod(x.shape)
    split = work >= PARALLEL_MIN and n_out < FEW_OUTPUTS and prod(x.shape[d] for d in red) > 1
    first = f"#pragma omp parallel for {fold.clause} schedule(static)" if split else None
    load = fold.load.format(x="xr[{}]")
    inner = _loops([x.shape[d] for d in red], [x.strides[d] for d in red],
                   lambda off: f"{fold.acc} v = {load.format(off)}; {fold.step}", first,
                   f"#pragma omp simd {fold.clause}")
    nan = "int nan = 0;\n" if fold.nan else ""
    done = fold.done.format(a="(nan ? NAN : a)" if fold.nan else "a")

    def body(offs: list[str]) -> str:
        return (f"const {x.ctype}* xr = x + {offs[1]};\n{fold.acc} a = {fold.init};\n{nan}"
                f"{inner}\no[{offs[0]}] = ({out.ctype})({done});")
    return _header(out, x) + loop_nest(tuple(x.shape[d] for d in kept),
                                       [tuple(ost[d] for d in kept),
                                        tuple(x.strides[d] for d in kept)],
                                       body, work=1 if split else work, simd=False)


def _tasks(out: Ref, x: Ref, ost: tuple[int, ...], others: list[int], c: int,
           work: int) -> str:
    """The head of a loop over (other kept dims) x (chunks of `CHUNK` along dim c), setting
    `xr`/`orow` to the chunk's first element and `nj` to its length."""
    sh, (so, sx) = collapse(tuple(x.shape[d] for d in others),
                            [tuple(ost[d] for d in others), tuple(x.strides[d] for d in others)])
    n, chunks = x.shape[c], -(-x.shape[c] // CHUNK)
    par = "#pragma omp parallel for schedule(static)\n" if work >= PARALLEL_MIN else ""
    return (f"{par}for (int64_t t = 0; t < {prod(sh) * chunks}; t++) {{\n"
            f"const int64_t k = t / {chunks}, j0 = (t % {chunks}) * {CHUNK};\n"
            f"const int64_t nj = {n} - j0 < {CHUNK} ? {n} - j0 : {CHUNK};\n"
            f"const {x.ctype}* xr = x + {flat_offset('k', sh, sx)} + j0 * {x.strides[c]};\n"
            f"{out.ctype}* orow = o + {flat_offset('k', sh, so)} + j0 * {ost[c]};\n")


def _by_columns(out: Ref, x: Ref, ost: tuple[int, ...], red: list[int], c: int,
                fold: Fold) -> str:
    others = [d for d in range(len(x.shape)) if d not in red and d != c]
    load = fold.load.format(x=f"xs[j * {x.strides[c]}]")
    step = _loops([x.shape[d] for d in red], [x.strides[d] for d in red],
                  lambda off: f"const {x.ctype}* xs = xr + {off};\n#pragma omp simd\n"
                  f"for (int64_t j = 0; j < nj; j++) {{ {fold.acc} v = {load}; {fold.column} }}")
    return (_header(out, x) + _tasks(out, x, ost, others, c, prod(x.shape))
            + f"{fold.acc} a[{CHUNK}];\n#pragma omp simd\n"
            f"for (int64_t j = 0; j < nj; j++) a[j] = {fold.init};\n{step}\n#pragma omp simd\n"
            f"for (int64_t j = 0; j < nj; j++) orow[j * {ost[c]}] = "
            f"({out.ctype})({fold.done.format(a='a[j]')});\n}}")


def _cumsum(node: Node, out: Ref, x: Ref) -> str | None:
    """Running sums along `dim` in double (floats; the output's type kept) or int64."""
    fl = x.ctype in FLOAT_CT
    if (fl and out.ctype != x.ctype) or (not fl and out.ctype != "int64_t"):
        return None
    acc = "double" if fl else "int64_t"
    nd = len(x.shape)
    if nd == 0:
        return _header(out, x) + f"o[0] = ({out.ctype})x[0];"
    d = node.attrs["dim"] % nd
    n, sx, so = x.shape[d], x.strides[d], out.strides[d]
    c = _innermost(x)
    others = [k for k in range(nd) if k != d]
    if c is None or c == d:  # a serial scan per row; rows shared by the threads
        def body(offs: list[str]) -> str:
            return (f"const {x.ctype}* xr = x + {offs[1]};\n{out.ctype}* orow = o + {offs[0]};\n"
                    f"{acc} a = 0;\nfor (int64_t k = 0; k < {n}; k++) "
                    f"{{ a += ({acc})xr[k * {sx}]; orow[k * {so}] = ({out.ctype})a; }}")
        return _header(out, x) + loop_nest(tuple(x.shape[k] for k in others),
                                           [tuple(out.strides[k] for k in others),
                                            tuple(x.strides[k] for k in others)],
                                           body, work=prod(x.shape), simd=False)
    rest = [k for k in others if k != c]  # scan rows of a chunk of columns side by side
    return (_header(out, x) + _tasks(out, x, out.strides, rest, c, prod(x.shape))
            + f"{acc} a[{CHUNK}];\n#pragma omp simd\nfor (int64_t j = 0; j < nj; j++) a[j] = 0;\n"
            f"for (int64_t r = 0; r < {n}; r++) {{\n#pragma omp simd\n"
            f"for (int64_t j = 0; j < nj; j++) {{ a[j] += ({acc})xr[r * {sx} + j * "
            f"{x.strides[c]}]; orow[r * {so} + j * {out.strides[c]}] = ({out.ctype})a[j]; }}\n"
            "}\n}")
