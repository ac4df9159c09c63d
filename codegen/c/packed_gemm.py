"""GEMMs against a constant weight, packed once when the program is built.

The weight B [K, N] is stored as panels of PACKED_PANEL = 32 columns (tiles.py), each panel
K x 32 contiguous (the last one zero-padded), so that the micro-kernel streams a panel with two
aligned vector loads per k. The micro-kernel keeps a 14 x 32 tile of C in 28 AVX-512
registers for the whole of K (no K blocking: partial sums never leave the registers, so the
output may not be read before the tile is final) and broadcasts A's elements from its rows
(row tails in tiles of 8, 4, 2, 1). The tile is stored times alpha, and the epilogue runs on
it at once, while it is in L1: a per-row scale, then addends (a bias or a residual, each
broadcast along rows or columns), then an activation.
Threads split the column panels. With AVX2 (no AVX-512) a tile is 6 rows of one 16-column half
of the panel (12 ymm accumulators), the two halves one after the other; otherwise the same
loops run in portable C.

Measured on a 2-core AVX-512 machine (benchmarks in docs/c-backend.md): 320-360
GFLOP/s at M = 128 against 240-270 for OpenBLAS 0.3.34 with the same column split, and
250-270 against 100 at M = 16."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ...ops import ACTIVATIONS as OP_ACTIVATIONS
from .static_c import StaticLibrary, kernel_source, library_text
from .tiles import PACKED_PANEL

# activations the epilogue applies after the addends: eq_act's code of each (ops.ACTIVATIONS)
ACTIVATIONS = {name: act.code for name, act in OP_ACTIVATIONS.items()}


@dataclass(frozen=True)
class PackedWeight:
    """A prepared constant: the view (offset, K x N with strides rs, cs) of the constant
    `name`, laid out as column panels."""
    name: str
    offset: int
    k: int
    n: int
    rs: int
    cs: int

    def parts(self, constants: Any) -> list[tuple[PackedWeight, slice]]:
        """The views another program may pack alone that are panels (dim 0) of this one's
        packed tensor: each part of a merged weight whose columns start and end on panel
        boundaries (the q, k and v of a merged projection: `constants.column_parts`)."""
        if self.cs != 1:
            return []
        cuts = constants.column_parts(self.name, self.offset, self.k, self.n, self.rs)
        return [(replace(self, offset=self.offset + start, n=width),
                 slice(start // PACKED_PANEL, (start + width) // PACKED_PANEL))
                for start, width in cuts if start % PACKED_PANEL == 0 and
                width % PACKED_PANEL == 0 and width < self.n]

    def prepare(self, constants: dict[str, torch.Tensor]) -> torch.Tensor:
        from .packer import pack_columns_in_c, pack_in_c  # (one pass in C: packer.py)

        stored = getattr(constants, "source_columns", None)  # (a checkpoint's weights)
        parts = stored(self.name, self.offset, self.k, self.n, self.rs) \
            if stored is not None and self.cs == 1 else None
        packed = pack_columns_in_c(parts, self.k, self.n) if parts else None
        if packed is not None:
            return packed
        w = constants[self.name]
        packed = pack_in_c(w, self.offset, self.k, self.n, self.rs, self.cs)
        return packed if packed is not None else self.prepare_in_torch(w)

    def prepare_in_torch(self, w: torch.Tensor) -> torch.Tensor:
        """prepare's definition: the view of w's row-major flat values, widened, its columns
        padded to whole panels, as panels [ceil(n / PACKED_PANEL), k, PACKED_PANEL]."""
        w = w.detach().reshape(-1)
        b = w.as_strided((self.k, self.n), (self.rs, self.cs), self.offset).to(torch.float32)
        pad = -self.n % PACKED_PANEL
        b = torch.nn.functional.pad(b, (0, pad))
        return b.reshape(self.k, -1, PACKED_PANEL).permute(1, 0, 2).contiguous()


PACKED_GEMM_C = kernel_source("packed_gemm.c")
# eq_act's cases and the epilogue's loops, one per activation of the table
PACKED_GEMM_C = PACKED_GEMM_C.replace("/*EQ_ACT_CASES*/", "\n".join(
    f"    case {a.code}: return {a.c_expr};" for a in OP_ACTIVATIONS.values())).replace(
    "/*EQ_ACT_LOOPS*/", "\n".join(
        f"        case {a.code}: EQ_ACT_LOOP({a.code}) break;" for a in OP_ACTIVATIONS.values()))
PACKED_GEMM_H, PACKED_GEMM_C = library_text("packed_gemm", PACKED_GEMM_C)
PACKED_GEMM = StaticLibrary("packed_gemm", PACKED_GEMM_C, (
    "eq_gemm_packed", "eq_gemm_packed_rope", "eq_gemm_packed_swiglu", "eq_panel", "eq_tiled",
    "eq_grow"), header=PACKED_GEMM_H)
