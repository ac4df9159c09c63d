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

import contextlib
import copy
import warnings
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

from ..errors import EqsatError
from ..ir import Graph


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


def suffixes(name: str) -> list[str]:
    """A graph constant's name and its dotted tails, longest first: the captured graph names
    a parameter by its path under whatever wraps the model (a Generator's CachedStep), so a
    weight source looks each up until one is the model's own name."""
    parts = name.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


def meta_twin(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters and buffers are on the meta device (nothing of
    theirs copied): planned in place of a loaded model, its folded and prepared constants are
    recipes, made once each from the model's own tensors (ParameterSource) at load,
    instead of being computed, interned and packed beside them (docs/memory.md)."""
    memo: dict[int, Any] = {}
    for t in (*model.parameters(), *model.buffers()):
        twin = t.detach().to("meta")
        memo[id(t)] = nn.Parameter(twin, t.requires_grad) if isinstance(t, nn.Parameter) \
            else twin
    with warnings.catch_warnings():  # (torch's pytree specs warn when deep-copied)
        warnings.simplefilter("ignore", FutureWarning)
        return copy.deepcopy(model, memo)


class ParameterSource:
    """Graph constant name -> the loaded model's own parameter or buffer of that name (tied
    names give the one tensor): the weight source of a meta twin's programs."""

    def __init__(self, model: nn.Module):
        self._own = {**dict(model.named_buffers(remove_duplicate=False)),
                     **dict(model.named_parameters(remove_duplicate=False))}

    def lookup(self, name: str) -> torch.Tensor | None:
        return next((self._own[s].detach() for s in suffixes(name) if s in self._own), None)

    def missing(self, names: Iterable[str]) -> list[str]:
        """Those of `names` the model does not hold: a constant the model makes as it runs
        (a tensor created in forward, lifted by export), whose values its meta twin lost."""
        return sorted(n for n in names if self.lookup(n) is None)

    def __call__(self, name: str) -> torch.Tensor:
        t = self.lookup(name)
        if t is None:
            raise EqsatError(f"weight {name}: no parameter or buffer of the model has that "
                             "name")
        return t


def plans_on_meta(model: nn.Module) -> bool:
    """Whether a loaded model can be planned on its meta twin with nothing lost: its tensors
    are all on the CPU. (Which float32 weights fit a half dtype exactly, which the planner can
    tell only from the values, is read off the loaded model first: exact_half_of.)"""
    tensors = [*model.parameters(), *model.buffers()]
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


_EXACT_HALF: ContextVar[dict[str, list[str]] | None] = ContextVar("eqsat_exact_half",
                                                                  default=None)


@contextlib.contextmanager
def exact_half_of(model: nn.Module) -> Iterator[None]:
    """While `model`'s meta twin is planned: which half dtypes hold each of its parameters
    exactly (a half checkpoint loaded as float32), read off the loaded values, for the
    encoder to tell of the twin's weights (half_dtypes): the planner then keeps them half as
    it would on the loaded model itself."""
    from ..formats.half import exact_half_dtypes

    token = _EXACT_HALF.set({name: exact_half_dtypes(p) for name, p in
                             model.named_parameters(remove_duplicate=False)})
    try:
        yield
    finally:
        _EXACT_HALF.reset(token)


def exact_half_weights() -> list[tuple[str, tuple[str, ...]]]:
    """The weights exact_half_of found to fit a half dtype, while it holds (what a meta
    twin's programs depend on beyond its shapes: the program cache's key has them)."""
    return sorted((n, tuple(d)) for n, d in (_EXACT_HALF.get() or {}).items() if d)


def half_dtypes(value: torch.Tensor, name: str) -> list[str]:
    """The half dtypes that hold the graph constant `value` (named `name`) exactly: read off
    its values, or for a meta twin's weight, and a folded recipe that only moves such weights
    (a transposed or merged one), from the table exact_half_of keeps (none outside it)."""
    from ..formats.half import exact_half_dtypes
    from ..ops import get_op
    from .lazy_weights import WeightRef, recipe_of

    if not value.is_meta or value.dtype in (torch.float16, torch.bfloat16):
        return exact_half_dtypes(value)  # (values read; a half one is half by its dtype)
    table = _EXACT_HALF.get()
    if table is None or value.dtype not in (torch.float32, torch.float64) or \
            value.dim() not in (2, 3):
        return []

    def fits(t: Any, tname: str | None) -> set[str]:
        recipe = recipe_of(t) if isinstance(t, torch.Tensor) else None
        if recipe is None:
            return set(next((table[s] for s in suffixes(tname) if s in table), [])) \
                if tname else set()
        # a layout op's values are its float sources' (views, cat, gathers by int indices);
        # scatter_value also writes a number of its own
        if get_op(recipe.op).category != "layout" or recipe.op == "scatter_value":
            return set()
        sources = [a for a in recipe.args if isinstance(a, WeightRef | torch.Tensor) and
                   (a.meta if isinstance(a, WeightRef) else a).is_floating_point()]
        found = [fits(a.meta, a.name) if isinstance(a, WeightRef) else fits(a, None)
                 for a in sources]
        return set.intersection(*found) if found else set()
    return sorted(fits(value, name))
