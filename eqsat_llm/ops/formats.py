"""A constant weight in a stored format, computed at compile time (constant folding): never a
kernel of the program, priced as folded."""

from __future__ import annotations

from ..formats import sparse_formats
from ..formats.quant_formats import quantize, quantized_types
from .registry import COPY_IN, register

# Quantized weights (optimize(quantize=...)): from a constant float weight [K, N], the integers
# and the scales of format `fmt`.
register("quantize_weight", 1, "fmt:str", ref=lambda xs, a: quantize(xs[0], a["fmt"])[0],
         category="quant", shape="quant_weight", dtype="quant_weight", cost="fold",
         writer=COPY_IN, infer=lambda ins, a: quantized_types(ins[0], a["fmt"])[0])
register("weight_scales", 1, "fmt:str", ref=lambda xs, a: quantize(xs[0], a["fmt"])[1],
         category="quant", shape="quant_scales", dtype="quant_scales", cost="fold",
         writer=COPY_IN, infer=lambda ins, a: quantized_types(ins[0], a["fmt"])[1])

# Sparse weights (optimize(sparsity="auto")): a constant float weight [K, N] with 2:4 or
# 16 x 16 block structure, as the stored values and their positions (formats/sparse_formats.py).
# `blocks`: the stored blocks of bsr16 (the encoder counts them), 0 for sparse24.
register("sparse_values", 1, "fmt:str blocks:int",
         ref=lambda xs, a: sparse_formats.pack(xs[0], a["fmt"])[0], category="quant",
         shape="sparse_values", dtype="same", cost="fold", writer=COPY_IN,
         infer=lambda ins, a: sparse_formats.packed_types(ins[0], a["fmt"], a["blocks"])[0])
register("sparse_index", 1, "fmt:str blocks:int",
         ref=lambda xs, a: sparse_formats.pack(xs[0], a["fmt"])[1], category="quant",
         shape="sparse_index", dtype="sparse_index", cost="fold", writer=COPY_IN,
         infer=lambda ins, a: sparse_formats.packed_types(ins[0], a["fmt"], a["blocks"])[1])
