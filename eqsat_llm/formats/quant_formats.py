"""Weight formats of the gemm op: what a quantized weight is, as reference semantics.

A float weight W [K, N] (x @ W, N output channels) is stored as integers and scales:

    int8       per output channel: scale[n] = max_k |W[k, n]| / 127, q = round(W / scale) in
               [-127, 127], int8 [K, N]; W ~ q * scale[n]
    fp8_e4m3   per output channel: scale[n] = max_k |W[k, n]| / 448, q = W / scale rounded to
               the nearest float8 e4m3 (OCP's E4M3FN: 4 exponent bits of bias 7, 3 mantissa
               bits, max 448; torch.float8_e4m3fn), its bits stored as uint8 [K, N];
               W ~ e4m3(q) * scale[n]. A relative step of 2^-3 at every magnitude (half of it
               the error), where int8's step is absolute (max|W| / 127): small weights keep
               their digits. ("fp8" is this format.)
    fp8_e5m2   the same with float8 e5m2 (5 exponent bits of bias 15, 2 mantissa bits, max
               57344: the top byte of a float16; torch.float8_e5m2): scale[n] = max / 57344
    fp8_e4m3_g128  e4m3 with a float32 scale per group of 128 rows of a column: scale[g, n] =
               max |W| over the group / 448, uint8 [K, N] and float32 [K / 128, N];
               W ~ e4m3(q) * scale[k // 128, n]. It holds the 128 x 128 block scales of FP8
               checkpoints (DeepSeek-V3's, transformers' "fp8" quant method) exactly: a
               block's scale is each of its columns' group scale (checkpoint_fp8_pair below).
    int4_gG    group-wise along K (groups of G = 32, 64 or 128 rows): scale[g, n] = max |W| over
               the group / 7 rounded to the nearest float16 (the kernels store it so: a
               quarter of the bytes of the integers, not half), q = round(W / scale) in
               [-8, 7], stored as q + 8 in a nibble,
               uint8 [K / 2, N]: byte (k2, n) holds row 2 k2 in its low nibble and row 2 k2 + 1
               in its high nibble; W ~ q * scale[k // G, n]

Symmetric (no zero point): the kernels then dequantize with one multiply. An all-zero column
or group gets scale 1, so that it dequantizes to exactly zero; a group whose scale overflows
float16 (max |W| above 7 x 65504) is an error, not a silent zero. The quantized values are
computed once at compile time, by constant folding of the ops quantize_weight and
weight_scales (ops/formats.py).

The gemm format DYNAMIC ("int8_dynamic") stores W as int8 and also codes the activations,
per row and per call, in 7 bits with a zero point (code_rows below): the product is then in
integers (codegen/c/w8a8_gemm.py), as ONNX Runtime's dynamic quantization does.
The gemm format DYNAMIC4 ("int4_dynamic") stores W as int4_g32 and codes the activations per
block of 32 along K, symmetric in 8 bits (code_blocks below: llama.cpp's Q8_0): the GEMV
then multiplies bytes (codegen/c/quant_gemm.py), as llama.cpp's Q4_0 x Q8_0 product does."""

from __future__ import annotations

import torch

from ..errors import GraphError
from ..tensor_type import TensorType
from .last_call import last_call

FORMATS = ("int8", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_g128", "int4_g32", "int4_g64",
           "int4_g128")
# the float8 encodings: their torch dtype and largest finite value (a format's: float8_of)
FLOAT8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}
DYNAMIC = "int8_dynamic"  # int8 weights (stored as "int8"), activations coded per row
ACTIVATION_CODES = 127  # codes 0..127: 7 bits (w8a8_gemm.py: why not 8)
DYNAMIC4 = "int4_dynamic"  # int4_g32 weights, activations coded per block of ACTIVATION_BLOCK
ACTIVATION_BLOCK = 32
DYNAMIC_STORED = {DYNAMIC: "int8", DYNAMIC4: "int4_g32"}  # what a dynamic format's W is


def format_group(fmt: str) -> int:
    """The group size along K of a format (0: one scale per output channel)."""
    _check(fmt)
    return int(fmt.rsplit("_g", 1)[1]) if "_g" in fmt else 0


def float8_of(fmt: str) -> str | None:
    """The float8 encoding (a key of FLOAT8) of a float8 format, else None."""
    base = fmt.rsplit("_g", 1)[0]
    return base if base in FLOAT8 and fmt in FORMATS else None


def is_nibbles(fmt: str) -> bool:
    """Whether a format stores two values a byte (int4: [K / 2, N], float16-valued scales)."""
    return fmt.startswith("int4_g")


def stored_dtype(fmt: str) -> str:
    """The dtype of a format's stored values: int8's integers; fp8's bits and int4's nibble
    pairs as bytes."""
    _check(fmt)
    return "int8" if fmt == "int8" else "uint8"


def _check(fmt: str) -> None:
    if fmt not in FORMATS:
        raise GraphError(f"unknown weight format {fmt!r}; one of {FORMATS}")


def quantizable(k: int, fmt: str) -> bool:
    """Whether a weight with K rows can take the format (int4: whole groups)."""
    group = format_group(fmt)
    return k > 0 and (group == 0 or k % group == 0)


@last_call
def quantize(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(integers, scales) of the float weight w [K, N] in format `fmt`. Columns are
    independent, so a wide weight is done some columns at a time: its float32 temporaries
    stay small (an LM head's would be several times the head's size)."""
    if w.dim() != 2 or not quantizable(w.shape[0], fmt):
        raise GraphError(f"cannot quantize a weight of shape {tuple(w.shape)} to {fmt}")
    from ..codegen.c.quantizer import quantize_fp8_in_c, quantize_in_c

    fp8, group = float8_of(fmt), format_group(fmt)
    if fp8 and group:  # each group of rows as per-column float8: the same definition
        return _by_groups(w, group, lambda rows: quantize(rows, fp8))
    fast = quantize_fp8_in_c(w, fmt) if fp8 else \
        quantize_in_c(w, group)  # the same values, in one pass
    q, scale = fast if fast is not None else quantize_in_torch(w, fmt)
    _check_scales(scale, fmt)
    return q, scale


def quantize_in_torch(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize's definition, in torch ops (the C form, codegen/c/quantizer.py, equals it)."""
    w = w.detach()
    k, n = w.shape
    step = max(1, _CHUNK_ELEMENTS // max(k, 1))
    if n <= step:
        return _quantize_columns(w, fmt)
    parts = [_quantize_columns(w[:, i:i + step], fmt) for i in range(0, n, step)]
    return torch.cat([q for q, _ in parts], 1), torch.cat([s for _, s in parts], -1)


_CHUNK_ELEMENTS = 1 << 22  # elements of w quantized at a time (16 MB of float32)


def _quantize_columns(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    group = format_group(fmt)
    w = w.to(torch.float32, copy=True)  # a private copy: rounded in place below
    if float8_of(fmt) and group:
        return _by_groups(w, group, lambda rows: _quantize_columns(rows, float8_of(fmt)))
    if fmt in FLOAT8:  # (torch's conversion rounds to nearest even; w / scale <= top)
        if not bool(torch.isfinite(w).all()):  # the kernels' widening reads no NaN byte
            raise GraphError(f"cannot quantize a weight holding NaN or inf to {fmt}")
        dt, top = FLOAT8[fmt]
        scale = _scale(w.abs().amax(0) / top)
        return w.div_(scale).to(dt).view(torch.uint8), scale
    if group == 0:
        scale = _scale(w.abs().amax(0) / 127.0)
        return w.div_(scale).round_().clamp_(-127, 127).to(torch.int8), scale
    k, n = w.shape
    groups = w.reshape(k // group, group, n)
    scale = _scale((groups.abs().amax(1) / 7.0).to(torch.float16).to(torch.float32))
    q = groups.div_(scale[:, None, :]).round_().clamp_(-8, 7).add_(8).to(torch.uint8)
    q = q.reshape(k, n)
    return q[0::2] | (q[1::2] << 4), scale


def _by_groups(w: torch.Tensor, group: int, per_column) -> tuple[torch.Tensor, torch.Tensor]:
    """A grouped float8 format's (bytes [K, N], scales [K / group, N]): each group of rows
    quantized per column by `per_column`."""
    parts = [per_column(rows) for rows in w.split(group)]
    return torch.cat([q for q, _ in parts]), torch.stack([s for _, s in parts])


def _scale(scale: torch.Tensor) -> torch.Tensor:
    """The scales as stored: 1 where zero or NaN (a group of zeros, or one holding a NaN)."""
    return torch.where(scale > 0, scale, torch.ones_like(scale)).contiguous()


def _check_scales(scale: torch.Tensor, fmt: str) -> None:
    """Refuse int4 scales that overflowed float16: their weights would dequantize to 0."""
    if is_nibbles(fmt) and bool(torch.isinf(scale).any()):
        raise GraphError(f"cannot quantize a weight to {fmt}: a group's max |w| exceeds "
                         f"7 x 65504, beyond its float16 scale; use int8 or keep it float")


def dequantize(q: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """The float32 weight [K, N] that (q, scale) of format `fmt` stand for."""
    group = format_group(fmt)
    if float8_of(fmt):
        values = q.view(FLOAT8[float8_of(fmt)][0]).to(torch.float32)
        return values * (scale.repeat_interleave(group, 0) if group else scale)
    if group == 0:
        return q.to(torch.float32) * scale
    low, high = (q & 15).to(torch.float32) - 8, (q >> 4).to(torch.float32) - 8
    k2, n = q.shape
    values = torch.stack([low, high], 1).reshape(2 * k2, n)
    return values * scale.repeat_interleave(group, 0)


def quantized_types(w: TensorType, fmt: str) -> tuple[TensorType, TensorType]:
    """The types of (integers, scales) for a weight of type w."""
    group = format_group(fmt)
    if len(w.shape) != 2 or not quantizable(w.shape[0], fmt):
        raise GraphError(f"cannot quantize a weight {w} to {fmt}")
    k, n = w.shape
    values = TensorType((k // 2, n) if is_nibbles(fmt) else (k, n), stored_dtype(fmt))
    return values, TensorType((k // group, n) if group else (n,), "float32")


def code_rows(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, scale, zero point) of each row of the float32 a [M, K], as the kernel computes
    them: s = (max(a, 0) - min(a, 0)) / 127, z = rint(-min(a, 0) / s), q = clamp(rint(a * (1 /
    s)) + z, 0, 127) (the float32 reciprocal), so that a ~ s (q - z) within s / 2; s = 0 for
    a zero row (below 1e-30), NaN for a row with NaN or inf."""
    mn, mx = a.amin(1).clamp(max=0), a.amax(1).clamp(min=0)
    s = (mx - mn) / ACTIVATION_CODES
    bad = ~a.isfinite().all(1) | ~(s <= 3.0e38)
    zero = ~bad & ~(s >= 1e-30)
    inv = 1.0 / torch.where(bad | zero, torch.ones_like(s), s)
    z = torch.round(-mn * inv).clamp(0, ACTIVATION_CODES)
    q = (torch.round(a * inv[:, None]) + z[:, None]).clamp(0, ACTIVATION_CODES)
    q[bad | zero], z[bad | zero] = 0, 0
    s = torch.where(zero, torch.zeros_like(s), s)
    return q, torch.where(bad, torch.full_like(s, float("nan")), s), z


def coded_activations(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as the int8_dynamic gemm sees it: each row coded (code_rows) and decoded,
    s (q - z), in x's dtype."""
    rows = x.reshape(-1, x.shape[-1]).float()
    q, s, z = code_rows(rows)
    return (s[:, None] * (q - z[:, None])).reshape(x.shape).to(x.dtype)


def code_blocks(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of the float32 a [M, K] (K a multiple of ACTIVATION_BLOCK) as the
    int4_dynamic kernel computes them, per block of 32 along K: s = max |a| / 127, codes q =
    clamp(rint(a * (1 / s)), -127, 127) (the float32 reciprocal), so that a ~ s q within s / 2;
    s = 0 and codes 0 for a block of zeros (max below 1e-30), s = NaN for a block holding NaN
    or inf. codes [M, K], scales [M, K / 32]."""
    m, k = a.shape
    blocks = a.reshape(m, k // ACTIVATION_BLOCK, ACTIVATION_BLOCK)
    s = blocks.abs().amax(2) / 127.0
    bad = ~blocks.isfinite().all(2) | ~(s <= 3.0e38)
    zero = ~bad & ~(s >= 1e-30)
    inv = 1.0 / torch.where(bad | zero, torch.ones_like(s), s)
    q = torch.round(blocks * inv[..., None]).clamp(-127, 127)
    q[bad | zero] = 0
    s = torch.where(zero, torch.zeros_like(s), s)
    return q.reshape(m, k), torch.where(bad, torch.full_like(s, float("nan")), s)


def coded_blocks(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as the int4_dynamic gemm sees it: each block of 32 coded (code_blocks) and
    decoded, s q, in x's dtype."""
    rows = x.reshape(-1, x.shape[-1]).float()
    q, s = code_blocks(rows)
    decoded = q.reshape(len(rows), -1, ACTIVATION_BLOCK) * s[..., None]
    return decoded.reshape(x.shape).to(x.dtype)
