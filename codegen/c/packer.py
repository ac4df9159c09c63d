"""PackedWeight.prepare in C: a float weight laid out as column panels in one pass.

A float32 program's GEMMs read each weight as panels of PACKED_PANEL columns (packed_gemm.py).
torch's form of the layout (PackedWeight.prepare_in_torch) takes the weight's view as a row-
major flat tensor (a copy where the constant is a transposed view, as a widened nn.Linear
weight is), widens it, pads its columns and permutes it into panels: four passes over the
weight in float32. Here each panel is written once, straight from the constant as it lies
(float32 or bf16 bits, its own strides), the threads taking panels; `pack_columns_in_c` packs
a weight whose columns a checkpoint stores apart (a merged q, k, v) part by part from the
stored tensors. The values are the same, bit for bit (tests/test_packer.py,
tests/test_lazy_weights.py). What it saves at a float32 start: docs/memory.md and RESULTS.md
("Load-time kernels", "Generating from a checkpoint"). Where there is no C compiler, or the
constant is not a 2-D float32 or bf16 tensor on the CPU, `pack_in_c` returns None and torch's
form runs."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from .build import helper_library
from .static_c import kernel_source
from .tiles import PACKED_PANEL

PACK_C = kernel_source("packer.c")


@cache
def _library() -> ctypes.CDLL | None:
    lib = helper_library(PACK_C)
    if lib is not None:
        lib.eq_pack.restype = None
        lib.eq_pack.argtypes = [ctypes.c_void_p, ctypes.c_int, *[ctypes.c_int64] * 9,
                                ctypes.c_void_p]
    return lib


def pack_columns_in_c(parts: list[tuple[int, torch.Tensor]], k: int, n: int
                      ) -> torch.Tensor | None:
    """The panels of a k x n weight whose columns are stored apart: (first column, the
    source's [width, k] tensor) per part, each transposed into its panels straight from the
    source (a merged q, k and v read from a checkpoint in bf16: no widened copy, no join).
    None where a part does not start on a panel or pack_in_c declines."""
    for first, w in parts:  # every part checked before the panels are allocated
        ragged = w.shape[0] % PACKED_PANEL and first + w.shape[0] != n  # shares a panel
        if first % PACKED_PANEL or ragged or w.dim() != 2 or w.shape[1] != k:
            return None
    out = torch.empty(-(-n // PACKED_PANEL), k, PACKED_PANEL, dtype=torch.float32)
    for first, w in parts:
        width = w.shape[0]
        panels = out[first // PACKED_PANEL:-(-(first + width) // PACKED_PANEL)]
        if pack_in_c(w, 0, k, width, 1, k, out=panels) is None:
            return None
    return out


def pack_in_c(w: torch.Tensor, offset: int, k: int, n: int, rs: int, cs: int,
              out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The panels [ceil(n / PACKED_PANEL), k, PACKED_PANEL] (float32) of the view (offset,
    k x n, flat strides rs, cs) of `w`'s row-major flat values, as PackedWeight lays them
    out (into `out` where given); None where no C compiler is found or `w` is not a 2-D
    float32 / bf16 CPU tensor."""
    if w.dtype not in (torch.float32, torch.bfloat16) or w.device.type != "cpu" or \
            w.dim() != 2 or w.is_meta or rs < 0 or cs < 0 or k <= 0 or n <= 0:
        return None
    last = offset + (k - 1) * rs + (n - 1) * cs
    if offset < 0 or last >= w.numel() or PACKED_PANEL > 64:
        return None
    lib = _library()
    if lib is None:
        return None
    shape = (-(-n // PACKED_PANEL), k, PACKED_PANEL)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif tuple(out.shape) != shape or out.dtype != torch.float32 or not out.is_contiguous():
        return None
    w = w.detach()
    lib.eq_pack(w.data_ptr(), int(w.dtype == torch.bfloat16), w.shape[1], w.stride(0),
                w.stride(1), offset, k, n, rs, cs, PACKED_PANEL, out.data_ptr())
    return out
