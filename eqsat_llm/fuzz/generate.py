"""Random valid models: a spec (fuzz/spec.py) drawn step by step.

Every draw goes through a `Draw` (hypothesis's `data.draw` in the fuzzer), so a run is
reproducible from its seed. A step's operands are taken from the values built so far (most
often the newest, so that chains form and fuse) or made fresh as inputs or parameters of a
shape that fits; each step's output shape and dtype come from running it on stand-in tensors,
which also proves the model valid for torch before the optimizer sees it.

Comparisons (and float-to-int casts) only read *exact* values: inputs, parameters and what
layout ops, selections and max/min make of them. A comparison of computed floats may flip
when a compiled program rounds differently (a legitimate difference, not a bug), and would
turn rounding noise into a mismatch."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import structures
from .builder import DIMS, FLOAT, HALF, MAX_NUMEL, Builder, Draw, HypothesisDraw, Value
from .spec import Spec

__all__ = ["Builder", "Draw", "HypothesisDraw", "generate"]

# --- the step families: each appends one or a few steps ------------------------------------
UNARY = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
         "relu", "silu", "erf", "reciprocal", "softplus", "gelu", "square")
# Ops whose result jumps (to NaN or inf) at a point of their domain: on a computed operand a
# rounding difference may cross the edge, so they read computed values as abs(x) + c; on
# exact values (inputs, with NaN and inf among them) they run as they are.
DOMAIN = ("log", "sqrt", "rsqrt", "reciprocal")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
COMPARE = ("gt", "lt", "ge", "le", "eq", "ne")


def unary(b: Builder) -> None:
    x = b.float_value()
    op = b.draw.choice(UNARY)
    if op in DOMAIN and not x.exact:
        x = _positive(b, x)
    if op == "gelu":
        b.step(op, [x], approximate=b.draw.choice(("none", "tanh")))
    else:
        b.step(op, [x])


def _positive(b: Builder, x: Value) -> Value:
    """abs(x) + c: a computed operand kept off a domain edge (see DOMAIN)."""
    return b.step("add_scalar", [b.step("abs", [x])], c=b.draw.choice((0.5, 1.0)))


def scalar(b: Builder) -> None:
    x = b.float_value()
    op = b.draw.choice(("add_scalar", "mul_scalar", "rsub_scalar", "div_scalar", "pow",
                        "clamp"))
    c = b.draw.choice((0.5, 2.0, -1.0, 3.0, 0.125, 1e-6))
    if op == "pow":
        exponent = b.draw.choice((2, 3, 0.5, -1.0, 2.0))
        if exponent in (0.5, -1.0) and not x.exact:
            x = _positive(b, x)
        b.step(op, [x], exponent=exponent)
    elif op == "clamp":
        b.step(op, [x], lo=-c if c > 0 else c, hi=abs(c))
    else:
        b.step(op, [x], c=c)


def binary(b: Builder) -> None:
    x = b.float_value()
    y = b.partner(x)
    xy = [y, x] if b.chance(30) else [x, y]
    b.step(b.draw.choice(BINARY), xy)


def select_by_mask(b: Builder) -> None:
    """where / masked_fill on a comparison of exact values (attention masks, clamps)."""
    x = b.float_value(exact=True)
    y = b.partner(x, exact=True)
    cond = b.step(b.draw.choice(COMPARE), [x, y])
    if b.chance(30):
        other = b.step(b.draw.choice(COMPARE), [x, b.partner(x, exact=True)])
        cond = b.step(b.draw.choice(("logical_and", "logical_or")), [cond, other])
    if b.chance(15):
        cond = b.step("logical_not", [cond])
    z = b.float_value()
    # masked_fill(-inf) of NaN or +inf is where the default rules knowingly differ from eager
    # (masked-fill-as-bias: x + -inf; docs/fuzzing.md), so it reads values without them
    if b.chance(50) and _broadcasts(cond.shape, z.shape) == z.shape and not z.special:
        b.step("masked_fill", [z, cond], value=b.draw.choice((0.0, float("-inf"), -1e9)))
    else:
        b.step("where", [cond, x, b.partner(x)])


def reduction(b: Builder) -> None:
    x = b.float_value()
    op = b.draw.choice(("sum", "mean", "amax", "amin", "softmax", "log_softmax", "cumsum"))
    dim = b.draw.int(-len(x.shape), len(x.shape) - 1)
    if op in ("softmax", "log_softmax", "cumsum"):
        dim = -1 if b.chance(60) else dim
        b.step(op, [x], dim=dim)
    else:
        b.step(op, [x], dim=dim, keepdim=b.chance(50))


def norm(b: Builder) -> None:
    x = b.float_value()
    n = x.shape[-1]
    op = b.draw.choice(("layer_norm", "rms_norm", "rms_norm_by_hand"))
    w = b.fresh((n,), x.dtype, param=True) if b.chance(70) else None
    if op == "layer_norm":
        bias = b.fresh((n,), x.dtype, param=True) if w is not None and b.chance(60) else None
        b.step(op, [x, w, bias] if bias is not None else [x, w],
               eps=b.draw.choice((1e-5, 1e-6)))
    else:
        b.step(op, [x] if w is None else [x, w], eps=b.draw.choice((1e-5, 1e-6)))


def layout(b: Builder) -> None:
    v = b.pick(lambda u: len(u.shape) >= 1, lambda: b.fresh(b.shape()))
    r = len(v.shape)
    op = b.draw.choice(("reshape", "permute", "transpose", "unsqueeze", "slice", "select",
                        "chunk", "cat", "expand", "flatten", "contiguous", "tril"))
    if op == "reshape":
        b.step(op, [v], shape=_reshaped(b, v.shape))
    elif op == "permute" and r >= 2:
        dims = list(range(r))
        for k in range(r - 1, 0, -1):
            j = b.draw.int(0, k)
            dims[k], dims[j] = dims[j], dims[k]
        b.step(op, [v], dims=dims)
    elif op == "transpose" and r >= 2:
        b.step(op, [v], d0=b.draw.int(0, r - 1), d1=b.draw.int(-r, -1))
    elif op == "slice":
        dim = b.draw.int(0, r - 1)
        n = v.shape[dim]
        start = b.draw.int(0, max(n - 1, 0))
        b.step(op, [v], dim=dim, start=start, stop=b.draw.int(start + 1, n) if n else 0,
               step=b.draw.choice((1, 1, 2)))
    elif op == "select" and r >= 2:
        dim = b.draw.int(-r, r - 1)
        b.step(op, [v], dim=dim, index=b.draw.int(-v.shape[dim], v.shape[dim] - 1))
    elif op == "chunk" and any(d % 2 == 0 for d in v.shape):
        dim = b.draw.choice([k for k, d in enumerate(v.shape) if d % 2 == 0])
        b.step(op, [v], chunks=2, dim=dim, k=b.draw.int(0, 1))
    elif op == "cat" and math.prod(v.shape) * 2 <= MAX_NUMEL:
        dim = b.draw.int(0, r - 1)
        shape = list(v.shape)
        shape[dim] = b.draw.choice(DIMS[:5])
        other = b.pick(lambda u: u.dtype == v.dtype and list(u.shape) == shape,
                       lambda: b.fresh(shape, v.dtype, high=2 if v.is_int else 0))
        b.step(op, [v, other] if b.chance(50) else [other, v, v], dim=dim)
    elif op == "expand" and 1 in v.shape:
        shape = [b.draw.choice(DIMS[:6]) if d == 1 else d for d in v.shape]
        if math.prod(shape) <= MAX_NUMEL:
            b.step(op, [v], shape=shape)
    elif op == "flatten" and r >= 2:
        b.step(op, [v], start=b.draw.int(0, r - 2))
    elif op == "tril" and r >= 2:
        b.step(b.draw.choice(("tril", "triu")), [v], diagonal=b.draw.int(-1, 1))
    elif op == "unsqueeze" and r < 4:
        b.step(op, [v], dim=b.draw.int(-r - 1, r))
    else:
        b.step("contiguous", [v])


def _reshaped(b: Builder, shape: tuple[int, ...]) -> list[int]:
    """Another shape of the same numel: dims merged or split, sometimes with a -1."""
    dims = list(shape)
    if len(dims) >= 2 and b.chance(50):
        k = b.draw.int(0, len(dims) - 2)
        dims[k:k + 2] = [dims[k] * dims[k + 1]]
    else:
        k = b.draw.int(0, len(dims) - 1)
        d = dims[k]
        f = next((f for f in (2, 3, 4) if d % f == 0 and d > f), None)
        if f is not None:
            dims[k:k + 1] = [f, d // f]
        elif len(dims) < 4:
            dims.insert(k, 1)
    if b.chance(25):
        dims[b.draw.int(0, len(dims) - 1)] = -1
    return dims


def matmul(b: Builder) -> None:
    x = b.float_value()
    k = x.shape[-1]
    n = b.draw.choice((1, 3, 8, 16, 17, 32, 40))
    form = b.draw.int(0, 3)
    dt = x.dtype  # weights in the activations' dtype, as in a half model
    if form == 0:  # nn.Linear
        w = b.fresh((n, k), dt, param=True)
        bias = b.fresh((n,), dt, param=True) if b.chance(50) else None
        b.step("linear", [x, w] if bias is None else [x, w, bias])
    elif form == 1 or len(x.shape) < 3:  # activations times a weight (or another input)
        y = b.fresh((k, n), dt, param=b.chance(70)) if len(x.shape) > 1 or b.chance(50) \
            else b.fresh((k,), dt)
        b.step("matmul", [x, y])
    elif form == 2:  # batched, with broadcasting batch dims
        batch = [1 if b.chance(30) else d for d in x.shape[:-2]]
        y = b.pick(lambda u: u.dtype == dt and u.shape == (*batch, k, n),
                   lambda: b.fresh((*batch, k, n), dt))
        b.step("matmul", [x, y])
    else:
        x3 = x if len(x.shape) == 3 else b.step("reshape", [x], shape=[-1, *x.shape[-2:]])
        y = b.fresh((x3.shape[0], k, n), dt)
        b.step("bmm", [x3, y])


def gathers(b: Builder) -> None:
    op = b.draw.choice(("embedding", "index_select", "gather"))
    if op == "embedding":
        vocab, dim = b.draw.choice((5, 16, 33)), b.draw.choice((4, 8, 17))
        ids = b.pick(lambda u: u.dtype == "int64" and u.exact and u.ref.startswith("i")
                     and b.spec.inputs[int(u.ref[1:])].high == vocab,
                     lambda: b.fresh(b.shape(b.draw.int(1, 2), 64), "int64", high=vocab))
        b.step(op, [ids, b.fresh((vocab, dim), param=True)])
        return
    x = b.float_value()
    dim = b.draw.int(0, len(x.shape) - 1)
    if op == "index_select":
        idx = b.fresh((b.draw.choice((1, 2, 5)),), "int64", high=x.shape[dim])
    else:
        idx = b.fresh([b.draw.int(1, n) for n in x.shape], "int64", high=x.shape[dim])
    b.step(op, [x, idx], dim=dim)


def dtypes(b: Builder) -> None:
    """Casts between float32 and the half types, and integers: arithmetic, casts, sums."""
    form = b.draw.int(0, 2)
    if form == 0:
        x = b.float_value()
        target = b.draw.choice((*HALF, FLOAT))
        y = b.step("to", [x], dtype=target)
        if b.chance(50):
            b.step("to", [y], dtype=FLOAT)
    elif form == 1:
        x = b.pick(lambda u: u.is_int, lambda: b.fresh(b.shape(), "int64", high=10))
        op = b.draw.choice(("add", "mul", "sub", "maximum", "add_scalar", "mul_scalar"))
        if op.endswith("_scalar"):
            y = b.step(op, [x], c=b.draw.choice((1, 3, -2)))
        else:
            y = b.step(op, [x, b.fresh(x.shape, b.draw.choice(("int64", "int32")), high=10)])
        if b.chance(50):
            b.step(b.draw.choice(("sum", "amax")), [y], dim=-1, keepdim=b.chance(50))
    else:
        x = b.pick(lambda u: u.is_int or u.dtype == "bool",
                   lambda: b.fresh(b.shape(), "int64", high=5))
        b.step("to", [x], dtype=FLOAT)


# The families and their weights; the structures' big families (fuzz/structures.py) are
# weighed in twelfths of a classic family's unit: their programs are bigger (1.3-2.7x a one-op
# model's optimize time), so the test share draws one in about 60 families (a model has one
# about one time in twelve) and keeps its time, and a long run asks for more
# (`structures_weight`).
FAMILIES: tuple[tuple[Callable[[Builder], None], int], ...] = (
    (unary, 5), (scalar, 3), (binary, 5), (select_by_mask, 2), (reduction, 4), (norm, 2),
    (layout, 5), (matmul, 4), (structures.attention, 1), (gathers, 1), (dtypes, 2))
STRUCTURES: tuple[tuple[Callable[[Builder], None], int], ...] = (
    (structures.kv_cache, 1), (structures.layers, 1), (structures.moe, 1),
    (structures.integers, 2), (structures.large, 1), (structures.state, 1))
UNIT = 12
# what a family spends of a model's budget of families: a big one ends a model sooner, so that
# the models stay about as costly to optimize on average
BUDGET = {structures.kv_cache: 3, structures.layers: 4, structures.moe: 2, structures.large: 3}


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


def generate(draw: Draw, seed: int = 0, max_steps: int = 8, structures_weight: int = 1) -> Spec:
    """A random valid model of 1..max_steps families' worth (BUDGET: a big family counts as
    several; a family may add several steps); its outputs are the newest value and,
    sometimes, one earlier. `structures_weight` multiplies the weights of the structures' big
    families (a long run draws more of them than the test share)."""
    b = Builder(draw, seed)
    table = [f for f, weight in FAMILIES for _ in range(weight * UNIT)]
    table += [f for f, weight in STRUCTURES for _ in range(weight * structures_weight)]
    budget = draw.int(1, max_steps)
    while budget > 0:
        family = draw.choice(table)
        family(b)
        budget -= BUDGET.get(family, 1)
    if not b.spec.steps:
        unary(b)
    computed = [v for v in b.values if v.ref.startswith("v")]
    outputs = [computed[-1].ref]
    if len(computed) > 1 and b.chance(30):
        other = draw.choice(computed[:-1]).ref
        outputs.append(other)
    b.spec.outputs = outputs
    return b.spec
