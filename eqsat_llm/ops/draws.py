"""How `rules check` draws an op's input types where they must agree beyond broadcasting (the
`draw` of register(); rulecheck/draws.py asks it): a draw(c, pos) returns input `pos`'s type,
fitting the inputs already drawn (`c.built`: their shapes by position), and for int64
indices the bound of their values; None for any type. `c` (rulecheck.draws.Demand) also gives
the random source, the op's operand roles (`c.roles`), a size drawn for a dim the op chooses
freely (`c.dim`) and fresh types of a given rank (`c.rank(...)`). Each branch draws from
`c.rng` in a fixed order: the same seed draws the same instances."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..tensor_type import TensorType

F64 = "float64"  # the rule checker computes in float64
Draw = Callable[[Any, int], Any]


def product(i: int, j: int) -> Draw:
    """x [M, K] (input i) @ w [K, N] (input j) share K; addmm's bias (input 0) is [N]."""
    def draw(c: Any, pos: int) -> Any:
        b, d = c.built, c.dim
        if pos == i:
            return (TensorType((d, b[j][0]), F64), None) if j in b else c.rank(2)
        if pos == j:
            return (TensorType((b[i][1], d), F64), None) if i in b else c.rank(2)
        return (TensorType((b[2][1],), F64), None) if 2 in b else c.rank(1, 2)
    return draw


def bmm(c: Any, pos: int) -> Any:
    """[B, M, K] @ [B, K, N]."""
    b, d = c.built, c.dim
    if pos == 0:
        return (TensorType((b[1][0], d, b[1][1]), F64), None) if 1 in b else c.rank(3)
    return (TensorType((b[0][0], b[0][2], d), F64), None) if 0 in b else c.rank(3)


def matmul(c: Any, pos: int) -> Any:
    """[..., M, K] @ [K, N] or [..., K, N] (the batch dims of the left side a quarter of the
    time)."""
    b, d = c.built, c.dim
    if pos == 0:
        return (TensorType((*b[1][:-2], d, b[1][-2]), F64), None) if 1 in b else c.rank(2, 3)
    batch = b[0][:-2] if c.rng.random() < 0.25 else ()
    return (TensorType((*batch, b[0][-1], d), F64), None) if 0 in b else c.rank(2)


def linear(c: Any, pos: int) -> Any:
    """x [..., K], w [N, K], bias [N]."""
    b, d = c.built, c.dim
    if pos == 0:
        return (TensorType((*c.shape(c.rng.choice((0, 1, 2))), b[1][1]), F64), None) \
            if 1 in b else c.rank(1, 2, 3)
    if pos == 1:
        return TensorType((b[2][0] if 2 in b else d, b[0][-1] if 0 in b else d), F64), None
    return TensorType((b[1][0] if 1 in b else d,), F64), None


def experts(c: Any, pos: int) -> Any:
    """x [S, K], float experts w [E, K, N], w_scale a scalar, int64 ids [S] below E."""
    b, d = c.built, c.dim
    if pos == 0:
        return TensorType((b[3][0] if 3 in b else d, b[1][1] if 1 in b else d), F64), None
    if pos == 1:
        return TensorType((c.rng.choice((1, 2, 3)), b[0][1] if 0 in b else d, d), F64), None
    if pos == 2:
        return c.rank(0)
    return TensorType((b[0][0] if 0 in b else d,), "int64"), b[1][0] if 1 in b else 1


def embedding(c: Any, pos: int) -> Any:
    """A table [V, E] and int64 indices below V."""
    if pos == 0:
        return c.rank(2)
    bound = c.built[0][0] if 0 in c.built else 1
    return TensorType(c.shape(c.rng.choice((1, 2))), "int64"), bound


def index_select(c: Any, pos: int) -> Any:
    """int64 indices below the smallest dim of x (any dim may be the one selected)."""
    if pos != 1:
        return None
    return TensorType(c.shape(1), "int64"), min(c.built[0]) if 0 in c.built else 1


def norm(c: Any, pos: int) -> Any:
    """x [..., D] and the weight (and bias) [D] (layer_norm, rms_norm)."""
    b = c.built
    if pos > 0:
        return (TensorType(b[0][-1:], F64), None) if 0 in b else c.rank(1)
    return (TensorType((*c.shape(c.rng.choice((0, 1, 2))), b[1][0]), F64), None) \
        if 1 in b else None


def gemm(c: Any, pos: int) -> Any:
    """x [M, K], w [K, N] (N even half the time: a SwiGLU pair), the norm weight [K], the
    addend [N] (a bias or a residual row); w_scale unused."""
    b, d = c.built, c.dim
    k, n = (b[1][0], b[1][1]) if 1 in b else (b[0][-1] if 0 in b else d, d)
    n = 2 * n if 1 not in b and c.rng.random() < 0.5 else n
    shapes = {0: (c.rng.choice(c.dims()), k), 1: (k, n), 2: (), 3: (k,), 4: (n,)}
    return TensorType(shapes[pos], F64), None


def attention(bool_mask: bool) -> Draw:
    """sdpa / sdpa_masked / attention (q, k, v, mask or bias, sinks), 4-D and consistent with
    the inputs already drawn: q [B, H, Lq, E], k [B, Hk, Lk, E], v [B, Hk, Lk, Ev], with
    Hk = H or (k and v fresh, a fifth of the time) a divisor of H (grouped-query attention),
    H (the first input drawn) 4 or 6 half the time so that heads can be grouped; a mask or
    bias of rank 2 to 4 that broadcasts to [B, H, Lq, Lk] (often [Lq, Lk]), a bool mask
    (True = attend) half the time where `bool_mask`; sinks [B, H, Lq, 1]."""
    def draw(c: Any, pos: int) -> Any:
        rng, roles = c.rng, c.roles
        built = {roles[i]: s for i, s in c.built.items()}
        q, k, v, role = built.get("q"), built.get("k"), built.get("v"), roles[pos]
        kv = k if k is not None else v

        def first(*dims: int | None) -> int:
            return next((n for n in dims if n is not None), rng.choice(c.dims()))

        def at(s: tuple[int, ...] | None, i: int) -> int | None:
            return None if s is None else s[i]

        batch, lq, lk = first(at(q, 0), at(kv, 0)), first(at(q, 2)), first(at(kv, 2))
        heads, e = first(at(q, 1), at(kv, 1)), first(at(q, 3), at(k, 3))
        if q is None and kv is None and rng.random() < 0.5:
            heads = rng.choice((4, 6))  # heads that grouped-query attention can group
        if role == "q":
            return TensorType((batch, heads, lq, e), F64), None
        if role in ("k", "v"):
            if kv is not None:
                heads = kv[1]
            elif rng.random() < 0.2:
                heads = rng.choice([n for n in c.dims() if heads % n == 0])
            return TensorType((batch, heads, lk, e if role == "k" else first(at(v, 3))),
                              F64), None
        if role == "sinks":  # attention's sinks: a logit per (batch, head, query row)
            return TensorType((batch, heads, lq, 1), F64), None
        full = (batch, heads, lq, lk)
        mask = full[-rng.choice((2, 2, 2, 3, 4)):]  # (torch's sdpa rejects a 1-D mask)
        mask = tuple(1 if rng.random() < 0.25 else n for n in mask)
        boolean = bool_mask and rng.random() < 0.5
        return TensorType(mask, "bool" if boolean else F64), None
    return draw
