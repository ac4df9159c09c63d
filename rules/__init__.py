"""The rule library, one module per family (installed as `eqsat_llm.rules`).

Importing this package registers every family with `eqsat_llm.rulebook`."""

from . import algebra, fusion, half_weights, layout, quantize, sparsity

__all__ = ["algebra", "fusion", "half_weights", "layout", "quantize", "sparsity"]
