"""Row kernels: rms_norm, layer_norm, softmax, log_softmax over the last dim, one row per
iteration (rows shared by OpenMP when large), the row's statistics in float32 with SIMD
partial sums."""

from __future__ import annotations

from ...ir import Node
from .loops import broadcast_strides, loop_nest
from .values import Ref


def _rows(out: Ref, ins: list[Ref], body: str, d: int) -> str:
    """Loop over all but the last dim; `body` sees o, x0.. as row pointers and `cs<k>` as the
    last-dim stride of operand k (0: output)."""
    lead = out.shape[:-1]
    tens = [r for r in ins if r.space != "scalar"]
    sts = [out.strides[:-1]] + [broadcast_strides(out.shape, r.shape, r.strides)[:-1]
                                for r in tens]
    decl = [f"float* o0 = {out.ptr(const=False)};"]
    decl += [f"const float* p{k} = {r.ptr()};" for k, r in enumerate(tens)]
    cs = [out.strides[-1]] + [broadcast_strides(out.shape, r.shape, r.strides)[-1]
                              for r in tens]
    defs = "".join(f"\n#define CS{k} {s}" for k, s in enumerate(cs))
    undefs = "".join(f"\n#undef CS{k}" for k in range(len(cs)))

    def b(offs: list[str]) -> str:
        rows = [f"    float* o = o0 + {offs[0]};"]
        rows += [f"    const float* x{k} = p{k} + {offs[k + 1]};" for k in range(len(tens))]
        return "\n".join(rows) + "\n" + body
    numel = out.shape[-1]
    for n in lead:
        numel *= n
    return "\n".join(decl) + defs + "\n" + loop_nest(lead, sts, b, work=numel,
                                                     simd=False) + undefs


def inv_rms(x: str, cs: str, d: int, eps: float, r: str = "const float r") -> str:
    """C lines setting `r` to 1 / sqrt(mean(x[c * cs]^2) + eps) over the d elements of a row
    (rms_norm's statistics; also the gemm rms_norm prologue's, emit_norm_matmul.py)."""
    return f"""    float ss = 0.0f;
#pragma omp simd reduction(+:ss)
    for (int64_t c = 0; c < {d}; c++) ss += {x}[c * {cs}] * {x}[c * {cs}];
    {r} = 1.0f / sqrtf(ss / {d}.0f + {float(eps).hex()}f);"""


def emit_rms_norm(node: Node, out: Ref, ins: list[Ref]) -> str | None:
    if any(r.dtype != "float32" for r in [out] + ins) or not out.shape:
        return None
    d = out.shape[-1]
    body = f"""{inv_rms("x0", "CS1", d, node.attrs["eps"])}
#pragma omp simd
    for (int64_t c = 0; c < {d}; c++) o[c * CS0] = x0[c * CS1] * r * x1[c * CS2];"""
    return _rows(out, ins, body, d)


def emit_layer_norm(node: Node, out: Ref, ins: list[Ref]) -> str | None:
    if len(node.attrs["normalized_shape"]) != 1 or not out.shape:
        return None
    if any(r.dtype != "float32" for r in [out] + ins):
        return None
    d = out.shape[-1]
    eps = f"{float(node.attrs['eps']).hex()}f"
    body = f"""    float mu = 0.0f, var = 0.0f;
#pragma omp simd reduction(+:mu)
    for (int64_t c = 0; c < {d}; c++) mu += x0[c * CS1];
    mu /= {d}.0f;
#pragma omp simd reduction(+:var)
    for (int64_t c = 0; c < {d}; c++) {{ float t = x0[c * CS1] - mu; var += t * t; }}
    const float r = 1.0f / sqrtf(var / {d}.0f + {eps});
#pragma omp simd
    for (int64_t c = 0; c < {d}; c++)
        o[c * CS0] = (x0[c * CS1] - mu) * r * x1[c * CS2] + x2[c * CS3];"""
    return _rows(out, ins, body, d)


def emit_softmax(node: Node, out: Ref, ins: list[Ref], log: bool) -> str | None:
    x = ins[0]
    nd = len(out.shape)
    if out.dtype != "float32" or x.dtype != "float32" or nd == 0:
        return None
    dim = node.attrs["dim"] % nd
    if dim != nd - 1:  # move the dim last on both views
        perm = [i for i in range(nd) if i != dim] + [dim]

        def mv(r: Ref) -> Ref:
            return r.with_view(tuple(r.shape[i] for i in perm), tuple(r.strides[i] for i in perm),
                               r.offset)
        out, x = mv(out), mv(x)
    d = out.shape[-1]
    fin = ("o[c * CS0] = x0[c * CS1] - mx - logf(s);" if log else
           "o[c * CS0] = eq_expf(x0[c * CS1] - mx) / s;")
    body = f"""    float mx = -INFINITY, s = 0.0f;
    for (int64_t c = 0; c < {d}; c++) mx = x0[c * CS1] > mx ? x0[c * CS1] : mx;
#pragma omp simd reduction(+:s)
    for (int64_t c = 0; c < {d}; c++) s += eq_expf(x0[c * CS1] - mx);
#pragma omp simd
    for (int64_t c = 0; c < {d}; c++) {fin}"""
    return _rows(out, [x], body, d)
