"""Weights loaded after optimizing: a meta constant carries how to make it, and a program's
prepared weights are made one at a time from a weight source.

A model whose parameters are on the meta device optimizes and plans as usual (meta.py); folding
then gives each constant it computes from a meta weight (a transposed, merged, widened or
quantized weight) a recipe: the op, its attributes and its arguments (other meta tensors or
plain values). `LazyConstants` is the graph's constants as a read-only mapping in which a meta
tensor is made on access, from `source(name)` for a parameter and by running the recipe for a
folded one, and not kept: the backend packs it into the form its kernel reads and drops it, so
loading holds the prepared weights plus one weight's intermediates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .errors import EqsatError
from .ops import evaluate

WeightSource = Callable[[str], torch.Tensor]  # a graph constant's name -> its values


@dataclass(frozen=True)
class WeightRef:
    """A meta constant of the graph as it was captured (a parameter), by name."""
    name: str
    meta: torch.Tensor


@dataclass(frozen=True)
class Recipe:
    op: str
    attrs: dict[str, Any]
    args: tuple[Any, ...]  # WeightRefs, folded meta tensors (with recipes), plain values


_RECIPE = "_eqsat_recipe"


def with_recipe(meta: torch.Tensor, op: str, attrs: dict[str, Any], args: list[Any]
                ) -> torch.Tensor:
    """`meta` (a fresh meta tensor of the folded value's type), told how to make its values."""
    setattr(meta, _RECIPE, Recipe(op, dict(attrs), tuple(args)))
    return meta


def recipe_of(t: torch.Tensor) -> Recipe | None:
    return getattr(t, _RECIPE, None)


def materialize(t: Any, source: WeightSource, name: str | None = None) -> Any:
    """The values of `t`: itself unless on the meta device; a folded meta value by its recipe;
    a meta parameter (a WeightRef, or `name`) from `source`, checked against its shape and
    converted to its dtype."""
    if isinstance(t, WeightRef):
        name, t = t.name, t.meta
    if not isinstance(t, torch.Tensor) or not t.is_meta:
        return t
    recipe = recipe_of(t)
    if recipe is None:
        if name is None:
            raise EqsatError("a meta constant without a name or a recipe cannot be loaded")
        value = source(name)
        if tuple(value.shape) != tuple(t.shape):
            raise EqsatError(f"weight {name}: the source has shape {list(value.shape)}, the "
                             f"model {list(t.shape)}")
        return value if value.dtype == t.dtype else value.to(t.dtype)
    with torch.no_grad():
        return evaluate(recipe.op, [materialize(a, source) for a in recipe.args], recipe.attrs)


class LazyConstants(Mapping[str, torch.Tensor]):
    """`constants` with every meta tensor made on access (`materialize`), never cached."""

    def __init__(self, constants: Mapping[str, torch.Tensor], source: WeightSource):
        self._constants = constants
        self._source = source

    def __getitem__(self, name: str) -> torch.Tensor:
        return materialize(self._constants[name], self._source, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._constants)

    def __len__(self) -> int:
        return len(self._constants)
