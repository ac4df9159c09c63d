"""The fuzzer's model builder: a spec under construction, the values it has so far, and the draws
that extend it (hypothesis's in the fuzzer: a run is reproducible from its seed)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from .spec import DTYPES, OPS, Spec, Tensor

T = TypeVar("T")

MAX_NUMEL = 2048
DIMS = (1, 2, 3, 4, 5, 7, 8, 16, 17, 32)
FLOAT = "float32"
HALF = ("bfloat16", "float16")
EXACT_OPS = {"neg", "abs", "relu", "maximum", "minimum", "where", "masked_fill", "clamp",
             "to", "reshape", "permute", "transpose", "unsqueeze", "slice", "select", "chunk",
             "cat", "expand", "contiguous", "flatten", "tril", "triu", "embedding",
             "index_select", "gather", "gt", "lt", "ge", "le", "eq", "ne", "logical_and",
             "logical_or", "logical_not", "causal_mask", "topk", "index_copy_", "index_put_",
             "slice_assign_"}


class Draw(Protocol):
    def int(self, lo: int, hi: int) -> int: ...
    def choice(self, options: Sequence[T]) -> T: ...


class HypothesisDraw:
    """Draws from a hypothesis `st.data()` object."""

    def __init__(self, data: Any) -> None:
        from hypothesis import strategies as st
        self._data, self._st = data, st

    def int(self, lo: int, hi: int) -> int:
        return self._data.draw(self._st.integers(lo, hi))

    def choice(self, options: Sequence[T]) -> T:
        return options[self.int(0, len(options) - 1)]


@dataclass
class Value:
    ref: str
    shape: tuple[int, ...]
    dtype: str
    exact: bool
    special: bool = False  # may hold NaN or inf (read from an input that carries them)

    @property
    def is_float(self) -> bool:
        return DTYPES[self.dtype].is_floating_point

    @property
    def is_int(self) -> bool:
        return self.dtype in ("int64", "int32")


def _stand_in(v: Value) -> torch.Tensor:
    """A real tensor of v's shape and dtype: running a step on these checks what meta tensors
    do not (operand dtypes agree), and indices of zeros are in range."""
    return torch.zeros(v.shape, dtype=DTYPES[v.dtype])


class Builder:
    """A spec under construction and the values it has so far."""

    def __init__(self, draw: Draw, seed: int) -> None:
        self.draw = draw
        self.spec = Spec(seed=seed)
        self.values: list[Value] = []

    # --- values ---------------------------------------------------------------------------
    def chance(self, percent: int) -> bool:
        """True `percent` times in 100, at the high draws: hypothesis's simplest examples
        (every draw 0) take no option, so they are the plain float32 models."""
        return self.draw.int(0, 99) >= 100 - percent

    def shape(self, rank: int | None = None, budget: int = MAX_NUMEL) -> tuple[int, ...]:
        rank = self.draw.int(1, 4) if rank is None else rank
        dims: list[int] = []
        for _ in range(rank):
            d = self.draw.choice(DIMS)
            while math.prod(dims) * d > budget and d > 1:
                d //= 2
            dims.append(d)
        return tuple(dims)

    def fresh(self, shape: Sequence[int], dtype: str = FLOAT, *, param: bool = False,
              high: int = 0, special: bool = True) -> Value:
        """A new input (or parameter) of this shape; some float inputs carry NaN and inf
        (unless not `special`)."""
        special = special and not param and dtype == FLOAT and self.chance(6)
        t = Tensor(list(shape), dtype, high, special,
                   seed=len(self.spec.inputs) + len(self.spec.params))
        if param:
            self.spec.params.append(t)
            ref = f"p{len(self.spec.params) - 1}"
        else:
            self.spec.inputs.append(t)
            ref = f"i{len(self.spec.inputs) - 1}"
        v = Value(ref, tuple(shape), dtype, True, special)
        self.values.append(v)
        return v

    def pick(self, ok: Callable[[Value], bool], make: Callable[[], Value]) -> Value:
        """The newest value `ok` accepts (most often), another one, or a fresh one."""
        fits = [v for v in self.values if ok(v)]
        if not fits or self.chance(12):
            return make()
        if self.chance(60):
            return fits[-1]
        return self.draw.choice(fits)

    def float_value(self, min_rank: int = 1, exact: bool = False) -> Value:
        return self.pick(lambda v: v.is_float and len(v.shape) >= min_rank
                         and (v.exact or not exact),
                         lambda: self.fresh(self.shape(self.draw.int(min_rank, 4)),
                                            self.float_dtype()))

    def float_dtype(self) -> str:
        return self.draw.choice(HALF) if self.chance(10) else FLOAT

    def partner(self, v: Value, exact: bool = False) -> Value:
        """A float operand broadcasting against v: same shape, size-1 dims, a suffix, [1]."""
        form = self.draw.int(0, 3) if v.shape else 0
        shape = list(v.shape)
        if form == 1:
            shape = [1 if self.chance(50) else d for d in shape]
        elif form == 2:
            shape = shape[self.draw.int(0, len(shape) - 1):]
        elif form == 3:
            shape = [1]
        target = tuple(shape)
        return self.pick(lambda u: u.is_float and u.shape == target
                         and (u.exact or not exact),
                         lambda: self.fresh(target, param=self.chance(40)))

    # --- steps ----------------------------------------------------------------------------
    def buffer(self, shape: Sequence[int], dtype: str = FLOAT, high: int = 0) -> Value:
        """A new buffer of the model (state a step may write in place)."""
        self.spec.buffers.append(Tensor(list(shape), dtype, high,
                                        seed=500 + len(self.spec.buffers)))
        v = Value(f"b{len(self.spec.buffers) - 1}", tuple(shape), dtype, True)
        self.values.append(v)
        return v

    def step(self, op: str, operands: Sequence[Value | None], **kw: Any) -> Value:
        refs = [None if v is None else v.ref for v in operands]
        stand_ins = [None if v is None else _stand_in(v) for v in operands]
        if op == "layers":
            from .layers import layer_stack
            with torch.no_grad():
                out = layer_stack(kw, 0)(*stand_ins)
        else:
            out = OPS[op](*stand_ins, **kw)
        dtype = next(name for name, d in DTYPES.items() if d == out.dtype)
        # integers computed from exact values are exact (no rounding); floats only through
        # the ops that select or move values
        known = all(v is None or v.exact or not v.is_float for v in operands)
        exact = known and (op in EXACT_OPS or not out.dtype.is_floating_point)
        if out.dtype == torch.bool:
            exact = True  # comparisons only ever read exact values (module docstring)
        self.spec.steps.append((op, refs, kw))
        special = any(v is not None and v.special for v in operands)
        v = Value(f"v{len(self.spec.steps) - 1}", tuple(out.shape), dtype, exact, special)
        self.values.append(v)
        return v
