"""`quant_formats.quantize` in C: the same integers and scales bit for bit, in one pass.

Loading a quantized model quantizes every GEMM weight (int8, int4; float8 in `eq_quantize_fp8`,
rounding as torch's conversion does); torch's form of it (formats/quant_formats.py) makes seven
passes over each weight in float32 (widen, abs, amax, divide, round, clamp, narrow), 0.1 GB/s of
bf16 weights on the machines here: most of a warm start. Here the weight is read as it lies (float32
or bf16 bits, any strides) in blocks of 64 columns, a tile of rows at a time into a local float tile
(int4: a group, read once; int8: the block twice, its max then its integers), the vector loops
running across the columns, with the same float32 operations in the same order (|w| max, max / 7
rounded to float16 or max / 127, an all-zero group's scale 1, w / scale rounded half to even,
clamped), so the result equals torch's;
tests/test_quantizer.py compares them; benchmarks/load_kernels.py times them side by side
(transposed bf16 nn.Linear weights: 1.8-3.6 GB/s here, 2.3-8.9x torch's form). Built once per
machine through the C backend's compile cache; where there is no C compiler, `quantize_in_c`
returns None and torch's form runs."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from .build import helper_library
from .static_c import kernel_source

QUANTIZE_C = kernel_source("quantizer.c")


@cache
def _library() -> ctypes.CDLL | None:
    lib = helper_library(QUANTIZE_C)
    if lib is not None:
        lib.eq_quantize.restype = None
        lib.eq_quantize.argtypes = [ctypes.c_void_p, ctypes.c_int, *[ctypes.c_int64] * 5,
                                    ctypes.c_void_p, ctypes.c_void_p]
        lib.eq_quantize_fp8.restype = ctypes.c_int64
        lib.eq_quantize_fp8.argtypes = [ctypes.c_void_p, ctypes.c_int, *[ctypes.c_int64] * 4,
                                        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def _library_for(w: torch.Tensor) -> ctypes.CDLL | None:
    """The library, where `w` is a weight it reads (2-D float32 or bf16 on the CPU) and a C
    compiler is found; else None."""
    if w.dtype not in (torch.float32, torch.bfloat16) or w.device.type != "cpu" or \
            w.dim() != 2 or w.is_meta:
        return None
    return _library()


def quantize_fp8_in_c(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(float8 bytes, scales) of the [K, N] weight `w` (float32 or bfloat16, on the CPU) in
    the float8 format `fmt` as quant_formats.quantize gives them; None where no C compiler
    is found or `w` is of another kind. A weight holding NaN or inf: GraphError."""
    from ...errors import GraphError

    lib = _library_for(w)
    if lib is None:
        return None
    k, n = w.shape
    q = torch.empty(k, n, dtype=torch.uint8)
    scale = torch.empty(n, dtype=torch.float32)
    w = w.detach()
    bad = lib.eq_quantize_fp8(w.data_ptr(), int(w.dtype == torch.bfloat16), k, n, w.stride(0),
                              w.stride(1), int(fmt == "fp8_e5m2"), q.data_ptr(),
                              scale.data_ptr())
    if bad:
        raise GraphError(f"cannot quantize a weight holding NaN or inf to {fmt}")
    return q, scale


def quantize_in_c(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(integers, scales) of the [K, N] weight `w` (float32 or bfloat16, on the CPU) as
    quant_formats.quantize gives them: int8 per column (group 0) or int4 in groups of `group`
    rows; None where no C compiler is found or `w` is of another kind."""
    lib = _library_for(w)
    if lib is None:
        return None
    k, n = w.shape
    if group:
        q = torch.empty(k // 2, n, dtype=torch.uint8)
        scale = torch.empty(k // group, n, dtype=torch.float32)
    else:
        q = torch.empty(k, n, dtype=torch.int8)
        scale = torch.empty(n, dtype=torch.float32)
    w = w.detach()
    lib.eq_quantize(w.data_ptr(), int(w.dtype == torch.bfloat16), k, n, w.stride(0),
                    w.stride(1), group, q.data_ptr(), scale.data_ptr())
    return q, scale
