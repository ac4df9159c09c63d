"""A half-precision weight laid out in QuantPanels' panels by C, from where it lies.

A bf16 checkpoint's nn.Linear weight [N, K] is the GEMM's [K, N] transposed; its panels
([N / 64][K][64]: 64 columns, all down K) are 64 x K blocks of it transposed. torch's strided
copy does that at about 1 GB/s of bf16 here, most of a warm bf16 start; this one goes through a
64 x 64 tile that stays in L1 (several GB/s). The values are moved, never changed:
tests/test_panel_layout.py compares it with torch's copy."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from .build import helper_library
from .tiles import QUANT_PANEL

PANELS16_C = r"""
#include <stdint.h>
#include <string.h>

/* out[p][k][j] = src[k * sr + (64 p + j) * sc] for k < rows and 64 p + j < n, zero past n:
   16-bit values of any strides into panels of 64 columns, a panel per thread's turn; a
   64 x 64 block at a time through a local tile when the columns are not contiguous */
void eq_panels16(const uint16_t* src, int64_t rows, int64_t n, int64_t sr, int64_t sc,
                 uint16_t* out) {
    const int64_t np = (n + 63) / 64;
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < np; p++) {
        const int64_t cols = n - 64 * p < 64 ? n - 64 * p : 64;
        const uint16_t* s = src + 64 * p * sc;
        uint16_t* o = out + p * rows * 64;
        uint16_t t[64][64];
        for (int64_t k0 = 0; k0 < rows; k0 += 64) {
            const int64_t kr = rows - k0 < 64 ? rows - k0 : 64;
            if (sc == 1) {
                for (int64_t k = 0; k < kr; k++)
                    memcpy(t[k], s + (k0 + k) * sr, cols * 2);
            } else {
                for (int64_t j = 0; j < cols; j++)
                    for (int64_t k = 0; k < kr; k++) t[k][j] = s[(k0 + k) * sr + j * sc];
            }
            for (int64_t k = 0; k < kr; k++) {
                if (cols < 64) memset(t[k] + cols, 0, (64 - cols) * 2);
                memcpy(o + (k0 + k) * 64, t[k], 128);
            }
        }
    }
}
"""


@cache
def _library() -> ctypes.CDLL | None:
    lib = helper_library(PANELS16_C)
    if lib is not None:
        lib.eq_panels16.restype = None
        lib.eq_panels16.argtypes = [ctypes.c_void_p, *[ctypes.c_int64] * 4, ctypes.c_void_p]
    return lib


def half_panels_into(out: torch.Tensor, half: torch.Tensor) -> bool:
    """Fill `out` ([ceil(n / 64), rows, 64], contiguous) with the panels of `half` ([rows,
    n], a 16-bit dtype, any strides); False (nothing written) where no C compiler is found
    or the tensors are of another kind."""
    if QUANT_PANEL != 64 or half.element_size() != 2 or out.dtype != half.dtype or \
            not out.is_contiguous() or \
            half.dim() != 2 or half.device.type != "cpu" or \
            tuple(out.shape) != (-(-half.shape[1] // 64), half.shape[0], 64):
        return False
    lib = _library()
    if lib is None:
        return False
    lib.eq_panels16(half.data_ptr(), half.shape[0], half.shape[1], half.stride(0),
                    half.stride(1), out.data_ptr())
    return True
