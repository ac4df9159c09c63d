"""The op registry: every op of the IR is declared here, once, with everything each stage
reads from it (registry.py says what a declaration holds). One module per family; importing
the package registers them all, in this order (the e-graph's constructors follow it).

Adding an op: docs/design.md, "Adding an op"."""
# ruff: noqa: I001  (the imports below register the ops: their order is the registry's)

from __future__ import annotations

from . import sources, layout, matmul  # noqa: F401
from .activations import ACTIVATIONS, Activation
from .elementwise import COMPARISONS, weak_scalar_dtype
from .matmul import MATMUL_OPS
from .attention import kv_group
from . import reductions, gathers, attention, fused  # noqa: F401
from .gemm import (
    GEMM_ACTS,
    GEMM_DEFAULTS,
    GemmDescriptor,
    GEMM_EPILOGUES,
    GEMM_PROLOGUES,
    GEMM_WEIGHTS,
    add_gemm,
    gemm_label,
    gemm_writes_in_place,
)
from . import formats, experts  # noqa: F401
from .registry import (
    ATTR_KINDS,
    COPY_IN,
    COST_KINDS,
    EXP_FLOPS,
    REGISTRY,
    WEAK_DTYPES,
    OpDef,
    Part,
    Writer,
    evaluate,
    get_op,
    leaf_type,
    operands_of,
    ops_where,
    register,
    typed_number,
)

# An op outside the registry, run by torch as captured. attrs: "target" (the op's name, for
# reports and the e-graph), "key" (the node's identity in the e-graph), and "fn"/"template"
# (the callable and its argument structure; not encoded).
register("fallback", None, "target:str key:int", category="fallback", shape="given",
         dtype="given", cost="fallback", writer=COPY_IN, infer=leaf_type)

LEAF_OPS = frozenset({"input", "param", "const"})

__all__ = [
    "ACTIVATIONS",
    "ATTR_KINDS",
    "COMPARISONS",
    "COPY_IN",
    "COST_KINDS",
    "EXP_FLOPS",
    "GEMM_ACTS",
    "GEMM_DEFAULTS",
    "GEMM_EPILOGUES",
    "GEMM_PROLOGUES",
    "GEMM_WEIGHTS",
    "LEAF_OPS",
    "MATMUL_OPS",
    "REGISTRY",
    "WEAK_DTYPES",
    "Activation",
    "GemmDescriptor",
    "OpDef",
    "Part",
    "Writer",
    "add_gemm",
    "evaluate",
    "gemm_label",
    "gemm_writes_in_place",
    "get_op",
    "kv_group",
    "operands_of",
    "ops_where",
    "register",
    "typed_number",
    "weak_scalar_dtype",
]
