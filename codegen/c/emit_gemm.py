"""The gemm op's kernels: one emitter family, chosen by the op's descriptor (ops/gemm.py).

    float weight, no prologue     emit_matmul.emit_product: packed/BLAS/row-streaming GEMM, the
                                  residual, bias and activation in the tile epilogue
    float weight, rms_norm        emit_norm_matmul: 1/rms per row as the packed GEMM's row
                                  scale, the norm weight folded into the packed weight
    float weight, swiglu          emit_matmul_swiglu: gate and up tiles joined as stored
    quantized or sparse weight    emit_format_gemm: dequantized in registers, or its zeros
                                  skipped (any prologue, epilogue and activation)

Each emitter takes the descriptor (the op's attributes), the output, the op's inputs
[x, w, w_scale, norm, addend], the product's geometry (gemm_geometry.py) and the layout, then
what it can use: BLAS, ropes to compute in the epilogue (fuse_rope.py). A descriptor none of
them generates (an activation after the SwiGLU, say) runs as a torch step on the arena:
correct, only slower."""

from __future__ import annotations

from ...ir import Node
from ...ops import GemmDescriptor, operands_of
from .emit_format_gemm import emit_format_gemm
from .emit_matmul import emit_product
from .emit_matmul_swiglu import emit_matmul_swiglu
from .emit_norm_matmul import emit_rms_norm_matmul
from .fuse_rope import RopeEpilogue
from .gemm_geometry import gemm_geometry
from .values import Layout, Ref


def emit_gemm(node: Node, out: Ref, ins: list[Ref], blas: bool, layout: Layout,
              ropes: tuple[RopeEpilogue, ...] = ()) -> str | None:
    d = GemmDescriptor.of(node.attrs)
    g = operands_of("gemm", ins)
    x, w, addend = g.x, g.w, g.addend
    # a weight in a format is no strided matrix (and its kernel checks the addend's rows once
    # the weight's panels are prepared); a float weight's residual is walked with C's rows
    geo = gemm_geometry(out, x, None if d.stored else w,
                        addend if d.epilogue == "add" and not d.stored else None)
    if geo is None:
        return None
    if d.stored:
        return None if ropes else emit_format_gemm(d, out, ins, geo, layout)
    if d.normed:
        return emit_rms_norm_matmul(d, out, ins, geo, layout, ropes)
    if d.swiglu:
        return None if ropes else emit_matmul_swiglu(d, out, ins, geo, layout)
    return emit_product(d, out, ins, geo, layout, blas, ropes)
