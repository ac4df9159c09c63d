"""Matrix products (mm, bmm, matmul, addmm, linear, linear_bias, and the float gemm's
residual/bias/activation epilogues: emit_gemm.py) as batched GEMMs over static strides, read
through the product's geometry (gemm_geometry.py). Each GEMM runs the packed-weight kernel
when its B is a constant shared by every batch (packed_gemm.py), else calls BLAS (`EQ_SGEMM`,
OpenBLAS single-threaded, the columns split over the OpenMP threads) from BLAS_MIN_M rows,
else a generated row-streaming kernel (tiles.py; measured: docs/c-backend.md). Epilogues
(bias of addmm and linear_bias) run in the same kernel right after the product. A gemm's
residual r is added while the output is in cache: the packed kernel adds it to each tile, the
generated kernel to each output row as it stores the row from its accumulators; the BLAS path
adds it to each thread's column slice right after that thread's sgemm (beta = 0: the product
is rounded first, then r added, as in the reference). A gemm's activation follows the bias:
in the packed kernel's tile epilogue when the weight is a packed constant, else in a loop over
the output right after the bias (still one kernel)."""

from __future__ import annotations

from ...ir import Node
from ...ops import ACTIVATIONS as OP_ACTIVATIONS
from ...ops import GemmDescriptor
from .fuse_rope import RopeEpilogue, packed_gemm_call
from .gemm_geometry import GemmGeometry, gemm_geometry
from .loops import PARALLEL_MIN, broadcast_strides
from .packed_gemm import ACTIVATIONS, PACKED_GEMM
from .static_c import calling
from .tiles import BLAS_MIN_M, PACKED_MIN_M
from .values import Layout, Ref

UNUSED = Ref("scalar", 0, 0, (), (), "float64", 0.0)  # a gemm's unused operand (ops.add_gemm)


def _t(r: Ref) -> Ref:
    """The view r.transpose(-2, -1)."""
    sh, st = list(r.shape), list(r.strides)
    sh[-2], sh[-1] = sh[-1], sh[-2]
    st[-2], st[-1] = st[-1], st[-2]
    return r.with_view(tuple(sh), tuple(st), r.offset)


def emit_matmul(node: Node, out: Ref, ins: list[Ref], blas: bool,
                layout: Layout | None = None, ropes: tuple[RopeEpilogue, ...] = ()) -> str | None:
    """The GEMM's kernel: the op as the gemm it is (no epilogue, or addmm's and linear_bias's
    bias) through emit_product; with `ropes` (fuse_rope.py), one that also computes them in
    its epilogue, or None when this GEMM does not take the packed path that can."""
    op, at = node.op, node.attrs
    bias = UNUSED
    if op in ("mm", "bmm", "matmul"):
        a, b = ins
    elif op == "addmm":
        bias, a, b = ins
    elif op == "linear":
        a, b = ins[0], _t(ins[1])
    else:
        a, b, bias = ins[0], _t(ins[1]), ins[2]
    geo = gemm_geometry(out, a, b)
    if geo is None:
        return None
    d = GemmDescriptor(geo.n, alpha=at.get("alpha", 1.0), beta=at.get("beta", 1.0),
                       epilogue="none" if bias is UNUSED else "bias")
    return emit_product(d, out, [a, b, UNUSED, UNUSED, bias], geo, layout, blas, ropes)


def emit_product(d: GemmDescriptor, out: Ref, ins: list[Ref], geo: GemmGeometry,
                 layout: Layout | None, blas: bool, ropes: tuple[RopeEpilogue, ...] = ()
                 ) -> str | None:
    """out = act(alpha * x @ w + beta * bias + res) for the gemm descriptor d and inputs
    [x, w, _, _, addend], batched over the leading dims (bias: epilogue "bias", added after
    the product is rounded; res: epilogue "add", a residual fused into the store of each
    output tile, geo's R); None when this combination is not generated."""
    a, b, addend = ins[0], ins[1], ins[4]
    res = addend if d.epilogue == "add" else None
    bias = addend if d.epilogue == "bias" else None
    alpha, beta = float(d.alpha), float(d.beta)
    act = None if d.act == "none" else d.act
    if res is not None and (res.dtype != "float32" or res.space == "scalar"
                            or len(res.shape) > len(out.shape)):
        return None
    if any(r.dtype != "float32" for r in (out, a, b)) or (bias and bias.dtype != "float32"):
        return None
    if len(a.shape) < 2 or len(b.shape) < 2 or len(out.shape) < 2:
        return None
    packed = _packed_weight(geo, b, layout)
    lines = [f"float* o = {out.ptr(const=False)};", f"const float* a = {a.ptr()};"]
    if packed is None:  # (the W slot of a packed weight is not named: not held as stored,
        lines.append(f"const float* b = {b.ptr()};")  # Layout.note_reads)
    if res is not None:
        lines.append(f"const float* rr = {res.ptr()};")
    if geo.batch:
        lines.append(f"for (int64_t bi = 0; bi < {geo.batches}; bi++) {{")
    bias_fused = packed is not None and bias is not None and _bias_as_addend(out, bias)
    # the packed kernel's tile epilogue applies the activation after its addends (the bias)
    act_fused = packed is not None and (bias is None or bias_fused)
    # ropes ride one packed call whose rows of C lie ldc apart (a single row: n apart)
    if ropes and (packed is None or geo.batch or (bias is not None and not bias_fused)
                  or geo.ldc != geo.c.rows):
        return None
    if packed is not None:
        call = _packed_gemm(geo, alpha, packed, bias if bias_fused else None, beta,
                            ACTIVATIONS[act] if act and act_fused else 0, ropes)
    elif blas and _blas_ok(geo) and geo.m >= BLAS_MIN_M:
        call = _blas_gemm(geo, alpha)
    else:
        call = _gen_gemm(geo, alpha)
    lines.append(call)
    c_off = geo.batch_offset(geo.c)
    if bias is not None and not bias_fused:
        lines.append(_bias_epilogue(out, bias, beta, c_off))
    if act and not act_fused:
        lines.append(_act_epilogue(out, act, c_off))
    if geo.batch:
        lines.append("}")
    return calling("\n".join(lines), PACKED_GEMM) if packed is not None else "\n".join(lines)


def _packed_weight(geo: GemmGeometry, b: Ref, layout: Layout | None) -> Ref | None:
    """The packed copy of b (a W slot) when b is a constant shared by every batch and the
    operands suit the packed kernel; None otherwise."""
    if layout is None or not geo.b_shared or geo.m < PACKED_MIN_M:
        return None
    if not geo.unit_columns or (geo.r is not None and geo.r.cols not in (0, 1)):
        return None
    return geo.packed_b(b, layout)


def _bias_as_addend(out: Ref, bias: Ref) -> bool:
    """Whether the bias varies only along the columns (then the packed kernel adds it)."""
    st = broadcast_strides(out.shape, bias.shape, bias.strides)
    return not any(st[:-1]) and st[-1] in (0, 1)


def _packed_gemm(geo: GemmGeometry, alpha: float, packed: Ref, bias: Ref | None,
                 beta: float, act: int = 0, ropes: tuple[RopeEpilogue, ...] = ()) -> str:
    addends = []
    if geo.r is not None:
        addends.append(f"{{rr + {geo.batch_offset(geo.r)}, {geo.r.rows}, {geo.r.cols}, 1.0f}}")
    if bias is not None:
        cs = broadcast_strides((geo.n,), bias.shape[-1:], bias.strides[-1:])[0]
        addends.append(f"{{{bias.ptr()}, 0, {cs}, {float(beta).hex()}f}}")
    par = geo.macs >= PARALLEL_MIN * 8 and geo.n >= 64
    e = f"const eq_addend e[] = {{{', '.join(addends)}}};" if addends else \
        "const eq_addend* e = NULL;"
    fn, rope_decl, rope_args = packed_gemm_call(ropes, "0")
    oa, oc, al = geo.batch_offset(geo.a), geo.batch_offset(geo.c), float(alpha).hex()
    return f"""{{
    {e}
    {rope_decl}
    {fn}({geo.m}, {geo.n}, {geo.k}, a + {oa}, {geo.a.rows}, {packed.ptr()},
                   o + {oc}, {geo.c.rows}, {al}f, NULL, e, {len(addends)},
                   {act}, {int(par)}{rope_args});
}}"""


def _blas_ok(geo: GemmGeometry) -> bool:
    a, b, c = geo.a, geo.b, geo.c
    assert b is not None
    return c.cols == 1 and (a.cols == 1 or a.rows == 1) and (b.cols == 1 or b.rows == 1) \
        and c.rows >= geo.n


def _ld(rs: int, cs: int, rows: int, cols: int) -> tuple[int, int]:
    """(transpose flag, leading dimension) of a row-major BLAS operand."""
    if cs == 1 and (rows == 1 or rs >= cols):
        return 111, max(rs if rows > 1 else cols, cols, 1)
    return 112, max(cs if cols > 1 else rows, rows, 1)


def _blas_gemm(geo: GemmGeometry, alpha: float) -> str:
    M, N, K, a, b, c = geo.m, geo.n, geo.k, geo.a, geo.b, geo.c
    assert b is not None
    ta, lda = _ld(a.rows, a.cols, M, K)
    tb, ldb = _ld(b.rows, b.cols, K, N)
    par = geo.macs >= PARALLEL_MIN * 64 and N >= 64
    oa, ob, oc, al = (*(geo.batch_offset(s) for s in (a, b, c)), float(alpha).hex())
    epi = ""
    if geo.r is not None:  # + r on this thread's slice, right after its product (in cache)
        epi = f"""
        for (int64_t m = 0; m < {M}; m++) {{
            float* orow = o + {oc} + m * {c.rows};
            const float* rrow = rr + {geo.batch_offset(geo.r)} + m * {geo.r.rows};
#pragma omp simd
            for (int64_t n = n0; n < n1; n++) orow[n] += rrow[n * {geo.r.cols}];
        }}"""
    # each thread multiplies a slice of the columns (OpenBLAS runs single-threaded)
    return f"""{{
#pragma omp parallel if({int(par)})
{{
    EQ_THREAD_IDS;
    int64_t per = (({N} + nt - 1) / nt + 15) / 16 * 16;
    int64_t n0 = t * per, n1 = n0 + per < {N} ? n0 + per : {N};
    if (n0 < n1) {{
        EQ_SGEMM(101, {ta}, {tb}, {M}, (int)(n1 - n0), {K}, {al}f, a + {oa}, {lda},
                 b + {ob} + n0 * {b.cols}, {ldb}, 0.0f, o + {oc} + n0, {geo.ldc});{epi}
    }}
}}
}}"""


def _gen_gemm(geo: GemmGeometry, alpha: float) -> str:
    """Row streaming: o[m, n] = sum_k a[m, k] * b[k, n], each row of b read once per row of a
    and streamed whole (contiguous when b's columns are), accumulated in a local row."""
    M, N, K, a, b, c = geo.m, geo.n, geo.k, geo.a, geo.b, geo.c
    assert b is not None
    par = geo.macs >= PARALLEL_MIN * 8 and N >= 32
    scale = "" if alpha == 1.0 else f" * {float(alpha).hex()}f"
    rrow = radd = ""
    if geo.r is not None:  # + r as each output row is stored from the accumulators
        rrow = f"\n        const float* rrow = rr + {geo.batch_offset(geo.r)} + m * {geo.r.rows};"
        radd = f" + rrow[n * {geo.r.cols}]"
    return f"""{{
#pragma omp parallel if({int(par)})
{{
    EQ_THREAD_IDS;
    int64_t per = (({N} + nt - 1) / nt + 15) / 16 * 16;
    int64_t n0 = t * per, n1 = n0 + per < {N} ? n0 + per : {N};
    float acc[{N}] __attribute__((aligned(64)));
    for (int64_t m = 0; m < {M}; m++) {{
        const float* ar = a + {geo.batch_offset(a)} + m * {a.rows};
        for (int64_t n = n0; n < n1; n++) acc[n] = 0.0f;
        for (int64_t k = 0; k < {K}; k++) {{
            const float av = ar[k * {a.cols}];
            const float* br = b + {geo.batch_offset(b)} + k * {b.rows};
#pragma omp simd
            for (int64_t n = n0; n < n1; n++) acc[n] += av * br[n * {b.cols}];
        }}
        float* orow = o + {geo.batch_offset(c)} + m * {c.rows};{rrow}
#pragma omp simd
        for (int64_t n = n0; n < n1; n++) orow[n * {c.cols}] = acc[n]{scale}{radd};
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
