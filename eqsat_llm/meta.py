"""Models built on the meta device: optimized and planned, never run.

A model built on torch's meta device (`with torch.device("meta"): model = ...`, or
transformers' `from_config` under accelerate's `init_empty_weights`) has the shapes and dtypes
of its weights but no storage: a 7B model's graph costs kilobytes. Every phase up to the memory
plan needs only shapes, so `optimize()` runs them all (capture, encode, saturate, extract,
decode, fold, plan) and returns a `Compiled` whose report and plan are complete. Folding makes
a meta tensor of the right type for every value computed from a meta weight (a merged QKV
weight, a quantized one), so the plan and the prepared-constant bytes are those of the real
model. Code generation needs the values (weights are packed into panels, copied into the
program), so none is generated: calling the program, or asking for its source, raises an
`EqsatError` that says so. Reading the weights' values is skipped where it is optional (which
weights fit half precision exactly) and refused where the result depends on it
(`sparsity="auto"`).
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import EqsatError
from .ir import Graph


def meta_constants(graph: Graph) -> list[str]:
    """The names of the graph's constants (weights, buffers, folded values) on the meta
    device, the model's own names first (an error message shows a few)."""
    names = [name for name, t in graph.constants.items()
             if isinstance(t, torch.Tensor) and t.is_meta]
    return sorted(names, key=lambda name: name.startswith("folded."))


def meta_error(names: list[str], what: str = "run") -> EqsatError:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return EqsatError(
        f"cannot {what} this program: its weights are on the meta device ({shown}); it was "
        "optimized and planned only (compiled.report, compiled.plan). Load the weights "
        "(e.g. model.to_empty(device='cpu') and load_state_dict) and optimize again to run it")


def refuse_sparsity(graph: Graph) -> None:
    """sparsity="auto" reads which weights are zero: a meta weight has no values to read, and
    planning it as dense would silently differ from what the real weights give."""
    names = meta_constants(graph)
    if names:
        raise EqsatError("sparsity='auto' reads the weights' zeros, but the weights are on the "
                         f"meta device ({names[0]}, ...): load them first, or drop sparsity=")


class MetaRuntime:
    """Stands in for a backend's runtime when the weights are on the meta device: there is
    nothing to run, and every call says why."""

    def __init__(self, names: list[str]):
        self.names = names
        self.copy_in_ops: list[str] = []  # what the report reads off a runtime: none
        self.torch_steps: list[Any] = []

    def run(self, inputs: list[Any]) -> list[Any]:
        raise meta_error(self.names)
