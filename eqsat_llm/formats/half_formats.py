"""Half-precision weight formats of the gemm op (ops/gemm.py): a weight's values held unchanged in
float16 or bfloat16 (rules/half_weights.py makes them; the graph pass is half.py)."""

from __future__ import annotations

__all__ = ["FORMAT_OF", "WEIGHT_FORMATS"]

# gemm weight format -> the dtype that holds the weight's values
WEIGHT_FORMATS = {"fp16": "float16", "bf16": "bfloat16"}
FORMAT_OF = {dt: fmt for fmt, dt in WEIGHT_FORMATS.items()}
