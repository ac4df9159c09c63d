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

import weakref
from collections.abc import Callable, Hashable, Iterator, Mapping
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


def materialize(t: Any, source: WeightSource, name: str | None = None,
                args_of: Callable[[Recipe], list[Any]] | None = None) -> Any:
    """The values of `t`: itself unless on the meta device; a folded meta value by its recipe
    (its arguments' values from `args_of`, default made here); a meta parameter (a WeightRef,
    or `name`) from `source`, checked against its shape and converted to its dtype."""
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
    args = args_of(recipe) if args_of else [materialize(a, source) for a in recipe.args]
    with torch.no_grad():
        return evaluate(recipe.op, args, recipe.attrs)


def recipe_key(t: Any, name: str | None = None) -> Hashable | None:
    """What `t` is made of, as a value equal for equal recipes in any program: the ops, their
    attributes and the source's weights by name, down to the leaves. None where a real
    tensor of some size takes part (compared by identity only, so not shared)."""
    if isinstance(t, WeightRef):
        name, t = t.name, t.meta
    if isinstance(t, torch.Tensor):
        if not t.is_meta:
            if t.numel() > 64:
                return None
            return ("tensor", str(t.dtype), tuple(t.shape), tuple(t.reshape(-1).tolist()))
        recipe = recipe_of(t)
        if recipe is None:
            return None if name is None else ("weight", name, str(t.dtype), tuple(t.shape))
        keys = tuple(recipe_key(a) for a in recipe.args)
        if None in keys:
            return None
        return (recipe.op, _frozen(recipe.attrs), keys)
    return ("value", type(t).__name__, _frozen(t))


def _frozen(v: Any) -> Hashable:
    if isinstance(v, dict):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    if isinstance(v, list | tuple):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, torch.dtype | torch.device):
        return str(v)
    hash(v)  # a TypeError here: an attribute kind this key does not know yet
    return v


# Prepared weights by what they are made of, per weight source: a second program loaded
# from the same source (a Generator's prefill beside its decode step) takes the first's
# prepared tensors instead of making them again. Weak on both sides: an entry goes with its
# source or its tensor.
_SHARED: weakref.WeakKeyDictionary[Any, weakref.WeakValueDictionary[Hashable, torch.Tensor]] = \
    weakref.WeakKeyDictionary()


class LazyConstants(Mapping[str, torch.Tensor]):
    """`constants` with every meta tensor made on access (`materialize`), not cached, except
    for the last recipe's arguments (a weight's integers and scales are two recipes of the
    same arguments, asked one after the other). `release()` drops those once loading is
    done."""

    def __init__(self, constants: Mapping[str, torch.Tensor], source: WeightSource):
        self._constants = constants
        self._source = source
        self._last_args: tuple[Hashable, list[Any]] | None = None
        try:
            self._shared = _SHARED.setdefault(source, weakref.WeakValueDictionary())
        except TypeError:  # a source that takes no weak reference: nothing shared
            self._shared = weakref.WeakValueDictionary()

    def __getitem__(self, name: str) -> torch.Tensor:
        return materialize(self._constants[name], self._source, name, self._args)

    def _args(self, recipe: Recipe) -> list[Any]:
        key = tuple(recipe_key(a) for a in recipe.args)
        if self._last_args is not None and None not in key and self._last_args[0] == key:
            return self._last_args[1]
        values = [materialize(a, self._source, None, self._args) for a in recipe.args]
        self._last_args = (key, values)
        return values

    def key(self, name: str) -> Hashable | None:
        """recipe_key of the constant `name` (None: not made from the source alone)."""
        t = self._constants[name]
        return recipe_key(t, name) if isinstance(t, torch.Tensor) and t.is_meta else None

    def shared(self, key: Hashable | None, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The prepared tensor made for `key` by an earlier program from this source, else
        `make()` (remembered for the next)."""
        if key is None:
            return make()
        t = self._shared.get(key)
        if t is None:
            t = make()
            self._shared[key] = t
        return t

    def release(self) -> None:
        self._last_args = None

    def __iter__(self) -> Iterator[str]:
        return iter(self._constants)

    def __len__(self) -> int:
        return len(self._constants)
