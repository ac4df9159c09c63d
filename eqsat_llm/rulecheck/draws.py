"""What a random instance draws: the shapes an op demands of its inputs, the targets of views
and expands, and attribute values.

Types flow bottom-up (each node is type-checked by Graph.add as it is built) and demands flow
down: an op asks for input types that fit the inputs it already has (mm's second input starts
with the first one's last dim), and a view asked for a type takes it as its target shape and
asks its own input for the same numel (so view -> bmm -> view chains type-check and fire); an
expand asked for a type takes it as its target and asks its input for it with dims set to 1.
A view or expand tells the one just below what it made of the shape (Instance.unview), so
view(expand(view(k))) chains (transformers' repeat_kv) are built as often as they fire.
"""

from __future__ import annotations

import random
from typing import Any

from ..ir import Graph, TensorType
from ..ops import GEMM_ACTS, GEMM_PROLOGUES, REGISTRY

DIMS = (1, 2, 3, 4)
# the sizes drawn: DIMS, or a rule's own (Rule.check_dims); the leaves' dtype (check_dtype)
DRAW: dict[str, Any] = {"dims": DIMS, "dtype": "float64"}
RANKS = (0, 1, 2, 2, 3, 3, 4)
SCALARS = (0.0, 1.0, -1.0, 2.0, 0.5)


class Retry(Exception):
    """This instance cannot be completed (no valid attribute, ill-typed); draw another."""


Want = tuple[TensorType, int | None]  # a demanded type, and for int64 indices their bound


def draw_shape(rng: random.Random, rank: int | None = None) -> tuple[int, ...]:
    rank = rng.choice(RANKS) if rank is None else rank
    return tuple(rng.choice(DRAW["dims"]) for _ in range(rank))


class Demand:
    """What an op's `draw` (OpDef.draw, ops/draws.py) reads: the random source, the op's
    operand roles, the shapes of the inputs already built (by position), a size drawn for the
    dim the op chooses freely, and fresh float types (the rule's check_dtype, float64 by
    default) of a given rank."""

    def __init__(self, rng: random.Random, op: str, built: dict[int, TensorType]):
        self.rng, self.roles = rng, REGISTRY[op].operands
        self.dim = rng.choice(DRAW["dims"])
        self.built = {i: t.shape for i, t in built.items()}

    @property
    def F(self) -> str:  # (the draws read c.F: the float dtype)
        return DRAW["dtype"]

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        return draw_shape(self.rng, rank)

    def rank(self, *ranks: int) -> Want:
        """A fresh float type of one of these ranks."""
        return TensorType(draw_shape(self.rng, self.rng.choice(ranks)), self.F), None

    def dims(self) -> tuple[int, ...]:
        return DRAW["dims"]


def input_demand(rng: random.Random, op: str, pos: int,
                 built: dict[int, TensorType]) -> Want | None:
    """A type for input `pos` of `op` that fits the inputs already built (by position); None:
    any type. Inputs that are sub-patterns are built before fresh leaves, so leaves adapt.
    An op whose inputs must agree beyond broadcasting says how (OpDef.draw); elementwise ops
    take a shape that broadcasts against their other inputs'."""
    c = Demand(rng, op, built)
    f, b = c.F, c.built
    try:
        draw = REGISTRY[op].draw
        if draw is not None:
            return draw(c, pos)
        boolean = op.startswith(("logical_", "bitwise_")) or (op == "where" and pos == 0)
        like = [s for i, s in b.items() if not (op == "where" and i == 0)] or list(b.values())
        if REGISTRY[op].category == "elementwise" and like and rng.random() < 0.75:
            s = rng.choice(like)
            how = rng.random()  # the same shape, or one that broadcasts against it
            if 0.5 <= how < 0.75:
                s = s[-1:]
            elif how >= 0.75:
                s = tuple(1 if rng.random() < 0.5 else n for n in s[rng.randrange(len(s) + 1):])
            return TensorType(s, "bool" if boolean else f), None
        if boolean:
            return TensorType(draw_shape(rng), "bool"), None
    except (IndexError, KeyError, ValueError, TypeError):
        pass
    return None


def unexpand(rng: random.Random, x: tuple[int, ...],
              split: tuple[int, ...] = ()) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An input shape that expands to x, and the dims the expand broadcasts (from 1). Under a
    view that split one dim of x into two (`split`, dims i and i + 1: the view merges them),
    mostly one of those two (the inner one two times in three: k[:, :, None].expand(b, h, n,
    s, d).reshape(b, h * n, s, d) as transformers' repeat_kv, or a factor already 1, kept 1);
    else x itself a fifth of the time (a no-op expand), or x with one dim (often) or several
    set to 1; a leading dim dropped (expand adds leading dims) a sixth of the time."""
    how = rng.random()
    if split and how < 0.8:
        i = split[1] if rng.random() < 2 / 3 else split[0]
        out = [1 if j == i else n for j, n in enumerate(x)]
        return tuple(out), (i,)
    if how < 0.2 or not x:
        return x, ()
    if how < 0.8:
        i = rng.choice([i for i, n in enumerate(x) if n > 1] or range(len(x)))
        out = [1 if j == i else n for j, n in enumerate(x)]
    else:
        out = [1 if rng.random() < 0.5 else n for n in x]
    dims = [i for i, (a, b) in enumerate(zip(out, x)) if a != b]
    if rng.random() < 1 / 6:
        out, dims = out[1:], [i - 1 for i in dims if i > 0]
    return tuple(out), tuple(dims)


def _undo(x: tuple[int, ...], pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(dim, first factor) splits of x that undo a merge of two dims (`pairs`)."""
    return [(i, u) for i, n in enumerate(x) for u, v in pairs if u * v == n]


def _split(rng: random.Random, x: tuple[int, ...], pairs: list[tuple[int, int]]) -> list[int]:
    """x with one dim split in two: undoing a merge of the instance where one fits, else the
    leading dim half the time (torch.export merges batch and heads)."""
    return split_at(rng, x, pairs)[0]


def split_at(rng: random.Random, x: tuple[int, ...],
              pairs: list[tuple[int, int]]) -> tuple[list[int], int]:
    """_split, and the dim it split (dims i and i + 1 of the result)."""
    fits = _undo(x, pairs)
    if fits:
        i, u = rng.choice(fits)
    else:
        i = 0 if rng.random() < 0.5 else rng.randrange(len(x))
        factors = [f for f in DRAW["dims"] if x[i] % f == 0]
        proper = [f for f in factors if 1 < f < x[i]]  # (n = 1 * n: an unsqueeze)
        u = rng.choice(proper if proper and rng.random() < 2 / 3 else factors)
    return [*x[:i], u, x[i] // u, *x[i + 1:]], i


def _view_shape(rng: random.Random, x: tuple[int, ...], seen: list[tuple[int, ...]],
                pairs: list[tuple[int, int]]) -> list[int]:
    """A target shape for a view of x: one dim split to undo a merge of the instance, x itself,
    two adjacent dims merged, one dim split, another shape of the instance with the same numel,
    or a random factorisation."""
    n = TensorType(x, "").numel
    how = rng.random()
    if how < 0.5 and _undo(x, pairs):
        return _split(rng, x, pairs)
    same = [t for t in seen if t != x and TensorType(t, "").numel == n]
    how = rng.random()
    if how < 0.2:
        return list(x)
    if how < 0.5 and len(x) >= 2:
        i = rng.randrange(len(x) - 1)
        return [*x[:i], x[i] * x[i + 1], *x[i + 2:]]
    if how < 0.7 and x:
        return _split(rng, x, pairs)
    if how < 0.8 and same:
        return list(rng.choice(same))
    return _factorise(rng, n)


def _factorise(rng: random.Random, n: int) -> list[int]:
    rank = rng.choice((0, 1, 2) if n == 1 else (1, 2, 2, 3, 3, 4))
    dims = [1] * rank
    p = 2
    while n > 1:
        while n % p == 0:
            dims[rng.randrange(rank)] *= p
            n //= p
        p += 1
    return dims


def sample_attr(rng: random.Random, op: str, name: str, kind: str, types: list[TensorType],
                 attrs: dict[str, Any], graph: Graph) -> Any:
    """A random value for attribute `name` of `op`, knowing its input types and the attributes
    drawn before it. Raises Retry when no valid value exists for these inputs."""
    x = types[0].shape if types else ()
    r = len(x)
    try:
        if op == "scalar":
            return rng.choice((*SCALARS, round(rng.uniform(-3, 3), 3))) if name == "value" \
                else "float"
        if op == "view":
            seen = [n.type.shape for n in graph.nodes if isinstance(n.type, TensorType)]
            return _view_shape(rng, x, seen, merges(graph))
        if op == "expand":
            if rng.random() < 0.25:
                return list(x)
            new = [rng.choice((1, 2, 3)) if n == 1 and rng.random() < 0.5 else n for n in x]
            return ([rng.choice(DRAW["dims"])] if rng.random() < 0.25 else []) + new
        if op == "permute":
            perm = list(range(r))
            if rng.random() >= 0.25:
                rng.shuffle(perm)
            return perm
        if op == "unsqueeze":
            return rng.randrange(r + 1)
        if name == "dims":  # reductions: the last dim half the time, else a non-empty set
            if r == 0:
                raise Retry("a reduction of a 0-d tensor")
            if rng.random() < 0.5:
                return [r - 1]
            return sorted(rng.sample(range(r), rng.randint(1, r)))
        if kind == "bool":
            return rng.random() < 0.5
        if op == "slice" and name != "dim":
            size = x[attrs["dim"]]
            if name == "start":
                return rng.randrange(size)
            return rng.randint(attrs["start"] + 1, size) if name == "end" else rng.choice((1, 2))
        if op == "select" and name == "index":
            return rng.randrange(x[attrs["dim"]])
        if op == "cat":
            ok = [d for d in range(r) if all(len(t.shape) == r and all(
                a == b for i, (a, b) in enumerate(zip(t.shape, x)) if i != d) for t in types)]
            return rng.choice(ok)
        if name in ("dim", "dim0", "dim1"):
            if r == 0:
                raise Retry(f"{op}.{name} of a 0-d tensor")
            return r - 1 if rng.random() < 0.5 else rng.randrange(r)
        if name in ("alpha", "beta"):
            return 1.0 if rng.random() < 0.5 else round(rng.uniform(-2, 2), 3)
        if name == "diagonal":
            return rng.choice((-1, 0, 1))
        if name == "normalized_shape":
            return list(types[1].shape) if len(types) > 1 else list(x[-1:])
        if name == "eps":
            return 1e-5
        if name == "scale":
            return round(rng.uniform(0.1, 1.0), 3)
        if name == "approximate":
            return rng.choice(("none", "tanh"))
        if op == "gemm":
            return _gemm_attr(rng, name, types, attrs)
        if op == "expert_mm":  # float experts [E, K, N]: n is N
            return "float" if name == "weight" else types[1].shape[-1]
        if name == "dtype":  # (a rule checked in a half dtype casts to it)
            return rng.choice(("float64", "float64", "float32")) if DRAW["dtype"] == \
                "float64" else DRAW["dtype"]
    except (IndexError, ValueError, KeyError) as exc:
        raise Retry(f"no valid {op}.{name} for inputs {types}") from exc
    defaults = {"int": lambda: rng.randrange(3), "float": lambda: rng.choice(SCALARS),
                "ints": lambda: list(draw_shape(rng)), "str": lambda: "float64"}
    return defaults[kind]()


def _gemm_attr(rng: random.Random, name: str, types: list[TensorType],
               attrs: dict[str, Any]) -> Any:
    """A gemm descriptor that fits its operands (input_demand): n is the weight's width, or half of
    it for the SwiGLU epilogue."""
    width = types[1].shape[-1]
    if name == "n":
        return width // 2 if width % 2 == 0 and rng.random() < 0.3 else width
    if name == "prologue":
        return rng.choice(GEMM_PROLOGUES)
    if name == "epilogue":
        return "swiglu" if attrs["n"] != width else rng.choice(("none", "add", "bias"))
    if name == "act":
        return rng.choice(GEMM_ACTS)
    raise Retry(f"gemm.{name}")


def merges(graph: Graph) -> list[tuple[int, int]]:
    """The pairs of adjacent dims that views of the graph merged into one."""
    out = []
    for n in graph.nodes:
        if n.op == "view":
            x, y = graph.type_of(n.inputs[0]).shape, tuple(n.attrs["shape"])
            out += [(x[i], x[i + 1]) for i in range(len(x) - 1)
                    if y == (*x[:i], x[i] * x[i + 1], *x[i + 2:])]
    return out
