"""The ATEN table: one converter per aten op (or family of overloads), each writing the IR
nodes that compute it; a converter that cannot express a particular call raises
`Unsupported` and the node runs in torch (converter.py)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.fx import Node as FxNode

from ..ir import TensorType
from ..ops.elementwise import UNARY
from ..ops.experts import add_expert_mm
from .converter import (
    Converter,
    GraphConverter,
    Unsupported,
    converts,
    is_empty,
    norm_dim,
    out_dtype,
    out_shape,
    value_type,
)

aten = torch.ops.aten

@converts(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _view(c: GraphConverter, node: FxNode, x: FxNode, *_: Any) -> int:
    return c.g.add("view", (c.t(x),), shape=out_shape(node))


@converts(aten.permute.default)
def _permute(c: GraphConverter, node: FxNode, x: FxNode, dims: list[int]) -> int:
    r = c.rank(x)
    return c.g.add("permute", (c.t(x),), dims=[norm_dim(d, r) for d in dims])


@converts(aten.transpose.int)
def _transpose(c: GraphConverter, node: FxNode, x: FxNode, d0: int, d1: int) -> int:
    r = c.rank(x)
    return c.g.add("transpose", (c.t(x),), dim0=norm_dim(d0, r), dim1=norm_dim(d1, r))


@converts(aten.t.default)
def _t(c: GraphConverter, node: FxNode, x: FxNode) -> int:
    if c.rank(x) < 2:
        return c.g.add("clone", (c.t(x),))
    return c.g.add("transpose", (c.t(x),), dim0=0, dim1=1)


@converts(aten.expand.default)
def _expand(c: GraphConverter, node: FxNode, x: FxNode, size: list[int], **_: Any) -> int:
    return c.g.add("expand", (c.t(x),), shape=out_shape(node))


@converts(aten.repeat.default)
def _repeat(c: GraphConverter, node: FxNode, x: FxNode, repeats: list[int]) -> int:
    """x.repeat(r) as the layout ops it is: a unit axis before each dim (view), that axis
    expanded to r[i], the pairs merged (the view that copies): no torch step (BLOOM's ALiBi)."""
    s = [1] * (len(repeats) - c.rank(x)) + list(c.shape(x))
    unit = c.g.add("view", (c.t(x),), shape=[d for n in s for d in (1, n)])
    tiled = c.g.add("expand", (unit,), shape=[d for r, n in zip(repeats, s) for d in (r, n)])
    return c.g.add("view", (tiled,), shape=out_shape(node))


@converts(aten.unsqueeze.default)
def _unsqueeze(c: GraphConverter, node: FxNode, x: FxNode, dim: int) -> int:
    return c.g.add("unsqueeze", (c.t(x),), dim=norm_dim(dim, c.rank(x) + 1))


@converts(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _clone(c: GraphConverter, node: FxNode, x: FxNode, **_: Any) -> int:
    return c.g.add("clone", (c.t(x),))


@converts(aten._to_copy.default)
def _to_copy(c: GraphConverter, node: FxNode, x: FxNode, **kwargs: Any) -> int:
    # (a model whose weights are on the meta device moves its buffers to its activations'
    # device, meta: the program runs on one device, its backend's)
    if kwargs.get("device") not in (None, torch.device("cpu"), torch.device("meta")) and \
            "val" in node.meta:
        raise Unsupported
    return c.g.add("to_dtype", (c.t(x),), dtype=out_dtype(node))


@converts(aten.slice.Tensor)
def _slice(c: GraphConverter, node: FxNode, x: FxNode, dim: int = 0, start: int | None = None,
           end: int | None = None, step: int = 1) -> int:
    shape = c.shape(x)
    dim = norm_dim(dim, len(shape))
    start, end = _slice_bounds(shape[dim], start, end)
    return c.g.add("slice", (c.t(x),), dim=dim, start=start, end=end, step=step)


def _slice_bounds(n: int, start: int | None, end: int | None) -> tuple[int, int]:
    """A slice's start and end on a dim of size n as torch reads them: None for the ends,
    negative from the end, clamped to [0, n], end not before start."""
    start = 0 if start is None else max(0, min(n, start + n if start < 0 else start))
    end = n if end is None else max(0, min(n, end + n if end < 0 else end))
    return start, max(start, end)


@converts(aten.slice_scatter.default)
def _slice_scatter(c: GraphConverter, node: FxNode, base: FxNode, src: FxNode, dim: int = 0,
                   start: int | None = None, end: int | None = None, step: int = 1) -> int:
    """x[..., a:b] = src written functionally (MLA's q_pe / k_pe placed beside the rest): the
    parts of `base` either side of [a, b) concatenated around `src`."""
    shape = c.shape(base)
    dim = norm_dim(dim, len(shape))
    n = shape[dim]
    start, end = _slice_bounds(n, start, end)
    if c.g.type_of(c.t(src)).dtype != c.g.type_of(c.t(base)).dtype:
        raise Unsupported
    if step != 1:
        return _strided_scatter(c, base, src, dim, start, end, step)
    parts = [c.g.add("slice", (c.t(base),), dim=dim, start=0, end=start, step=1)] \
        if start > 0 else []
    parts.append(c.t(src))
    if end < n:
        parts.append(c.g.add("slice", (c.t(base),), dim=dim, start=end, end=n, step=1))
    return parts[0] if len(parts) == 1 else c.g.add("cat", parts, dim=dim)


def _strided_scatter(c: GraphConverter, base: FxNode, src: FxNode, dim: int, start: int, end: int,
                     step: int) -> int:
    """x[..., a:b:step] = src (Cohere's interleaved rotary sections): each position p takes
    src[(p - a) / step] where that is whole and p in [a, b), else base[p]. The positions and
    indices are constants (arange arithmetic, folded at compile time)."""
    n, k = c.shape(base)[dim], len(range(start, end, step))
    g = c.g

    def number(v: float) -> int:
        return g.add("full", shape=[], value=float(v), dtype="float32")
    p = g.append("arange", (), {"start": 0.0, "end": float(n), "step": 1.0,
                                "dtype": "float32"}, TensorType((n,), "float32"))
    q = g.add("floor", (g.add("div", (g.add("sub", (p, number(start))), number(step))),))
    idx = g.add("minimum", (g.add("maximum", (q, number(0))), number(k - 1)))
    idx = g.add("to_dtype", (idx,), dtype="int64")
    lands = g.add("eq", (g.add("add", (g.add("mul", (q, number(step))), number(start))), p))
    inside = g.add("logical_and", (g.add("ge", (p, number(start))), g.add("lt", (p, number(end)))))
    hit = g.add("logical_and", (lands, inside))
    rank = c.rank(base)
    hit = g.add("view", (hit,), shape=[n if d == dim else 1 for d in range(rank)])
    spread = g.add("index_select", (c.t(src), idx), dim=dim)
    return g.add("where", (hit, spread, c.t(base)))


@converts(aten.copy.default)
def _copy(c: GraphConverter, node: FxNode, dst: FxNode, src: FxNode, non_blocking: bool = False
          ) -> int:
    """dst.copy_(src) written functionally: src's values in dst's dtype and shape (dst's own
    values are not read)."""
    x = c.t(src)
    if c.g.type_of(x).dtype != out_dtype(node):
        x = c.g.add("to_dtype", (x,), dtype=out_dtype(node))
    if list(c.g.type_of(x).shape) != out_shape(node):
        x = c.g.add("expand", (x,), shape=out_shape(node))
    return x


@converts(aten.empty.memory_format)
def _empty(c: GraphConverter, node: FxNode, size: list[int], **_: Any) -> int:
    # its values are unspecified (the model writes them before reading): zeros are as good
    return c.g.add("full", shape=out_shape(node), value=0.0, dtype=out_dtype(node))


@converts(aten.select.int)
def _select(c: GraphConverter, node: FxNode, x: FxNode, dim: int, index: int) -> int:
    shape = c.shape(x)
    dim = norm_dim(dim, len(shape))
    return c.g.add("select", (c.t(x),), dim=dim, index=norm_dim(index, shape[dim]))


@converts(aten.cat.default)
def _cat(c: GraphConverter, node: FxNode, xs: list[FxNode], dim: int = 0) -> int:
    parts = [x for x in xs if not is_empty(x)]  # empty pieces add nothing (output non-empty)
    return c.g.add("cat", [c.t(x) for x in parts], dim=norm_dim(dim, len(out_shape(node))))


@converts(aten.split_with_sizes.default, aten.split.Tensor)
def _split(c: GraphConverter, node: FxNode, x: FxNode, sizes: Any, dim: int = 0) -> tuple:
    shape = c.shape(x)
    dim = norm_dim(dim, len(shape))
    if isinstance(sizes, int):
        sizes = [min(sizes, shape[dim] - s) for s in range(0, shape[dim], sizes)]
    pieces, start = [], 0
    for s in sizes:
        pieces.append(c.g.add("slice", (c.t(x),), dim=dim, start=start, end=start + s, step=1))
        start += s
    return tuple(pieces)


@converts(aten.mm.default)
def _mm(c: GraphConverter, node: FxNode, a: FxNode, b: FxNode) -> int:
    return c.g.add("mm", (c.t(a), c.t(b)), alpha=1.0)


@converts(aten.bmm.default)
def _bmm(c: GraphConverter, node: FxNode, a: FxNode, b: FxNode) -> int:
    return c.g.add("bmm", (c.t(a), c.t(b)), alpha=1.0)


@converts(aten.addmm.default)
def _addmm(c: GraphConverter, node: FxNode, bias: FxNode, a: FxNode, b: FxNode, *,
           beta: float = 1, alpha: float = 1) -> int:
    return c.g.add("addmm", (c.t(bias), c.t(a), c.t(b)), beta=float(beta), alpha=float(alpha))


@converts(aten.matmul.default)
def _matmul(c: GraphConverter, node: FxNode, a: FxNode, b: FxNode) -> int:
    if c.rank(b) > c.rank(a) or c.rank(a) < 2:
        raise Unsupported  # broadcasting a lower-rank left side: run in torch
    return c.g.add("matmul", (c.t(a), c.t(b)), alpha=1.0)


@converts(aten.linear.default)
def _linear(c: GraphConverter, node: FxNode, x: FxNode, w: FxNode, b: FxNode | None = None) -> int:
    if b is None:
        return c.g.add("linear", (c.t(x), c.t(w)))
    return c.g.add("linear_bias", (c.t(x), c.t(w), c.t(b)))


def _binary(op: str) -> Converter:
    def convert(c: GraphConverter, node: FxNode, a: Any, b: Any, *, alpha: Any = 1) -> int:
        if alpha != 1:  # add/sub(a, b, alpha) = a +/- alpha * b
            b_id = c.g.add("mul", (c.t(b), c.t(alpha)))
            return c.g.add(op, (c.t(a), b_id))
        return c.g.add(op, (c.t(a), c.t(b)))
    return convert


for _op, _targets in {
    "add": (aten.add.Tensor, aten.add.Scalar), "sub": (aten.sub.Tensor, aten.sub.Scalar),
    "mul": (aten.mul.Tensor, aten.mul.Scalar), "div": (aten.div.Tensor, aten.div.Scalar),
    "pow": (aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar),
    "eq": (aten.eq.Tensor, aten.eq.Scalar), "ne": (aten.ne.Tensor, aten.ne.Scalar),
    "lt": (aten.lt.Tensor, aten.lt.Scalar), "le": (aten.le.Tensor, aten.le.Scalar),
    "gt": (aten.gt.Tensor, aten.gt.Scalar), "ge": (aten.ge.Tensor, aten.ge.Scalar),
    "logical_and": (aten.logical_and.default,), "logical_or": (aten.logical_or.default,),
    "bitwise_and": (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar),
    "bitwise_or": (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar),
}.items():
    converts(*_targets)(_binary(_op))


@converts(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(c: GraphConverter, node: FxNode, a: Any, b: Any, *, alpha: Any = 1) -> int:
    return _binary("sub")(c, node, b, a, alpha=alpha)


def _number(c: GraphConverter, a: Any) -> Any:
    """A 0-d float constant (a tensor the model makes in forward, lifted by export: GPT-Neo's
    `torch.finfo(dtype).min`) as the Python number it holds, so that the rules see its value;
    anything else as it is. Promotion is unchanged: a 0-d tensor, like a number, does not
    raise a tensor's float dtype."""
    v = c.env.get(a) if isinstance(a, FxNode) else None
    while isinstance(v, int) and c.g.node(v).op == "clone":  # lift_fresh_copy, detach
        v = c.g.node(v).inputs[0]
    if isinstance(v, int) and c.g.node(v).op == "const":
        t = c.g.constants.get(c.g.node(v).attrs["name"])
        if isinstance(t, torch.Tensor) and t.dim() == 0 and t.is_floating_point() and \
                t.device.type != "meta":
            return float(t)
    return a


def _filled(c: GraphConverter, a: Any) -> int:
    """A 0-d float constant as a `full` of the value it holds (so that the rules see it, as
    XGLM's `maximum(scores, finfo.min)`); anything else as it is."""
    value = _number(c, a)
    if isinstance(value, float) and isinstance(a, FxNode):
        return c.g.add("full", shape=[], value=value, dtype=out_dtype(a))
    return c.t(a)


@converts(aten.maximum.default, aten.minimum.default)
def _maximum_minimum(c: GraphConverter, node: FxNode, a: Any, b: Any) -> int:
    op = "maximum" if node.target is aten.maximum.default else "minimum"
    return c.g.add(op, (_filled(c, a), _filled(c, b)))


@converts(aten.where.self)
def _where(c: GraphConverter, node: FxNode, cond: FxNode, a: Any, b: Any) -> int:
    return c.g.add("where", (c.t(cond), c.t(_number(c, a)), c.t(_number(c, b))))


@converts(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(c: GraphConverter, node: FxNode, x: FxNode, mask: FxNode, value: Any) -> int:
    return c.g.add("where", (c.t(mask), c.t(value), c.t(x)))


def _unary(op: str) -> Converter:
    def convert(c: GraphConverter, node: FxNode, x: FxNode) -> int:
        return c.g.add(op, (c.t(x),))
    return convert


for _op in UNARY:  # each the aten op of its name
    converts(getattr(aten, _op).default)(_unary(_op))


@converts(aten.gelu.default)
def _gelu(c: GraphConverter, node: FxNode, x: FxNode, approximate: str = "none") -> int:
    return c.g.add("gelu", (c.t(x),), approximate=approximate)


@converts(aten.triu.default, aten.tril.default)
def _tri(c: GraphConverter, node: FxNode, x: FxNode, diagonal: int = 0) -> int:
    return c.g.add(node.target.__name__.split(".")[0], (c.t(x),), diagonal=diagonal)


def _reduction(op: str) -> Converter:
    def convert(c: GraphConverter, node: FxNode, x: FxNode, dims: Any = None,
                keepdim: bool = False, *, dtype: Any = None) -> int:
        r, xs = c.rank(x), c.t(x)
        if dtype is not None:  # torch converts the input, then reduces in that dtype
            xs = c.g.add("to_dtype", (xs,), dtype=out_dtype(node))
        return c.g.add(op, (xs,), dims=_dims(dims, r), keepdim=bool(keepdim))
    return convert


def _dims(dims: Any, rank: int) -> list[int]:
    """A reduction's dims, non-negative and sorted (none or [] = all)."""
    dims = list(range(rank)) if dims is None or dims == [] else dims
    dims = [dims] if isinstance(dims, int) else dims
    return sorted(norm_dim(d, rank) for d in dims)


converts(aten.sum.dim_IntList, aten.sum.default)(_reduction("sum"))
converts(aten.mean.dim, aten.mean.default)(_reduction("mean"))
converts(aten.amax.default)(_reduction("amax"))
converts(aten.amin.default)(_reduction("amin"))
converts(aten.any.dim, aten.any.dims, aten.any.default)(_reduction("any"))


@converts(aten.var.correction)
def _var(c: GraphConverter, node: FxNode, x: FxNode, dims: Any = None, *, correction: Any = None,
         keepdim: bool = False) -> int:
    """var(x) = sum((x - mean(x))^2) / (N - correction) over dims, as torch computes it."""
    if c.g.type_of(c.t(x)).dtype not in ("float32", "float64"):
        raise Unsupported  # (torch computes a half dtype's variance in float32)
    shape, dims = c.shape(x), _dims(dims, c.rank(x))
    n = math.prod(shape[d] for d in dims) - (1.0 if correction is None else float(correction))
    mean = c.g.add("mean", (c.t(x),), dims=dims, keepdim=True)
    dev = c.g.add("sub", (c.t(x), mean))
    squares = c.g.add("sum", (c.g.add("mul", (dev, dev)),), dims=dims, keepdim=bool(keepdim))
    return c.g.add("div", (squares, c.t(max(n, 0.0))))


@converts(aten.clamp.default, aten.clamp.Tensor)
def _clamp(c: GraphConverter, node: FxNode, x: FxNode, lo: Any = None, hi: Any = None) -> int:
    """clamp(x, lo, hi) with number or tensor bounds on a float tensor: maximum / minimum
    with them (NaN stays NaN in both)."""
    dtype = c.g.type_of(c.t(x)).dtype
    if not dtype.startswith(("float", "bfloat")) or not all(
            isinstance(b, (int, float, FxNode)) or b is None for b in (lo, hi)):
        raise Unsupported
    out = c.t(x)
    for op, bound in (("maximum", lo), ("minimum", hi)):
        if isinstance(bound, FxNode):
            if c.g.type_of(c.t(bound)).dtype != dtype:
                raise Unsupported  # (torch promotes; not expressed here)
            out = c.g.add(op, (out, c.t(bound)))
        elif bound is not None:
            out = c.g.add(op, (out, c.g.add("full", shape=[], value=float(bound),
                                            dtype=dtype)))
    return out


@converts(aten.max.dim, aten.min.dim)
def _max_dim(c: GraphConverter, node: FxNode, x: FxNode, dim: int, keepdim: bool = False) -> tuple:
    # (values, indices) as two ops, each made only where it is read: amax / amin (attention
    # sinks subtract the row max) and argmax / argmin (a router's choice; the first extreme)
    largest, d = node.target == aten.max.dim, norm_dim(dim, c.rank(x))
    read = {u.args[1] for u in node.users}
    values = c.g.add("amax" if largest else "amin", (c.t(x),), dims=[d],
                     keepdim=bool(keepdim)) if 0 in read else None
    indices = c.g.add("argmax" if largest else "argmin", (c.t(x),), dim=d,
                      keepdim=bool(keepdim)) if 1 in read else None
    pieces = (values, indices)
    for u in node.users:
        c._check(u, pieces[u.args[1]])
    return pieces


@converts(aten._softmax.default, aten._log_softmax.default, aten.softmax.int,
          aten.log_softmax.int)
def _softmax(c: GraphConverter, node: FxNode, x: FxNode, dim: int, half_to_float: Any = False,
             **_: Any) -> int:
    if half_to_float not in (False, None):
        raise Unsupported
    op = "log_softmax" if "log" in str(node.target) else "softmax"
    return c.g.add(op, (c.t(x),), dim=norm_dim(dim, c.rank(x)))


@converts(aten.cumsum.default)
def _cumsum(c: GraphConverter, node: FxNode, x: FxNode, dim: int, *, dtype: Any = None) -> int:
    if dtype is not None:
        raise Unsupported
    return c.g.add("cumsum", (c.t(x),), dim=norm_dim(dim, c.rank(x)))


@converts(aten.native_layer_norm.default)
def _native_layer_norm(c: GraphConverter, node: FxNode, x: FxNode, normalized_shape: list[int],
                       w: FxNode | None, b: FxNode | None, eps: float) -> tuple:
    if any(u.args[1] != 0 for u in node.users):
        raise Unsupported  # the mean/rstd outputs run in torch
    out = c.g.add("layer_norm", (c.t(x), *_affine(c, x, normalized_shape, w, b)),
                  normalized_shape=list(normalized_shape), eps=float(eps))
    c._check(next(iter(node.users)), out)
    return (out, None, None)


@converts(aten.layer_norm.default)
def _layer_norm(c: GraphConverter, node: FxNode, x: FxNode, normalized_shape: list[int],
                w: FxNode | None = None, b: FxNode | None = None, eps: float = 1e-5,
                *_: Any) -> int:
    return c.g.add("layer_norm", (c.t(x), *_affine(c, x, normalized_shape, w, b)),
                   normalized_shape=list(normalized_shape), eps=float(eps))


def _affine(c: GraphConverter, x: FxNode, shape: list[int], w: FxNode | None,
            b: FxNode | None) -> tuple[int, int]:
    """A layer norm's weight and bias; a missing one is the identity (ones / zeros), which
    is what torch computes without it (x * 1 + 0 is exact)."""
    dtype = c.g.type_of(c.t(x)).dtype

    def given_or(a: FxNode | None, value: float) -> int:
        return c.t(a) if a is not None else c.g.add("full", shape=list(shape), value=value,
                                                      dtype=dtype)
    return given_or(w, 1.0), given_or(b, 0.0)


@converts(aten.embedding.default)
def _embedding(c: GraphConverter, node: FxNode, w: FxNode, ids: FxNode, *rest: Any) -> int:
    return c.g.add("embedding", (c.t(w), c.t(ids)))


@converts(aten.index_select.default)
def _index_select(c: GraphConverter, node: FxNode, x: FxNode, dim: int, idx: FxNode) -> int:
    return c.g.add("index_select", (c.t(x), c.t(idx)), dim=norm_dim(dim, c.rank(x)))


@converts(aten.index.Tensor)
def _index(c: GraphConverter, node: FxNode, x: FxNode, indices: list[FxNode | None]) -> int:
    positions = [i for i, t in enumerate(indices) if t is not None]
    inputs = [c.t(x)] + [c.t(indices[i]) for i in positions]
    return c.g.append("index", tuple(inputs), {"positions": positions},
                      value_type(node.meta["val"]))


@converts(aten.full.default)
def _full(c: GraphConverter, node: FxNode, size: list[int], value: Any, **_: Any) -> int:
    return c.g.add("full", shape=out_shape(node), value=float(value), dtype=out_dtype(node))


@converts(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default)
def _full_like(c: GraphConverter, node: FxNode, x: FxNode, *args: Any, **_: Any) -> int:
    # only x's shape and dtype are read: a shape-only constant
    value = args[0] if node.target == aten.full_like.default else \
        float("zeros" not in str(node.target))
    return c.g.add("full", shape=out_shape(node), value=float(value), dtype=out_dtype(node))


@converts(aten.gather.default)
def _gather(c: GraphConverter, node: FxNode, x: FxNode, dim: int, idx: FxNode, **kw: Any) -> int:
    if kw.get("sparse_grad"):
        raise Unsupported
    return c.g.append("gather", (c.t(x), c.t(idx)), {"dim": norm_dim(dim, c.rank(x))},
                      value_type(node.meta["val"]))


@converts(aten.scalar_tensor.default)
def _scalar_tensor(c: GraphConverter, node: FxNode, value: Any, **_: Any) -> int:
    return c.g.add("full", shape=[], value=float(value), dtype=out_dtype(node))


@converts(aten.zeros.default, aten.ones.default)
def _zeros_ones(c: GraphConverter, node: FxNode, size: list[int], **_: Any) -> int:
    value = 0.0 if "zeros" in str(node.target) else 1.0
    return c.g.add("full", shape=out_shape(node), value=value, dtype=out_dtype(node))


@converts(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(c: GraphConverter, node: FxNode, *args: Any, **_: Any) -> int:
    if node.target == aten.arange.default:
        start, end, step = 0, args[0], 1
    else:
        start, end, step = (list(args) + [1])[:3]
    out = value_type(node.meta["val"])
    return c.g.append("arange", (), {"start": float(start), "end": float(end),
                                     "step": float(step), "dtype": out.dtype}, out)


@converts(aten.scaled_dot_product_attention.default,
          aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa(c: GraphConverter, node: FxNode, q: FxNode, k: FxNode, v: FxNode, *args: Any,
          **kwargs: Any) -> Any:
    flash = node.target != aten.scaled_dot_product_attention.default
    names = ("dropout_p", "is_causal") if flash else ("attn_mask", "dropout_p", "is_causal")
    bound = dict(zip(names, args)) | kwargs
    if bound.get("dropout_p", 0.0) != 0.0 or (
            flash and any(u.args[1] != 0 for u in node.users)):
        raise Unsupported
    scale = bound.get("scale") or 1.0 / (c.shape(q)[-1] ** 0.5)
    mask = bound.get("attn_mask")
    if mask is not None:
        if bound.get("is_causal"):
            raise Unsupported
        out = c.g.add("sdpa_masked", (c.t(q), c.t(k), c.t(v), c.t(mask)), scale=float(scale))
    else:
        out = c.g.add("sdpa", (c.t(q), c.t(k), c.t(v)), is_causal=bool(bound.get("is_causal")),
                      scale=float(scale))
    return (out, None) if flash else out


@converts(aten.topk.default)
def _topk(c: GraphConverter, node: FxNode, x: FxNode, k: int, dim: int = -1,
          largest: bool = True, sorted: bool = True) -> tuple:
    # (values, indices) as two ops; unsorted results may come in any order, so sorted ones
    # are among them
    attrs = {"k": int(k), "dim": norm_dim(dim, c.rank(x)), "largest": bool(largest)}
    vals = node.meta["val"]
    return tuple(c.g.append(op, (c.t(x),), attrs, value_type(v))
                 for op, v in zip(("topk_values", "topk_indices"), vals))


@converts(torch.ops.eqsat_llm.expert_mm.default)
def _expert_mm(c: GraphConverter, node: FxNode, x: FxNode, w: FxNode, ids: FxNode) -> int:
    return add_expert_mm(c.g, c.t(x), c.t(w), c.t(ids))


@converts(aten.scatter.value)
def _scatter_value(c: GraphConverter, node: FxNode, x: FxNode, dim: int, index: FxNode,
                   value: Any) -> int:
    if not isinstance(value, (int, float, bool)):
        raise Unsupported
    return c.g.add("scatter_value", (c.t(x), c.t(index)), dim=norm_dim(dim, c.rank(x)),
                   value=float(value))
