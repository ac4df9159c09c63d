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

from ..errors import EqsatError
from ..ops import evaluate

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
                args_of: Callable[[Recipe], list[Any]] | None = None,
                quantized_of: Callable[[Recipe], tuple[torch.Tensor, torch.Tensor]] | None
                = None) -> Any:
    """The values of `t`: itself unless on the meta device; a folded meta value by its recipe
    (its arguments' values from `args_of`, default made here; a quantized weight's integers
    and scales from `quantized_of` where given); a meta parameter (a WeightRef, or `name`)
    from `source`, checked against its shape and converted to its dtype."""
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
    if quantized_of is not None and recipe.op in WIDEN_INSIDE:
        return quantized_of(recipe)[WIDEN_INSIDE.index(recipe.op)]
    args = args_of(recipe) if args_of else [materialize(a, source) for a in inputs_of(recipe)]
    with torch.no_grad():
        if recipe.op == "cat" and _all_transposed(args):
            # transposed weights (q, k, v: nn.Linear's [N, K] as [K, N]) joined untransposed
            # and viewed back: no transposing copy, and quantize reads each column's K
            # values contiguous (codegen/c/quantizer.py); the same values
            return torch.cat([a.t() for a in args], 1 - recipe.attrs["dim"] % 2).t()
        return evaluate(recipe.op, args, recipe.attrs)


# a transposed source weight with more elements than this is quantized a slice of its rows at
# a time (LazyConstants._quantized_part): 16 MB of bf16 in flight, not the whole weight
SLICE_ELEMENTS = 1 << 23


def _transposed_weight(t: Any) -> WeightRef | None:
    """The source weight W where `t` is W transposed (an nn.Linear weight as x @ W.T reads
    it), else None."""
    recipe = recipe_of(t) if isinstance(t, torch.Tensor) and t.is_meta else None
    if recipe is None or not isinstance(recipe.args[0], WeightRef) or \
            recipe.args[0].meta.dim() != 2:
        return None
    if recipe.op == "permute" and [d % 2 for d in recipe.attrs["dims"]] == [1, 0]:
        return recipe.args[0]
    if recipe.op == "transpose" and {recipe.attrs["dim0"] % 2, recipe.attrs["dim1"] % 2} == \
            {0, 1}:
        return recipe.args[0]
    return None


def _all_transposed(args: list[Any]) -> bool:
    return all(isinstance(a, torch.Tensor) and a.dim() == 2 and a.t().is_contiguous() and
               not a.is_contiguous() for a in args)


# ops that widen their float argument to float32 themselves, some columns at a time
# (quant_formats.quantize): a widening to_dtype under layout ops before them is skipped, so a
# half checkpoint's weight is quantized without being held whole in float32 (exact: the
# widening is the same wherever it runs). Their results, in this order: quantize's pair.
WIDEN_INSIDE = ("quantize_weight", "weight_scales")
_LAYOUT = ("permute", "transpose", "view", "cat")


def inputs_of(recipe: Recipe) -> list[Any]:
    """What a recipe's op is run on: its arguments, narrowed for an op that widens them
    itself, and for a narrowing back to the half dtype they were widened from (a bf16
    weight's packed bf16 form: its layout ops run on the bf16 values, never widened, exact)."""
    if recipe.op in WIDEN_INSIDE:
        return [narrowed(a) for a in recipe.args]
    if recipe.op == "to_dtype" and recipe.attrs["dtype"] in ("bfloat16", "float16"):
        arg = narrowed(recipe.args[0])
        meta = arg.meta if isinstance(arg, WeightRef) else arg
        if isinstance(meta, torch.Tensor) and str(meta.dtype) == f"torch.{recipe.attrs['dtype']}":
            return [arg]
    return list(recipe.args)


def narrowed(t: Any) -> Any:
    """`t` with its widening of a half weight to float32 moved past its layout ops and
    dropped (a meta tensor of the half dtype with the rest of the recipe); `t` itself when
    there is none."""
    out = _narrowed(t)
    return t if out is None else out


def _narrowed(t: Any) -> Any:
    recipe = recipe_of(t) if isinstance(t, torch.Tensor) and t.is_meta else None
    if recipe is None:
        return None
    if recipe.op == "to_dtype" and t.dtype == torch.float32:
        src = recipe.args[0]
        meta = src.meta if isinstance(src, WeightRef) else src
        return src if isinstance(meta, torch.Tensor) and meta.dtype in (
            torch.bfloat16, torch.float16) else None
    if recipe.op not in _LAYOUT:
        return None
    tensors = [a for a in recipe.args if isinstance(a, torch.Tensor | WeightRef)]
    inner = [_narrowed(a) for a in tensors]
    dtypes = {(a.meta if isinstance(a, WeightRef) else a).dtype for a in inner if a is not None}
    if None in inner or len(dtypes) != 1:
        return None
    swap = dict(zip(map(id, tensors), inner))
    args = [swap.get(id(a), a) for a in recipe.args]
    return with_recipe(torch.empty(t.shape, dtype=dtypes.pop(), device="meta"), recipe.op,
                       recipe.attrs, args)


def source_names(constants: Mapping[str, Any]) -> set[str]:
    """The names a weight source is asked for when these constants are loaded: each meta
    constant without a recipe, and the weights the recipes are made from."""
    names: set[str] = set()

    def walk(t: Any, name: str | None) -> None:
        if isinstance(t, WeightRef):
            name, t = t.name, t.meta
        if not isinstance(t, torch.Tensor) or not t.is_meta:
            return
        recipe = recipe_of(t)
        if recipe is None:
            if name is not None:
                names.add(name)
            return
        for a in recipe.args:
            walk(a, None)
    for name, t in constants.items():
        walk(t, name)
    return names


def recipe_key(t: Any, name: str | None = None) -> Hashable | None:
    """What `t` is made of, as a value equal for equal recipes in any program: the ops, their
    attributes and the source's weights by name, down to the leaves (nested cats along one
    dim flattened: the programs merge q, k and v in either order). None where a real tensor
    of some size takes part (compared by identity only, so not shared)."""
    if isinstance(t, WeightRef):
        name, t = t.name, t.meta
    if not isinstance(t, torch.Tensor):
        return ("value", type(t).__name__, _frozen(t))
    if not t.is_meta:
        if t.numel() > 64:
            return None
        return ("tensor", str(t.dtype), tuple(t.shape), tuple(t.reshape(-1).tolist()))
    recipe = recipe_of(t)
    if recipe is None:
        return None if name is None else ("weight", name, str(t.dtype), tuple(t.shape))
    if recipe.op == "cat":
        dim = recipe.attrs["dim"] % t.dim()
        keys = tuple(recipe_key(a) for a in _cat_parts(t, dim))
        return None if None in keys else ("cat", dim, keys)
    keys = tuple(recipe_key(a) for a in recipe.args)
    return None if None in keys else (recipe.op, _frozen(recipe.attrs), keys)


def _cat_parts(t: torch.Tensor, dim: int) -> list[Any]:
    """The parts of the cat `t` along `dim` (normalised), nested cats along it flattened."""
    parts = []
    for a in recipe_of(t).args:  # type: ignore[union-attr]
        inner = recipe_of(a) if isinstance(a, torch.Tensor) else None
        if inner is not None and inner.op == "cat" and inner.attrs["dim"] % a.dim() == dim:
            parts.extend(_cat_parts(a, dim))
        else:
            parts.append(a)
    return parts


# ops whose result's columns (last dim) are made from the same columns of their first
# argument alone: quantize_weight and weight_scales work per output channel or per group
# along K, to_dtype per element
COLUMN_WISE = ("quantize_weight", "weight_scales", "to_dtype")


def columns_key(t: Any, start: int, width: int, name: str | None = None) -> Hashable | None:
    """recipe_key of the columns [start, start + width) of `t`: a SwiGLU weight's gate half
    (columns of quantize_weight(cat(gate, up))) is the key of the gate weight's own
    quantize_weight, so a program that prepares the halves apart shares them."""
    meta = t.meta if isinstance(t, WeightRef) else t
    if not isinstance(meta, torch.Tensor) or meta.dim() == 0:
        return None
    if start == 0 and width == meta.shape[-1]:
        return recipe_key(t, name)
    recipe = recipe_of(meta) if meta.is_meta else None
    if recipe is not None and recipe.op in COLUMN_WISE and len(recipe.args) == 1:
        inner = columns_key(recipe.args[0], start, width)
        return None if inner is None else (recipe.op, _frozen(recipe.attrs), (inner,))
    if recipe is not None and recipe.op == "cat" and recipe.attrs["dim"] % meta.dim() == \
            meta.dim() - 1:
        first = 0
        for part in _cat_parts(meta, meta.dim() - 1):
            cols = (part.meta if isinstance(part, WeightRef) else part).shape[-1]
            if first <= start and start + width <= first + cols:
                return columns_key(part, start - first, width)
            first += cols
    key = recipe_key(t, name)
    return None if key is None else ("columns", key, start, width)


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
# from the same source (a Generator's decode step beside its prefill) takes the first's
# prepared tensors instead of making them again. Key -> (weak reference to the tensor, the
# rows of it that are the entry: a half of a SwiGLU weight's panels); an entry goes with its
# source or its tensor.
_SHARED: weakref.WeakKeyDictionary[Any, dict[Hashable, tuple[weakref.ref, slice | None]]] = \
    weakref.WeakKeyDictionary()


class LazyConstants(Mapping[str, torch.Tensor]):
    """`constants` with every meta tensor made on access (`materialize`), not cached, except
    for the last recipe's arguments or quantized pair (a weight's integers and scales are two
    recipes of the same weight, asked one after the other). `release()` drops those once loading is
    done."""

    def __init__(self, constants: Mapping[str, torch.Tensor], source: WeightSource):
        self._constants = constants
        self._source = source
        self._last_args: tuple[Hashable, list[Any]] | None = None
        self._last_pair: tuple[Hashable, tuple[torch.Tensor, torch.Tensor]] | None = None
        try:
            self._shared = _SHARED.setdefault(source, {})
        except TypeError:  # a source that takes no weak reference: nothing shared
            self._shared = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._made(self._constants[name], name)

    def _made(self, t: Any, name: str | None = None) -> Any:
        return materialize(t, self._source, name, self._args, self._quantized)

    def _args(self, recipe: Recipe) -> list[Any]:
        inputs = inputs_of(recipe)  # (keyed as run: narrowed or not)
        key = tuple(recipe_key(a) for a in inputs)
        if self._last_args is not None and None not in key and self._last_args[0] == key:
            return self._last_args[1]
        values = [self._made(a) for a in inputs]
        self._last_args = (key, values)
        return values

    def _quantized(self, recipe: Recipe) -> tuple[torch.Tensor, torch.Tensor]:
        """quantize's (integers, scales) of a quantize_weight / weight_scales recipe's
        weight, kept for the other of the pair. A weight merged along its columns (q, k and
        v; gate and up) is quantized part by part and the results joined: columns quantize
        alone, so the values are the same, and no merged copy of the float weight is made."""
        (w,) = inputs_of(recipe)
        fmt = recipe.attrs["fmt"]
        key = ("quantized", recipe_key(w), fmt)
        if self._last_pair is not None and key[1] is not None and self._last_pair[0] == key:
            return self._last_pair[1]
        meta = w.meta if isinstance(w, WeightRef) else w
        cat = recipe_of(meta) if isinstance(meta, torch.Tensor) and meta.is_meta else None
        parts = _cat_parts(meta, 1) if cat is not None and cat.op == "cat" and \
            meta.dim() == 2 and cat.attrs["dim"] % 2 == 1 else [w]
        with torch.no_grad():
            pairs = [pair for p in parts for pair in self._quantized_part(p, fmt)]
        made = pairs[0] if len(pairs) == 1 else \
            (torch.cat([q for q, _ in pairs], -1), torch.cat([s for _, s in pairs], -1))
        self._last_pair = (key, made)
        return made

    def _quantized_part(self, part: Any, fmt: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """quantize's pairs for `part`'s columns: one, or for a large transposed weight of a
        source that reads rows apart (a checkpoint), one per slice of its rows, so that its
        float bytes are never in memory whole (a 7B model's LM head: 0.26 GB of bf16). A
        transposed weight the source holds in the format already (an FP8 checkpoint's, for
        fp8_e4m3_g128: `as_format`) is taken as stored, not rounded again."""
        from ..formats.quant_formats import quantize

        ref = _transposed_weight(part)
        stored_as = getattr(self._source, "as_format", None)  # a checkpoint's float8 bytes
        if ref is not None and stored_as is not None and \
                (pair := stored_as(ref.name, fmt)) is not None:
            return [pair]
        rows_of = getattr(self._source, "rows", None)
        if ref is None or rows_of is None or ref.meta.numel() <= SLICE_ELEMENTS:
            return [quantize(self._made(part), fmt)]
        n, k = ref.meta.shape
        step = max(1, SLICE_ELEMENTS // k)
        pairs = []
        for start in range(0, n, step):
            rows = rows_of(ref.name, start, min(n, start + step))
            if rows is None:  # (not a stored weight: made whole)
                return [quantize(self._made(part), fmt)]
            if tuple(rows.shape) != (min(n, start + step) - start, k):
                raise EqsatError(f"weight {ref.name}: the source's rows {start}: have shape "
                                 f"{list(rows.shape)}, the model's weight {[n, k]}")
            pairs.append(quantize(rows.to(ref.meta.dtype).t(), fmt))
        return pairs

    def narrowed(self, name: str) -> torch.Tensor:
        """The constant `name` with its widening of a half weight dropped (`narrowed`): a
        half checkpoint's table in its own dtype, never widened whole."""
        return self._made(narrowed(self._constants[name]), name)

    def key(self, name: str) -> Hashable | None:
        """recipe_key of the constant `name` (None: not made from the source alone)."""
        t = self._constants[name]
        return recipe_key(t, name) if isinstance(t, torch.Tensor) and t.is_meta else None

    def view_key(self, name: str, offset: int, rows: int, cols: int, rs: int
                 ) -> Hashable | None:
        """The key of the [rows, cols] view (row stride rs, unit columns) at `offset` of the
        constant `name`: columns_key when it is whole rows of a matrix (or part of a
        vector), else the constant's key with the view's geometry."""
        t = self._constants[name]
        if not isinstance(t, torch.Tensor) or not t.is_meta:
            return None
        whole_rows = (t.dim() == 2 and rows == t.shape[0] and rs == t.shape[1]) or \
            (t.dim() == 1 and rows == 1)
        if whole_rows and offset + cols <= t.shape[-1]:
            return columns_key(t, offset, cols, name)
        key = recipe_key(t, name)
        return None if key is None else ("view", key, offset, rows, cols, rs)

    def column_parts(self, name: str, offset: int, rows: int, cols: int, rs: int
                     ) -> list[tuple[int, int]]:
        """The (start, width) of each part of a cat along the last dim (under column-wise
        ops) inside the view's columns, relative to them: the merged q, k and v projections
        whose panels another program reads one by one. [] when the view is not whole rows
        of such a cat."""
        t = self._constants[name]
        if not isinstance(t, torch.Tensor) or not t.is_meta or not (
                (t.dim() == 2 and rows == t.shape[0] and rs == t.shape[1]) or
                (t.dim() == 1 and rows == 1)):
            return []
        while (recipe := recipe_of(t)) is not None and recipe.op in COLUMN_WISE and \
                isinstance(recipe.args[0], torch.Tensor) and recipe.args[0].is_meta:
            t = recipe.args[0]
        recipe = recipe_of(t)
        if recipe is None or recipe.op != "cat" or recipe.attrs["dim"] % t.dim() != t.dim() - 1:
            return []
        parts, first = [], 0
        for part in _cat_parts(t, t.dim() - 1):
            width = (part.meta if isinstance(part, WeightRef) else part).shape[-1]
            if offset <= first and first + width <= offset + cols:
                parts.append((first - offset, width))
            first += width
        return parts

    def source_columns(self, name: str, offset: int, rows: int, cols: int, rs: int
                       ) -> list[tuple[int, torch.Tensor]] | None:
        """The view's columns as the source stores them, where the constant `name` is float32
        made of nothing but transposed source weights joined along its columns (a merged q, k
        and v from a checkpoint) and the view is whole rows of whole parts of it: (first
        column in the view, the source's [width, rows] tensor, float32 or bf16) per part, to
        be widened and laid out in one pass (codegen/c/packer.py). None otherwise."""
        t = self._constants[name]
        if not isinstance(t, torch.Tensor) or not t.is_meta or t.dim() != 2 or \
                t.dtype != torch.float32 or rows != t.shape[0] or rs != t.shape[1]:
            return None
        t = narrowed(t)
        recipe = recipe_of(t)
        parts = _cat_parts(t, 1) if recipe is not None and recipe.op == "cat" and \
            recipe.attrs["dim"] % 2 == 1 else [t]
        inside, first = [], 0  # (first column in the view, the part's source weight)
        for part in parts:
            ref = _transposed_weight(part)
            if ref is None:
                return None
            width = ref.meta.shape[0]
            if offset <= first and first + width <= offset + cols:
                inside.append((first - offset, ref))
            elif first < offset + cols and offset < first + width:
                return None  # the view cuts this part
            first += width
        if sum(ref.meta.shape[0] for _, ref in inside) != cols:
            return None
        out = []  # (the geometry checked first: nothing read for a view that does not fit)
        for at, ref in inside:
            stored = self._source(ref.name)
            if tuple(stored.shape) != tuple(ref.meta.shape) or stored.dtype not in (
                    torch.float32, torch.bfloat16):
                return None  # (materialize then names the mismatch)
            out.append((at, stored))
        return out

    def shared(self, key: Hashable | None, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The prepared tensor made for `key` by an earlier program from this source, else
        `make()` (remembered for the next)."""
        found = self.lookup(key)
        if found is None:
            found = make()
            self.remember(key, found)
        return found

    def lookup(self, key: Hashable | None) -> torch.Tensor | None:
        ref, rows = self._shared.get(key, (None, None)) if key is not None else (None, None)
        base = ref() if ref is not None else None
        return base if base is None or rows is None else base[rows]

    def remember(self, key: Hashable | None, t: torch.Tensor, rows: slice | None = None
                 ) -> None:
        """`t` (or its `rows`: a part another program prepares alone) is what `key` makes."""
        if key is not None:
            self._shared[key] = (weakref.ref(t), rows)

    def release(self) -> None:
        self._last_args = self._last_pair = None

    def __iter__(self) -> Iterator[str]:
        return iter(self._constants)

    def __len__(self) -> int:
        return len(self._constants)
