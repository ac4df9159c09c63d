"""The GEMM kernel of the Triton backend: the `gemm` op (ops/gemm.py) and the plain matmul ops.

One kernel, `gemm_kernel`, computes act(epilogue(alpha * prologue(x) @ W)) tile by tile, its
sums in float32 (tl.dot: exact float32 products, "ieee"; half tiles when x and the weight are
both half, tensor cores on a GPU; TF32 when asked, `dot_kind`), the result stored in the
output's dtype:

    prologue  none | rms_norm (a first pass over the row's K for its sum of squares)
    weight    float (any float dtype) | fp16 | bf16 | int8 (q * scale[n]) | fp8_e4m3/e5m2
              (float8(q) * scale[n], the byte widened through float16's bits; fp8_e4m3_g128
              float8(q) * scale[k // 128, n]) | int4_g32/g64/g128
              (nibble - 8 times scale[k // G, n]) | int8_dynamic (int8, and the activations
              coded per row as quant_formats.coded_activations: a pass for each row's range)
              -- the integer formats dequantized tile by tile in registers
    epilogue  none | add | bias (beta * addend + alpha * x@W) | swiglu (two accumulators)
    act       ACT_CODES, by common.apply_act

`plan_gemm` plans the gemm op, `plan_matmul` the ops of MATMUL_OPS (mm, bmm, matmul, addmm,
linear, linear_bias: torch.matmul's broadcasting, on a batch grid axis). Both decline (None):
the sparse weight formats (sparse24, bsr16), x or out not float32/float16/bfloat16, a scalar
where a tensor is read, a broadcast (zero-stride) output, an operand that spans 2^31 elements
or more (offsets are int32), and index spaces that do not fit the kernel's indexing: the
output's leading dims, merged where every operand allows it, must leave at most two levels of
rows (where the weight is the same) and two of batch.

Operands may be any strided views: every stride is a kernel argument, planned from the
`Operand`, and a row m of a two-level index space is at (m // M2) * s1 + (m % M2) * s2."""

from __future__ import annotations

import os
from dataclasses import dataclass

import triton
import triton.language as tl

from ...formats.half_formats import WEIGHT_FORMATS as HALF_FORMATS
from ...formats.quant_formats import DYNAMIC, FORMATS, float8_of, format_group
from ...ir import Node
from ...ops import MATMUL_OPS, GemmDescriptor, operands_of
from .common import ACT_CODES, apply_act
from .launch import FLOATS, Launch, Operand, interpreting, merge_levels

# the kernel's switches (constexprs)
W_FLOAT, W_INT8, W_INT4 = 0, 1, 2
W_FLOAT8 = {"fp8_e4m3": 3, "fp8_e5m2": 4}
EPI_NONE, EPI_ADD, EPI_SWIGLU = 0, 1, 2  # EPI_ADD: beta * addend (gemm's add: beta = 1)
# how tiles are multiplied: float32 "ieee"; in x's half dtype (tensor cores, float32 sums);
# TF32 (float32 models, opt-in: EQSAT_TF32=1)
DOT_IEEE, DOT_HALF, DOT_TF32 = 0, 1, 2
MAX_GRID_Y = 65535  # CUDA's limit on grid axis 1, the batch
GROUP_M = 8


def gemm_tiles(M: int, N: int, K: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for an M x N x K product, the fixed choice.

    Compiled: 16 rows for decode-sized M (the weight streamed once, few wasted rows), else
    64 x 64 x 32, and 128 x 128 x 32 when both M and N are large (more reuse per load).
    Interpreted: the whole problem in as few programs and K steps as the sizes allow (up to
    128 x 128 x 64), since the interpreter pays ~1.4 ms per program and per step's ops but
    almost nothing per element. tl.dot needs every tile side >= 16."""
    if interpreting():
        return _fit(M, 128), _fit(N, 128), _fit(K, 64)
    if M <= 16:
        return 16, 64, 64
    if M < 128 or N < 128:
        return 64, 64, 32
    return 128, 128, 32


def _fit(size: int, top: int) -> int:
    return min(top, max(16, triton.next_power_of_2(size)))


# the tilings autotune.py measures beside the fixed one, by the fixed one's class:
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
TILINGS = {
    "decode": [(16, 64, 64, 4, 3), (16, 128, 64, 4, 3), (16, 32, 128, 4, 3),
               (16, 64, 128, 4, 4), (16, 128, 128, 8, 3)],
    "small": [(64, 64, 32, 4, 3), (32, 64, 64, 4, 3), (64, 128, 32, 4, 3),
              (64, 64, 64, 4, 4), (128, 64, 32, 4, 3)],
    "large": [(128, 128, 32, 8, 3), (128, 128, 64, 8, 3), (128, 256, 32, 8, 3),
              (64, 128, 32, 4, 4), (128, 64, 32, 4, 4), (256, 128, 32, 8, 3)],
}


def gemm_choices(M: int, N: int, K: int) -> list[dict[str, int]]:
    """The tile constexprs worth measuring for an M x N x K product (autotune.py), the fixed
    choice (gemm_tiles) first: compiled, TILINGS' class of it, less tiles much wider than the
    product; interpreted, the fixed one alone."""
    block = gemm_tiles(M, N, K)
    if interpreting():
        return [dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), block))]
    kind = "decode" if M <= 16 else "large" if block[0] == 128 else "small"
    fits = [t for t in TILINGS[kind][1:]
            if t[0] <= _fit(M, 256) and t[1] <= _fit(N, 256) and t[2] <= _fit(K, 128)]
    return [dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"), t))
            for t in [TILINGS[kind][0], *fits]]


@triton.jit
def _two_level(i, I2, s1, s2):
    # offset of index i of a two-level index space (inner size I2)
    return (i // I2) * s1 + (i % I2) * s2


@triton.jit
def _x_tile(x_ptr, rows, m_mask, k, K, sx_k, r, norm_ptr, s_norm, RMS: tl.constexpr):
    # an x tile [BLOCK_M, BLOCK_K] in float32, zero outside the matrix, rms-normalised
    mask = m_mask[:, None] & (k < K)[None, :]
    a = tl.load(x_ptr + rows[:, None] + k[None, :] * sx_k, mask=mask, other=0.0).to(tl.float32)
    if RMS:
        a = a * r[:, None] * tl.load(norm_ptr + k * s_norm, mask=k < K, other=0.0).to(
            tl.float32)[None, :]
    return a


@triton.jit
def _rint(v):
    # round half to even (torch.round) for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction
    # bits; libdevice's rint is not available in the interpreter
    return (v + 12582912.0) - 12582912.0


@triton.jit
def weight_tile(w_ptr, scale_ptr, k, n, mask, sw_k, sw_n, ss_k, ss_n,
            WEIGHT: tl.constexpr, GROUP: tl.constexpr):
    # a weight tile [BLOCK_K, BLOCK_N] in float32, dequantized, zero outside the matrix
    if WEIGHT == 2:  # int4: byte (k // 2, n), low nibble for even k, stored as q + 8
        w = tl.load(w_ptr + (k // 2)[:, None] * sw_k + n[None, :] * sw_n, mask=mask, other=8)
        w = ((w.to(tl.int32) >> ((k % 2) * 4)[:, None]) & 15) - 8
    else:
        w = tl.load(w_ptr + k[:, None] * sw_k + n[None, :] * sw_n, mask=mask, other=0)
    if WEIGHT == 3:  # e4m3 bytes: sign, exponent and mantissa moved into a float16's,
        # which then holds 2^-8 of the value (e4m3's subnormals are float16 subnormals)
        b = w.to(tl.int32)
        h = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
        w = h.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    if WEIGHT == 4:  # e5m2 bytes: a float16's top byte
        w = (w.to(tl.int32) << 8).to(tl.uint16).to(tl.float16, bitcast=True)
    w = w.to(tl.float32)
    if WEIGHT != 0:  # the scale of (k // GROUP, n); int8's has ss_k = 0 (one per column)
        w = w * tl.load(scale_ptr + (k // GROUP)[:, None] * ss_k + n[None, :] * ss_n,
                        mask=mask, other=0.0)
    return w


@triton.jit
def _dot(a, w, acc, half_ty, DOT: tl.constexpr):
    # acc + a @ w, float32 sums: the tiles rounded to x's half dtype (tensor cores), as TF32,
    # or exact float32 products
    if DOT == 1:
        return tl.dot(a.to(half_ty), w.to(half_ty), acc)
    elif DOT == 2:
        return tl.dot(a, w, acc, input_precision="tf32")
    else:
        return tl.dot(a, w, acc, input_precision="ieee")


@triton.jit
def gemm_kernel(
        x_ptr, w_ptr, scale_ptr, norm_ptr, add_ptr, out_ptr,
        M, N, K, M2, B2,
        sx_b1, sx_b2, sx_m1, sx_m2, sx_k,
        sw_b1, sw_b2, sw_k, sw_n,
        ss_k, ss_n, s_norm,
        sa_b1, sa_b2, sa_m1, sa_m2, sa_n,
        so_b1, so_b2, so_m1, so_m2, so_n,
        alpha, beta, eps,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr, RMS: tl.constexpr, DYNAMIC: tl.constexpr,
        WEIGHT: tl.constexpr, GROUP: tl.constexpr, EPILOGUE: tl.constexpr,
        SCALE: tl.constexpr, ACT: tl.constexpr, DOT: tl.constexpr):
    """out[b, m, n] = act(epilogue(alpha * sum_k prologue(x)[b, m, k] * W[b, k, n])): program
    (tile, b) computes a BLOCK_M x BLOCK_N tile of batch b; rows and batches are two-level
    indices (_two_level). For EPILOGUE swiglu, W has 2N columns [Wg | Wu]."""
    # grouped tile order (Triton's matmul tutorial): GROUP_M row blocks in turn share the
    # weight's column block while it is in L2
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_m
    pid_n = (pid % width) // group_m
    b = tl.program_id(1)
    x_ptr += _two_level(b, B2, sx_b1, sx_b2)
    w_ptr += _two_level(b, B2, sw_b1, sw_b2)
    out_ptr += _two_level(b, B2, so_b1, so_b2)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < M, offs_n < N
    x_rows = _two_level(offs_m, M2, sx_m1, sx_m2)

    # prologue statistics, one pass over each row's K apiece: its rms scale r, then the
    # range of the (normalised) row that int8_dynamic codes it in
    r = tl.full([BLOCK_M], 1.0, tl.float32)
    if RMS:
        ss = tl.zeros([BLOCK_M], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = _x_tile(x_ptr, x_rows, m_mask, k0 + offs_k, K, sx_k, r, norm_ptr, s_norm, False)
            ss += tl.sum(a * a, 1)
        r = tl.rsqrt(tl.where(m_mask, ss / K + eps, 1.0))
    if DYNAMIC:
        lo = tl.zeros([BLOCK_M], tl.float32)
        hi = tl.zeros([BLOCK_M], tl.float32)
        bad = tl.zeros([BLOCK_M], tl.int32)
        for k0 in range(0, K, BLOCK_K):
            a = _x_tile(x_ptr, x_rows, m_mask, k0 + offs_k, K, sx_k, r, norm_ptr, s_norm, RMS)
            lo = tl.minimum(lo, tl.min(a, 1))
            hi = tl.maximum(hi, tl.max(a, 1))
            bad = tl.maximum(bad, tl.max((a - a != 0).to(tl.int32), 1))  # NaN or inf
        # quant_formats.code_rows: s = range / 127 (NaN for a bad row, 0 for a zero row);
        # divisions rounded as torch's (a compiled `/` is approximate), for the same codes
        s = tl.div_rn(hi - lo, 127.0)
        bad = (bad != 0) | ~(s <= 3.0e38)
        zero = ~bad & ~(s >= 1e-30)
        inv = tl.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), tl.where(bad | zero, 1.0, s))
        z = tl.minimum(tl.maximum(_rint(-lo * inv), 0.0), 127.0)
        # code_rows zeroes q and z of these rows; a factor s of NaN or 0 does as well
        s = tl.where(bad, float("nan"), tl.where(zero, 0.0, s))

    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # swiglu's x @ Wu
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = _x_tile(x_ptr, x_rows, m_mask, k, K, sx_k, r, norm_ptr, s_norm, RMS)
        if DYNAMIC:  # the row's codes, decoded: s (q - z)
            q = tl.minimum(tl.maximum(_rint(a * inv[:, None]) + z[:, None], 0.0), 127.0)
            a = s[:, None] * (q - z[:, None])
        w_mask = (k < K)[:, None] & n_mask[None, :]
        w = weight_tile(w_ptr, scale_ptr, k, offs_n, w_mask, sw_k, sw_n, ss_k, ss_n, WEIGHT, GROUP)
        acc = _dot(a, w, acc, x_ptr.dtype.element_ty, DOT)
        if EPILOGUE == 2:  # swiglu: Wu, the columns N.. 2N - 1
            w = weight_tile(w_ptr, scale_ptr, k, offs_n + N, w_mask, sw_k, sw_n, ss_k, ss_n,
                        WEIGHT, GROUP)
            acc_up = _dot(a, w, acc_up, x_ptr.dtype.element_ty, DOT)

    if SCALE:
        acc = acc * alpha
        acc_up = acc_up * alpha
    mask = m_mask[:, None] & n_mask[None, :]
    if EPILOGUE == 1:  # + beta * addend
        add_rows = _two_level(b, B2, sa_b1, sa_b2) + _two_level(offs_m, M2, sa_m1, sa_m2)
        addend = tl.load(add_ptr + add_rows[:, None] + offs_n[None, :] * sa_n, mask=mask,
                         other=0.0)
        acc = acc + beta * addend.to(tl.float32)
    if EPILOGUE == 2:  # swiglu
        acc = acc * tl.sigmoid(acc) * acc_up
    acc = apply_act(acc, ACT)
    out_rows = _two_level(offs_m, M2, so_m1, so_m2)
    tl.store(out_ptr + out_rows[:, None] + offs_n[None, :] * so_n,
             acc.to(out_ptr.dtype.element_ty), mask=mask)


# --- planning ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _View:
    """An operand as the kernel steps through it: its strides over the output's leading dims
    (zero where it broadcasts), then over its own matrix dims (x: k; w: k, n; addend, out: n)."""
    operand: Operand
    lead: tuple[int, ...]
    inner: tuple[int, ...]


def broadcast_strides(op: Operand, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """op's strides once expanded to `shape` (zero on the dims it broadcasts along), or None
    when it does not broadcast to exactly that shape."""
    if len(op.shape) > len(shape):
        return None
    pad = len(shape) - len(op.shape)
    strides = [0] * pad
    for size, stride, target in zip(op.shape, op.strides, shape[pad:]):
        if size not in (target, 1):
            return None
        strides.append(stride if size == target and size != 1 else 0)
    return tuple(strides)


def _two_level_args(levels: list[tuple[int, list[int]]], count: int
                    ) -> tuple[int, int, list[tuple[int, int]]] | None:
    """(size, inner size, (s1, s2) per operand) of at most two levels, or None for more."""
    if len(levels) > 2:
        return None
    if not levels:
        return 1, 1, [(0, 0)] * count
    if len(levels) == 1:
        size, strides = levels[0]
        return size, size, [(0, s) for s in strides]
    (outer, s_out), (inner, s_in) = levels
    return outer * inner, inner, list(zip(s_out, s_in))


def _fits_int32(op: Operand) -> bool:
    return sum((d - 1) * abs(s) for d, s in zip(op.shape, op.strides)) < 2**31


def dot_kind(x_dtype: str, w_dtype: str, weight: int, dynamic: bool) -> int:
    """How a GEMM's tiles are multiplied: in the half dtype when x and a float weight are both
    of it (tensor cores on a GPU; float32 sums), as TF32 for float32 ones when EQSAT_TF32=1
    (off by default: TF32 keeps 10 of float32's 23 mantissa bits), else exact float32."""
    if weight != W_FLOAT or dynamic:
        return DOT_IEEE  # (dequantized or coded tiles: multiplied as float32)
    # (Triton's interpreter multiplies bfloat16 tiles wrongly, numpy having no bfloat16:
    # measured, products of 1e21 from unit values; its float16 tiles are right)
    if x_dtype == w_dtype and (x_dtype == "float16" or x_dtype == "bfloat16" and
                               not interpreting()):
        return DOT_HALF
    if x_dtype == w_dtype == "float32" and os.environ.get("EQSAT_TF32") == "1":
        return DOT_TF32
    return DOT_IEEE


def _plan(name: str, lead: tuple[int, ...], n: int, k: int, x: _View, w: _View, out: _View,
          addend: _View | None = None, scale: tuple[Operand, int, int] | None = None,
          norm: tuple[Operand, int] | None = None, *, weight: int = W_FLOAT, group: int = 0,
          dynamic: bool = False, epilogue: int = EPI_NONE, alpha: float = 1.0,
          beta: float = 1.0, eps: float = 0.0, act: str = "none") -> list[Launch] | None:
    """The launch of gemm_kernel over the index space lead x [n] (reduced over k), or None
    when the operands do not fit its indexing. scale: (w_scale, its k and n strides); norm:
    (rms weight, its stride)."""
    used = [v for v in (x, w, out, addend) if v is not None]
    ops = [v.operand for v in used] + [t[0] for t in (scale, norm) if t is not None]
    if any(op.is_scalar for op in ops) or not all(_fits_int32(op) for op in ops):
        return None
    if 0 in lead or n == 0:
        return []
    if any(s == 0 and d > 1 for d, s in zip(lead + (n,), out.lead + out.inner)):
        return None  # a broadcast output: programs would race on it
    levels = merge_levels(lead, [v.lead for v in used])
    # rows: the innermost levels where the weight is the same (a tile's rows share its
    # weight tiles); the rest are the batch, the grid's second axis
    rows = 0
    while rows < min(2, len(levels)) and levels[-1 - rows][1][1] == 0:
        rows += 1
    row_args = _two_level_args(levels[len(levels) - rows:], len(used))
    batch_args = _two_level_args(levels[:len(levels) - rows], len(used))
    if row_args is None or batch_args is None or batch_args[0] > MAX_GRID_Y:
        return None
    (m, m2, row_strides), (batches, b2, batch_strides) = row_args, batch_args
    strides = dict(zip(("x", "w", "out", "addend"), zip(batch_strides, row_strides)))
    (sx_b, sx_m), (sw_b, _), (so_b, so_m) = strides["x"], strides["w"], strides["out"]
    sa_b, sa_m = strides.get("addend", ((0, 0), (0, 0)))

    tilings = gemm_choices(m, n, k)

    def grid(tiles: dict[str, int]) -> tuple[int, int]:
        return triton.cdiv(m, tiles["BLOCK_M"]) * triton.cdiv(n, tiles["BLOCK_N"]), batches
    args = [x.operand, w.operand, scale[0] if scale else None, norm[0] if norm else None,
            addend.operand if addend else None, out.operand,
            m, n, k, m2, b2,
            *sx_b, *sx_m, *x.inner,
            *sw_b, *w.inner,
            *(scale[1:] if scale else (0, 0)), norm[1] if norm else 0,
            *sa_b, *sa_m, addend.inner[0] if addend else 0,
            *so_b, *so_m, *out.inner,
            float(alpha), float(beta), float(eps)]
    constexprs = {**tilings[0], "GROUP_M": GROUP_M, "RMS": norm is not None, "DYNAMIC": dynamic,
                  "WEIGHT": weight, "GROUP": group, "EPILOGUE": epilogue,
                  "SCALE": alpha != 1.0, "ACT": ACT_CODES[act],
                  "DOT": dot_kind(x.operand.dtype, w.operand.dtype, weight, dynamic),
                  # compiled: no fused multiply-adds where int8_dynamic rounds a product
                  # (_rint), so that its codes are torch's; the interpreter ignores it
                  "enable_fp_fusion": not dynamic}
    return [Launch(name, gemm_kernel, grid(tilings[0]), args, constexprs,
                   choices=[(grid(t), t) for t in tilings], writes=(5,))]  # args[5]: out


def weight_format(fmt: str, w: Operand, scale: Operand, k: int, cols: int
                   ) -> tuple[int, int, tuple[Operand, int, int] | None] | None:
    """(WEIGHT, GROUP, scale and its strides) of a gemm weight format, or None for a format,
    dtype or shape the kernel does not read."""
    if fmt in ("float", *HALF_FORMATS):
        dtypes = FLOATS if fmt == "float" else {HALF_FORMATS[fmt]}
        if w.dtype in dtypes and w.shape == (k, cols):
            return W_FLOAT, 0, None
        return None
    if fmt in ("int8", DYNAMIC):
        if w.dtype == "int8" and w.shape == (k, cols) and scale.shape == (cols,) \
                and scale.dtype == "float32":
            return W_INT8, 1, (scale, 0, scale.strides[0])
        return None
    if fmt not in FORMATS:
        return None  # the sparse formats
    group = format_group(fmt)
    if float8_of(fmt):  # a scale per column, or per group of rows of a column
        if w.dtype != "uint8" or w.shape != (k, cols) or scale.dtype != "float32":
            return None
        if not group and scale.shape == (cols,):
            return W_FLOAT8[float8_of(fmt)], 1, (scale, 0, scale.strides[0])
        if group and k % group == 0 and scale.shape == (k // group, cols):
            return W_FLOAT8[float8_of(fmt)], group, (scale, *scale.strides)
        return None
    if w.dtype == "uint8" and k % group == 0 and w.shape == (k // 2, cols) \
            and scale.shape == (k // group, cols) and scale.dtype == "float32":
        return W_INT4, group, (scale, *scale.strides)
    return None


def plan_gemm(node: Node, out: Operand, ins: list[Operand]) -> list[Launch] | None:
    """The launches of a `gemm` node (ops/gemm.py): x [..., K], w by its format, the output
    [..., n]; None where the kernel does not cover it (the module docstring says which)."""
    d = GemmDescriptor.of(node.attrs)
    g = operands_of("gemm", ins)
    x, w, w_scale, norm, addend = g.x, g.w, g.w_scale, g.norm, g.addend
    if x.is_scalar or w.is_scalar or not x.shape or x.dtype not in FLOATS \
            or out.dtype not in FLOATS or d.act not in ACT_CODES:
        return None
    n, k, epilogue = d.n, x.shape[-1], d.epilogue
    if out.shape != x.shape[:-1] + (n,):
        return None
    fmt = weight_format(d.weight, w, w_scale, k, d.columns)
    if fmt is None:
        return None
    weight, group, scale = fmt
    rms = None
    if d.normed:
        norm_strides = None if norm.is_scalar else broadcast_strides(norm, (k,))
        if norm_strides is None:
            return None
        rms = (norm, norm_strides[0])
    elif d.prologue != "none":
        return None
    lead = out.shape[:-1]
    add = None
    if epilogue in ("add", "bias") and not (epilogue == "bias" and d.beta == 0.0):
        add_strides = None if addend.is_scalar else broadcast_strides(addend, out.shape)
        if add_strides is None:
            return None
        add = _View(addend, add_strides[:-1], add_strides[-1:])
    elif epilogue not in ("none", "swiglu", "bias"):
        return None
    code = EPI_SWIGLU if epilogue == "swiglu" else EPI_ADD if add else EPI_NONE
    return _plan(
        "gemm", lead, n, k, _View(x, x.strides[:-1], x.strides[-1:]),
        _View(w, (0,) * len(lead), (w.strides[0], w.strides[1])),
        _View(out, out.strides[:-1], out.strides[-1:]), add, scale, rms,
        weight=weight, group=group, dynamic=d.dynamic, epilogue=code,
        alpha=d.alpha, beta=d.beta if epilogue == "bias" else 1.0, eps=d.eps, act=d.act)


def plan_matmul(node: Node, out: Operand, ins: list[Operand]) -> list[Launch] | None:
    """The launches of a node of MATMUL_OPS: torch.matmul's broadcasting (a 1-D operand a
    row or a column that the output drops), batches on the grid's second axis; linear reads
    its weight [N, K] transposed, by its strides."""
    op, attrs = node.op, node.attrs
    if op not in MATMUL_OPS or any(t.is_scalar for t in ins):
        return None
    addend, alpha, beta = None, attrs.get("alpha", 1.0), 1.0
    if op == "addmm":
        addend, x, w = ins
        beta = attrs["beta"]
    else:
        x, w = ins[:2]
        addend = ins[2] if op == "linear_bias" else None
    if op in ("linear", "linear_bias"):
        if len(w.shape) != 2:
            return None
        w = Operand(w.node, w.shape[::-1], w.strides[::-1], w.dtype)  # W = w.T, a view
    if not x.shape or not w.shape or {x.dtype, w.dtype, out.dtype} - FLOATS:
        return None
    # a 1-D x is one row, a 1-D w one column: the output does not have that dim
    x_shape, x_strides = (x.shape, x.strides) if len(x.shape) > 1 else \
        ((1,) + x.shape, (0,) + x.strides)
    w_shape, w_strides = (w.shape, w.strides) if len(w.shape) > 1 else \
        (w.shape + (1,), w.strides + (0,))
    m, k, n = x_shape[-2], x_shape[-1], w_shape[-1]
    if w_shape[-2] != k:
        return None
    batch = _broadcast_shape(x_shape[:-2], w_shape[:-2])
    if batch is None:
        return None
    dropped = (len(x.shape) == 1, len(w.shape) == 1)
    if out.shape != _drop(batch + (m, n), *dropped):
        return None
    x_lead = broadcast_strides(Operand(x.node, x_shape[:-2], x_strides[:-2], x.dtype), batch)
    w_lead = broadcast_strides(Operand(w.node, w_shape[:-2], w_strides[:-2], w.dtype), batch)
    out_strides = _undrop(out.strides, *dropped)
    add = None
    if addend is not None and beta != 0.0:  # torch.addmm ignores input when beta is 0
        add_strides = broadcast_strides(addend, out.shape)
        if add_strides is None or addend.dtype not in FLOATS:
            return None
        add_strides = _undrop(add_strides, *dropped)
        add = _View(addend, add_strides[:-1], add_strides[-1:])
    return _plan(op, batch + (m,), n, k,
                 _View(x, x_lead + (x_strides[-2],), x_strides[-1:]),
                 _View(w, w_lead + (0,), w_strides[-2:]),
                 _View(out, out_strides[:-1], out_strides[-1:]), add,
                 epilogue=EPI_ADD if add else EPI_NONE, alpha=alpha, beta=beta)


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    a, b = (1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b
    if any(p != q and 1 not in (p, q) for p, q in zip(a, b)):
        return None
    return tuple(p if q == 1 else q for p, q in zip(a, b))


def _drop(shape: tuple[int, ...], row: bool, col: bool) -> tuple[int, ...]:
    # the output shape of torch.matmul from the full [..., m, n]
    return shape[:len(shape) - 2] + (() if row else shape[-2:-1]) + (() if col else shape[-1:])


def _undrop(strides: tuple[int, ...], row: bool, col: bool) -> tuple[int, ...]:
    # the inverse: strides over the full [..., m, n], zero for the dims matmul dropped
    strides = strides + (0,) if col else strides
    return strides[:-1] + (0,) + strides[-1:] if row else strides
