"""Matrix products (mm, bmm, matmul, addmm, linear, linear_bias, and the float gemm's
residual/bias/activation epilogues: emit_gemm.py) as batched GEMMs over static strides. Each
GEMM either calls BLAS (`EQ_SGEMM`, OpenBLAS single-threaded, the columns split over the
OpenMP threads) or runs a generated row-streaming kernel; which one is decided per
shape class by `use_blas(m)` (measured: docs/c-backend.md). Epilogues (bias of addmm and
linear_bias) run in the same kernel right after the product. A gemm's residual r is added
while the output is in cache: the generated kernel adds it to each output row as it stores the
row from its accumulators; the BLAS path adds it to each thread's column slice right after that
thread's sgemm (beta = 0: the product is rounded first, then r added, as in the reference).
A gemm's activation follows the bias: in the packed kernel's tile epilogue when the weight
is a packed constant, else in a loop over the output right after the bias (still one kernel)."""

from __future__ import annotations

from ...ir import Node
from ...ops import ACTIVATIONS as OP_ACTIVATIONS
from .fuse_rope import RopeEpilogue, gemm_rows, packed_gemm_call
from .loops import PARALLEL_MIN, broadcast_strides, collapse
from .packed_gemm import ACTIVATIONS
from .values import Layout, Ref

# GEMMs with at least this many rows call BLAS (when the program is built with it); fewer rows
# (decode) run the generated kernel, which streams each weight row once.
BLAS_MIN_M = 8
# GEMMs against a constant weight with at least this many rows use the packed-weight kernel
# (packed_gemm.py), with or without BLAS in the build (measured: docs/c-backend.md)
PACKED_MIN_M = 1
MATMUL_OPS = frozenset({"mm", "bmm", "matmul", "addmm", "linear", "linear_bias"})


def _t(r: Ref) -> Ref:
    """The view r.transpose(-2, -1)."""
    sh, st = list(r.shape), list(r.strides)
    sh[-2], sh[-1] = sh[-1], sh[-2]
    st[-2], st[-1] = st[-1], st[-2]
    return r.with_view(tuple(sh), tuple(st), r.offset)


def emit_matmul(node: Node, out: Ref, ins: list[Ref], blas: bool,
                layout: Layout | None = None, ropes: tuple[RopeEpilogue, ...] = ()) -> str | None:
    """The GEMM's kernel; with `ropes` (fuse_rope.py), one that also computes them in its
    epilogue, or None when this GEMM does not take the packed path that can."""
    op, at = node.op, node.attrs
    bias: Ref | None = None
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    if op in ("mm", "bmm", "matmul"):
        a, b = ins
    elif op == "addmm":
        bias, a, b = ins
    elif op == "linear":
        a, b = ins[0], _t(ins[1])
    else:
        a, b, bias = ins[0], _t(ins[1]), ins[2]
    return emit_product(out, a, b, alpha, blas, layout, ropes, bias=bias, beta=beta)


def emit_product(out: Ref, a: Ref, b: Ref, alpha: float, blas: bool, layout: Layout | None,
                 ropes: tuple[RopeEpilogue, ...] = (), *, bias: Ref | None = None,
                 beta: float = 1.0, res: Ref | None = None, act: str | None = None
                 ) -> str | None:
    """out = act(alpha * a @ b + beta * bias + res), batched over the leading dims (bias:
    addmm's, added after the product is rounded; res: a residual fused into the store of each
    output tile); None when this combination is not generated."""
    if res is not None and (res.dtype != "float32" or res.space == "scalar"
                            or len(res.shape) > len(out.shape)):
        return None
    if any(r.dtype != "float32" for r in (out, a, b)) or (bias and bias.dtype != "float32"):
        return None
    if len(a.shape) < 2 or len(b.shape) < 2 or len(out.shape) < 2:
        return None
    M, K = a.shape[-2], a.shape[-1]
    N = b.shape[-1]
    batch = out.shape[:-2]
    bs_o = out.strides[:-2]
    bs_a = broadcast_strides(batch, a.shape[:-2], a.strides[:-2])
    bs_b = broadcast_strides(batch, b.shape[:-2], b.strides[:-2])
    # r broadcast to the output's shape (all zero strides when there is no r)
    st_r = broadcast_strides(out.shape, res.shape, res.strides) if res else (0,) * len(out.shape)
    bs_r = st_r[:-2]
    # fold batch dims into M where the rows of a, out (and r) are evenly spaced and b is shared
    sh, st = collapse(batch + (M,), [bs_o + (out.strides[-2],), bs_a + (a.strides[-2],),
                                     bs_b + (0,), bs_r + (st_r[-2],)])
    if len(sh) == 1 and st[2][0] == 0:
        nb, rows, bst = 1, sh[0], [[], [], [], []]
        rs_o, rs_a, rs_r = st[0][0], st[1][0], st[3][0]
        bsh: list[int] = []
    else:
        bsh, bst = collapse(batch, [bs_o, bs_a, bs_b, bs_r])
        rows, rs_o, rs_a, rs_r = M, out.strides[-2], a.strides[-2], st_r[-2]
        nb = 1
        for n in bsh:
            nb *= n
    g = {"M": rows, "N": N, "K": K, "rs_a": rs_a, "cs_a": a.strides[-1],
         "rs_b": b.strides[-2], "cs_b": b.strides[-1], "rs_c": rs_o, "cs_c": out.strides[-1],
         "alpha": alpha, "res": res is not None, "rs_r": rs_r, "cs_r": st_r[-1]}
    lines = [f"float* o = {out.ptr(const=False)};", f"const float* a = {a.ptr()};",
             f"const float* b = {b.ptr()};"]
    if res is not None:
        lines.append(f"const float* rr = {res.ptr()};")
    boff = ["0", "0", "0", "0"]
    if bsh:
        lines.append(f"for (int64_t bi = 0; bi < {nb}; bi++) {{")
        for k in range(4):
            terms, div = [], 1
            for n, s in reversed(list(zip(bsh, bst[k]))):
                if s:
                    terms.append(f"((bi / {div}) % {n}) * {s}")
                div *= n
            boff[k] = " + ".join(terms) or "0"
    work = rows * N * K * nb
    packed = _packed_weight(g, b, bst[2] if bsh else [], layout)
    bias_fused = packed is not None and bias is not None and _bias_as_addend(out, bias)
    # the packed kernel's tile epilogue applies the activation after its addends (the bias)
    act_fused = packed is not None and (bias is None or bias_fused)
    if ropes and (packed is None or bsh or (bias is not None and not bias_fused)
                  or gemm_rows(out) != (g["M"], g["rs_c"])):
        return None
    if packed is not None:
        call = _packed_gemm(g, boff, work, packed, bias if bias_fused else None, beta,
                            ACTIVATIONS[act] if act and act_fused else 0, ropes)
    elif blas and _blas_ok(g) and rows >= BLAS_MIN_M:
        call = _blas_gemm(g, boff, work)
    else:
        call = _gen_gemm(g, boff, work)
    lines.append(call)
    if bias is not None and not bias_fused:
        lines.append(_bias_epilogue(out, bias, beta, boff[0] if bsh else "0"))
    if act and not act_fused:
        lines.append(_act_epilogue(out, act, boff[0] if bsh else "0"))
    if bsh:
        lines.append("}")
    return "\n".join(lines)


def _packed_weight(g: dict, b: Ref, batch_strides_b: list[int],
                   layout: Layout | None) -> Ref | None:
    """The packed copy of b (a W slot) when b is a constant shared by every batch and the
    operands suit the packed kernel; None otherwise."""
    if layout is None or any(batch_strides_b) or g["M"] < PACKED_MIN_M:
        return None
    if g["cs_a"] != 1 or g["cs_c"] != 1 or (g["res"] and g["cs_r"] not in (0, 1)):
        return None
    return layout.packed_weight(b, g["K"], g["N"], g["rs_b"], g["cs_b"])


def _bias_as_addend(out: Ref, bias: Ref) -> bool:
    """Whether the bias varies only along the columns (then the packed kernel adds it)."""
    st = broadcast_strides(out.shape, bias.shape, bias.strides)
    return not any(st[:-1]) and st[-1] in (0, 1)


def _packed_gemm(g: dict, boff: list[str], work: int, packed: Ref, bias: Ref | None,
                 beta: float, act: int = 0, ropes: tuple[RopeEpilogue, ...] = ()) -> str:
    addends = []
    if g["res"]:
        addends.append(f"{{rr + {boff[3]}, {g['rs_r']}, {g['cs_r']}, 1.0f}}")
    if bias is not None:
        cs = broadcast_strides((g["N"],), bias.shape[-1:], bias.strides[-1:])[0]
        addends.append(f"{{{bias.ptr()}, 0, {cs}, {float(beta).hex()}f}}")
    par = work >= PARALLEL_MIN * 8 and g["N"] >= 64
    e = f"const eq_addend e[] = {{{', '.join(addends)}}};" if addends else \
        "const eq_addend* e = NULL;"
    fn, rope_decl, rope_args = packed_gemm_call(ropes, "0")
    return f"""{{
    {e}
    {rope_decl}
    {fn}({g["M"]}, {g["N"]}, {g["K"]}, a + {boff[1]}, {g["rs_a"]}, {packed.ptr()},
                   o + {boff[0]}, {g["rs_c"]}, {float(g["alpha"]).hex()}f, NULL, e, {len(addends)},
                   {act}, {int(par)}{rope_args});
}}"""


def _blas_ok(g: dict) -> bool:
    return g["cs_c"] == 1 and (g["cs_a"] == 1 or g["rs_a"] == 1) and (
        g["cs_b"] == 1 or g["rs_b"] == 1) and g["rs_c"] >= g["N"]


def _ld(rs: int, cs: int, rows: int, cols: int) -> tuple[int, int]:
    """(transpose flag, leading dimension) of a row-major BLAS operand."""
    if cs == 1 and (rows == 1 or rs >= cols):
        return 111, max(rs if rows > 1 else cols, cols, 1)
    return 112, max(cs if cols > 1 else rows, rows, 1)


def _blas_gemm(g: dict, boff: list[str], work: int) -> str:
    M, N, K = g["M"], g["N"], g["K"]
    ta, lda = _ld(g["rs_a"], g["cs_a"], M, K)
    tb, ldb = _ld(g["rs_b"], g["cs_b"], K, N)
    ldc = g["rs_c"] if M > 1 else N
    col_b = g["cs_b"]
    alpha = float(g["alpha"]).hex()
    par = work >= PARALLEL_MIN * 64 and N >= 64
    epi = ""
    if g["res"]:  # + r on this thread's slice, right after its product (still in cache)
        epi = f"""
        for (int64_t m = 0; m < {M}; m++) {{
            float* orow = o + {boff[0]} + m * {g["rs_c"]};
            const float* rrow = rr + {boff[3]} + m * {g["rs_r"]};
#pragma omp simd
            for (int64_t n = n0; n < n1; n++) orow[n] += rrow[n * {g["cs_r"]}];
        }}"""
    # each thread multiplies a slice of the columns (OpenBLAS runs single-threaded)
    return f"""{{
#pragma omp parallel if({int(par)})
{{
    int nt = 1, t = 0;
#ifdef _OPENMP
    nt = omp_get_num_threads(); t = omp_get_thread_num();
#endif
    int64_t per = (({N} + nt - 1) / nt + 15) / 16 * 16;
    int64_t n0 = t * per, n1 = n0 + per < {N} ? n0 + per : {N};
    if (n0 < n1) {{
        EQ_SGEMM(101, {ta}, {tb}, {M}, (int)(n1 - n0), {K}, {alpha}f, a + {boff[1]}, {lda},
                 b + {boff[2]} + n0 * {col_b}, {ldb}, 0.0f, o + {boff[0]} + n0, {ldc});{epi}
    }}
}}
}}"""


def _gen_gemm(g: dict, boff: list[str], work: int) -> str:
    """Row streaming: o[m, n] = sum_k a[m, k] * b[k, n], each row of b read once per row of a
    and streamed whole (contiguous when cs_b is 1), accumulated in a local row."""
    M, N, K = g["M"], g["N"], g["K"]
    par = work >= PARALLEL_MIN * 8 and N >= 32
    alpha = "" if g["alpha"] == 1.0 else f" * {float(g['alpha']).hex()}f"
    rrow = radd = ""
    if g["res"]:  # + r as each output row is stored from the accumulators
        rrow = f"\n        const float* rrow = rr + {boff[3]} + m * {g['rs_r']};"
        radd = f" + rrow[n * {g['cs_r']}]"
    return f"""{{
#pragma omp parallel if({int(par)})
{{
    int nt = 1, t = 0;
#ifdef _OPENMP
    nt = omp_get_num_threads(); t = omp_get_thread_num();
#endif
    int64_t per = (({N} + nt - 1) / nt + 15) / 16 * 16;
    int64_t n0 = t * per, n1 = n0 + per < {N} ? n0 + per : {N};
    float acc[{N}] __attribute__((aligned(64)));
    for (int64_t m = 0; m < {M}; m++) {{
        const float* ar = a + {boff[1]} + m * {g["rs_a"]};
        for (int64_t n = n0; n < n1; n++) acc[n] = 0.0f;
        for (int64_t k = 0; k < {K}; k++) {{
            const float av = ar[k * {g["cs_a"]}];
            const float* br = b + {boff[2]} + k * {g["rs_b"]};
#pragma omp simd
            for (int64_t n = n0; n < n1; n++) acc[n] += av * br[n * {g["cs_b"]}];
        }}
        float* orow = o + {boff[0]} + m * {g["rs_c"]};{rrow}
#pragma omp simd
        for (int64_t n = n0; n < n1; n++) orow[n * {g["cs_c"]}] = acc[n]{alpha}{radd};
    }}
}}
}}"""


def _bias_epilogue(out: Ref, bias: Ref, beta: float, boff: str) -> str:
    # out[..., m, n] += beta * bias (broadcast); within one batch of the loop above when batched
    from .loops import loop_nest
    shape = out.shape if boff == "0" else out.shape[-2:]
    bst = broadcast_strides(out.shape, bias.shape, bias.strides)
    ost = out.strides
    if boff != "0":
        bst, ost = bst[-2:], ost[-2:]
    scale = "" if beta == 1.0 else f"{float(beta).hex()}f * "
    inner = loop_nest(shape, [ost, bst],
                      lambda o: f"    o[{boff} + {o[0]}] += {scale}bb[{o[1]}];")
    return f"{{ const float* bb = {bias.ptr()};\n{inner}\n}}"


def _act_epilogue(out: Ref, act: str, boff: str) -> str:
    # out[..., m, n] = act(out[..., m, n]), after the bias (off the packed path)
    from .loops import loop_nest
    shape, ost = (out.shape, out.strides) if boff == "0" else (out.shape[-2:], out.strides[-2:])
    expr = OP_ACTIVATIONS[act].c_expr
    inner = loop_nest(shape, [ost], lambda o: f"    {{ const float v = o[{boff} + {o[0]}]; "
                                            f"o[{boff} + {o[0]}] = {expr}; }}")
    return f"{{\n{inner}\n}}"
