"""FP8 checkpoints read as transformers reads them on a CPU: block-dequantized.

A checkpoint with `quantization_config.quant_method == "fp8"` (transformers' fine-grained FP8:
DeepSeek-V3, Qwen3-FP8 and the like) stores a linear weight `W` as float8 values `X.weight`
[rows, cols] and per-block scales `X.weight_scale_inv` [rows / bm, cols / bn] (blocks of 128 x
128 as a rule; the block is the ratio of the two shapes). transformers without a GPU
dequantizes them as it loads (`Fp8Dequantize`: the float8 values and the scales in float32,
multiplied, then cast to the model's dtype) and so does this reader, a tensor or a slice of its
rows at a time; the cast to the model's dtype is the weight source's, as for any weight.

With `quantize="fp8_e4m3_g128"` the checkpoint's own bytes and scales are kept instead
(`as_format`): that format's scale per group of 128 rows of a column holds a 128 x 128 block
scale exactly, so nothing is rounded a second time.

A float8 weight without its scale, or a checkpoint quantized by another method, is refused:
read as values, it would give wrong answers without a word."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import EqsatError
from ..formats.quant_formats import FLOAT8

FLOAT8_DTYPES = frozenset(dtype for dtype, _ in FLOAT8.values())
SCALE = "_scale_inv"  # X.weight -> X.weight_scale_inv


def quant_method(config: Any) -> str | None:
    """The checkpoint's quantization method (config.json's quantization_config), or None."""
    return method_of(getattr(config, "quantization_config", None))


def method_of(q: Any) -> str | None:
    """The quant_method of a quantization_config (a dict as config.json holds it, or
    transformers' object), or None."""
    if q is None:
        return None
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    return str(getattr(method, "value", method)) if method is not None else "unknown"


def check_method(config: Any, path: Any) -> None:
    method = quant_method(config)
    if method not in (None, "fp8"):
        raise EqsatError(f"{path}: a checkpoint quantized with {method!r}, which this reader "
                         "does not read (it reads float, half and fp8 block-scaled "
                         "checkpoints); load the model with transformers and pass it to "
                         "Generator(model, ...)")


KEEPS_BYTES = "fp8_e4m3_g128"  # the format that holds the checkpoint's weights as stored


def check_quantize(method: str | None, quantize: str | None, path: Any) -> None:
    """Warn where an FP8 checkpoint (quant_method `method`) is quantized to a format that
    rounds its weights again (int8, per-column fp8, ...): KEEPS_BYTES would keep its float8
    bytes and block scales."""
    import warnings

    from ..formats.quantization import resolve_format

    if quantize is not None and method == "fp8" and \
            resolve_format(quantize) != KEEPS_BYTES:
        warnings.warn(f"{path}: an FP8 checkpoint quantized to {resolve_format(quantize)}: its "
                      "weights are dequantized and rounded again; quantize="
                      f"{KEEPS_BYTES!r} keeps its float8 bytes and block scales", stacklevel=3)


def scale_key(key: str, keys: Any) -> str | None:
    """The block scales of the weight `key`, if the checkpoint has them."""
    return key + SCALE if key + SCALE in keys else None


def dequantized(q: torch.Tensor, scales: torch.Tensor, rows: int, start: int = 0,
                name: str = "") -> torch.Tensor:
    """Rows [start, start + len(q)) of a weight of `rows` rows, from its float8 values `q`
    and its whole block-scale grid, in float32 (as transformers' Fp8Dequantize computes)."""
    if q.dtype not in FLOAT8_DTYPES or q.dim() != 2 or scales.dim() != 2:
        raise EqsatError(f"tensor {name}: a {q.dtype} [{', '.join(map(str, q.shape))}] weight "
                         f"with {list(scales.shape)} scales, not a 2-D float8 weight with its "
                         "block scales")
    cols = q.shape[1]
    scale_rows, scale_cols = scales.shape
    if rows % scale_rows or cols % scale_cols:
        raise EqsatError(f"tensor {name}: [{rows}, {cols}] is not a whole number of blocks of "
                         f"its [{scale_rows}, {scale_cols}] scale grid")
    bm, bn = rows // scale_rows, cols // scale_cols
    block_rows = torch.arange(start, start + q.shape[0]) // bm
    return q.to(torch.float32) * _float_scales(scales)[block_rows].repeat_interleave(bn, dim=1)


def _float_scales(scales: torch.Tensor) -> torch.Tensor:
    """The block scales in float32 (uint8: E8M0 exponents, as transformers reads them)."""
    return (scales.to(torch.float32) - 127.0).exp2() if scales.dtype == torch.uint8 \
        else scales.to(torch.float32)


def as_format(q: torch.Tensor, scales: torch.Tensor, fmt: str, name: str = ""
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The weight W = q.T (q: the checkpoint's float8 [rows, cols], x @ W reading it) in the
    grouped float8 format `fmt` (quant_formats: bytes [cols, rows], scales [cols / G,
    rows]), exactly: its bytes are q's and the scale of group g of column n is the block
    scale of (n, g). None where the checkpoint's encoding or block is not the format's (then
    the weight is dequantized and quantized as any other)."""
    from ..formats.quant_formats import FLOAT8, float8_of, format_group

    group, encoding = format_group(fmt), float8_of(fmt)
    if not group or encoding is None or q.dtype != FLOAT8[encoding][0] or q.dim() != 2 or \
            scales.dim() != 2:
        return None
    rows, cols = q.shape
    if rows % scales.shape[0] or cols != scales.shape[1] * group:
        return None
    if not bool(torch.isfinite(q.to(torch.float32)).all()):  # (the kernels read no NaN byte)
        raise EqsatError(f"tensor {name}: float8 values holding NaN, which {fmt} cannot hold")
    per_row = _float_scales(scales).repeat_interleave(rows // scales.shape[0], dim=0)
    return q.view(torch.uint8).t().contiguous(), per_row.t().contiguous()


def unscaled(t: torch.Tensor, key: str, file: str) -> torch.Tensor:
    """t, a tensor the checkpoint stores with no block scales; refused when it is float8."""
    if t.dtype in FLOAT8_DTYPES:
        raise EqsatError(f"{file}: tensor {key} is stored in float8 ({t.dtype}) with no "
                         f"{key}{SCALE}: a quantization this reader does not know (read as "
                         "values it would be wrong)")
    return t
