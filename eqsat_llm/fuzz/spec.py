"""A fuzz model as data: a straight-line program over tensors that is JSON (so a failing model
can be saved as a regression test and read back) and a module that runs it.

A spec holds the model's inputs, parameters and buffers (shape, dtype; their values come from
the spec's seed), its steps `[op, [refs...], {kwargs}]` and its outputs. A ref names an input
("i0"), a parameter ("p0"), a buffer ("b0": state a step may write in place, as a KV cache)
or an earlier step's result ("v0"); `None` stands for an omitted optional tensor (a norm
without weight). Each op is one torch expression in OPS: the torch functions LLM code calls,
not the optimizer's IR, so the frontend is fuzzed too. The op "layers" is a stack of
identical modules (fuzz/layers.py), so that repeated layers are fuzzed as models have them."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .layers import layer_stack

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


def _sdpa(q, k, v, mask=None, *, causal=False, gqa=False, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=gqa, scale=scale)


def _rms_norm_by_hand(x, w=None, *, eps=1e-6):  # the form LLaMA-family modules write out
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def _causal_mask(*, s, t, value=None):
    """A causal mask [s, t] (bool, or additive with `value` where masked), built in forward as
    model code builds it: constant ops the frontend folds or captures."""
    keep = torch.ones(s, t, dtype=torch.bool).tril(t - s)
    if value is None:
        return keep
    return torch.zeros(s, t).masked_fill(~keep, value)


def _additive_mask(keep, *, value):
    """A boolean keep-mask as the additive bias model code builds (0 where kept)."""
    return torch.zeros(keep.shape).masked_fill(~keep, value)


def _slice_assign(buf, src, dim, start):
    """buf[..., start:start + n] = src along dim, as model code writes it; the buffer."""
    buf.narrow(dim, start, src.shape[dim]).copy_(src)
    return buf


# op name -> torch expression; tensors positional (refs), everything else keyword
OPS: dict[str, Callable[..., torch.Tensor]] = {
    # elementwise, one operand
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": F.relu, "silu": F.silu,
    "erf": torch.erf, "reciprocal": torch.reciprocal, "softplus": F.softplus,
    "gelu": lambda x, *, approximate="none": F.gelu(x, approximate=approximate),
    "square": lambda x: x * x,
    "pow": lambda x, *, exponent: x ** exponent,
    "add_scalar": lambda x, *, c: x + c, "mul_scalar": lambda x, *, c: x * c,
    "rsub_scalar": lambda x, *, c: c - x, "div_scalar": lambda x, *, c: x / c,
    "clamp": lambda x, *, lo, hi: torch.clamp(x, lo, hi),
    "to": lambda x, *, dtype: x.to(DTYPES[dtype]),
    # elementwise, two operands (broadcasting)
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "gt": torch.gt, "lt": torch.lt, "ge": torch.ge, "le": torch.le, "eq": torch.eq,
    "ne": torch.ne, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_not": torch.logical_not,
    "where": torch.where,
    "masked_fill": lambda x, m, *, value: x.masked_fill(m, value),
    # reductions and rows
    "sum": lambda x, *, dim, keepdim: x.sum(dim, keepdim=keepdim),
    "mean": lambda x, *, dim, keepdim: x.mean(dim, keepdim=keepdim),
    "amax": lambda x, *, dim, keepdim: x.amax(dim, keepdim=keepdim),
    "amin": lambda x, *, dim, keepdim: x.amin(dim, keepdim=keepdim),
    "softmax": lambda x, *, dim: torch.softmax(x, dim),
    "log_softmax": lambda x, *, dim: torch.log_softmax(x, dim),
    "cumsum": lambda x, *, dim: torch.cumsum(x, dim),
    "layer_norm": lambda x, w=None, b=None, *, eps=1e-5: F.layer_norm(x, x.shape[-1:], w, b,
                                                                      eps),
    "rms_norm": lambda x, w=None, *, eps=1e-6: F.rms_norm(x, x.shape[-1:], w, eps),
    "rms_norm_by_hand": _rms_norm_by_hand,
    # layout
    "reshape": lambda x, *, shape: x.reshape(shape),
    "permute": lambda x, *, dims: x.permute(dims),
    "transpose": lambda x, *, d0, d1: x.transpose(d0, d1),
    "unsqueeze": lambda x, *, dim: x.unsqueeze(dim),
    "slice": lambda x, *, dim, start, stop, step: x[(slice(None),) * dim
                                                     + (slice(start, stop, step),)],
    "select": lambda x, *, dim, index: x.select(dim, index),
    "chunk": lambda x, *, chunks, dim, k: x.chunk(chunks, dim)[k],
    "cat": lambda *xs, dim: torch.cat(xs, dim),
    "expand": lambda x, *, shape: x.expand(shape),
    "contiguous": lambda x: x.contiguous(),
    "flatten": lambda x, *, start: x.flatten(start),
    "tril": lambda x, *, diagonal: torch.tril(x, diagonal),
    "triu": lambda x, *, diagonal: torch.triu(x, diagonal),
    # matmuls
    "matmul": torch.matmul, "bmm": torch.bmm,
    "linear": lambda x, w, b=None: F.linear(x, w, b),
    # gathers
    "embedding": lambda ids, w: F.embedding(ids, w),
    "index_select": lambda x, idx, *, dim: torch.index_select(x, dim, idx),
    "gather": lambda x, idx, *, dim: torch.gather(x, dim, idx),
    # attention
    "sdpa": _sdpa,
    "causal_mask": _causal_mask,
    "additive_mask": _additive_mask,
    # state, positions and routing (mostly outside the registry: they run as torch steps)
    "index_copy_": lambda buf, idx, src, *, dim: buf.index_copy_(dim, idx, src),
    "index_put_": lambda buf, idx, src: buf.index_put_((idx,), src),  # buf[idx] = src
    "slice_assign_": lambda buf, src, *, dim, start: _slice_assign(buf, src, dim, start),
    "add_": lambda buf, *, c: buf.add_(c),  # count += 1
    "mul_": lambda buf, *, c: buf.mul_(c),
    "positions": lambda start, *, n: start + torch.arange(n),
    "arange": lambda *, n: torch.arange(n),
    "zeros": lambda *, shape: torch.zeros(shape),
    "topk": lambda x, *, k, part: torch.topk(x, k, -1)[part],
    "argmax": lambda x, *, dim: torch.argmax(x, dim),
    "scatter_add": lambda x, idx, src, *, dim: torch.scatter_add(x, dim, idx, src),
    "index_add": lambda x, idx, src, *, dim: torch.index_add(x, dim, idx, src),
    # integers
    "floor_divide": lambda x, *, c: torch.div(x, c, rounding_mode="floor"),
    "remainder": lambda x, *, c: torch.remainder(x, c),
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
}


@dataclass
class Tensor:
    """An input or parameter: its shape and dtype. Integer inputs are drawn in [0, high)."""
    shape: list[int]
    dtype: str = "float32"
    high: int = 0  # integers: the exclusive bound of the values
    special: bool = False  # floats: some entries are NaN, +inf or -inf
    seed: int = 0  # its values' own seed, so they stay put when a shrink drops other tensors


@dataclass
class Spec:
    inputs: list[Tensor] = field(default_factory=list)
    params: list[Tensor] = field(default_factory=list)
    steps: list[tuple[str, list[str | None], dict[str, Any]]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    seed: int = 0
    buffers: list[Tensor] = field(default_factory=list)

    def to_json(self) -> str:
        d = {"inputs": [vars(t) for t in self.inputs], "params": [vars(t) for t in self.params],
             "steps": [list(s) for s in self.steps], "outputs": self.outputs, "seed": self.seed}
        if self.buffers:  # (older regression files have none)
            d["buffers"] = [vars(t) for t in self.buffers]
        return json.dumps(d, indent=1)

    @staticmethod
    def from_json(text: str) -> Spec:
        d = json.loads(text)
        return Spec([Tensor(**t) for t in d["inputs"]], [Tensor(**t) for t in d["params"]],
                    [(op, list(refs), dict(kw)) for op, refs, kw in d["steps"]],
                    list(d["outputs"]), int(d.get("seed", 0)),
                    [Tensor(**t) for t in d.get("buffers", [])])

    def copy(self) -> Spec:
        return copy.deepcopy(self)

    def dtypes(self) -> set[torch.dtype]:
        """The dtypes its tensors take: inputs', parameters' and those it casts to (no other
        op makes a dtype from nothing)."""
        names = {t.dtype for t in self.inputs + self.params + self.buffers}
        names |= {kw["dtype"] for op, _, kw in self.steps if op == "to"}
        return {DTYPES[n] for n in names}

    def describe(self) -> str:
        """The model as the Python a user would write."""
        lines = ["inputs: " + ", ".join(f"i{k}: {t.dtype}{t.shape}"
                                         + (" with NaN/inf" if t.special else "")
                                         for k, t in enumerate(self.inputs))]
        for prefix, tensors in (("p", self.params), ("b", self.buffers)):
            if tensors:
                lines.append(("params: " if prefix == "p" else "buffers: ") + ", ".join(
                    f"{prefix}{k}: {t.dtype}{t.shape}" for k, t in enumerate(tensors)))
        for k, (op, refs, kw) in enumerate(self.steps):
            args = [str(r) for r in refs] + [f"{a}={v!r}" for a, v in kw.items()]
            lines.append(f"v{k} = {op}({', '.join(args)})")
        lines.append("return " + ", ".join(self.outputs))
        return "\n".join(lines)


def make_tensor(t: Tensor, model_seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(model_seed * 100_003 + t.seed)
    dtype = DTYPES[t.dtype]
    if dtype == torch.bool:
        return torch.rand(t.shape, generator=gen) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(0, max(t.high, 1), t.shape, generator=gen, dtype=dtype)
    x = (torch.rand(t.shape, generator=gen) * 4 - 2) * scale
    if t.special and x.numel():
        flat = x.view(-1)
        picks = torch.randint(0, flat.numel(), (3,), generator=gen)
        for k, value in zip(picks.tolist(), (float("nan"), float("inf"), float("-inf"))):
            flat[k] = value
    return x.to(dtype)


class FuzzModel(nn.Module):
    """Runs a spec; parameters p0, p1, ... are the spec's, with values from its seed. `wide`:
    every float value in float64 (a cast still rounds to its dtype, then widens): the exact
    result the fuzzer measures rounding against."""

    def __init__(self, spec: Spec, wide: bool = False) -> None:
        super().__init__()
        self.spec = spec
        self.wide = wide
        for k, t in enumerate(spec.params):
            self.register_parameter(f"p{k}", nn.Parameter(self._widen(make_tensor(
                t, spec.seed, 0.5)), requires_grad=False))
        for k, t in enumerate(spec.buffers):
            self.register_buffer(f"b{k}", self._widen(make_tensor(t, spec.seed)))
        for k, (op, _, kw) in enumerate(spec.steps):
            if op == "layers":  # a stack of modules, s<k>
                stack = layer_stack(kw, spec.seed * 7919 + kw["seed"])  # (kept by a shrink)
                self.add_module(f"s{k}", stack.double() if wide else stack)

    def _widen(self, x: Any) -> Any:
        wide = self.wide and isinstance(x, torch.Tensor) and x.is_floating_point()
        return x.double() if wide else x

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env = self.values(*inputs)
        return tuple(env[r] for r in self.spec.outputs)

    def values(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every value of the program by its ref: inputs, parameters, each step's result."""
        env: dict[str | None, Any] = {f"i{k}": self._widen(x) for k, x in enumerate(inputs)}
        env.update({f"p{k}": getattr(self, f"p{k}") for k in range(len(self.spec.params))})
        env.update({f"b{k}": getattr(self, f"b{k}") for k in range(len(self.spec.buffers))})
        env[None] = None
        for k, (op, refs, kw) in enumerate(self.spec.steps):
            fn = getattr(self, f"s{k}") if op == "layers" else OPS[op]
            kw = {} if op == "layers" else kw
            env[f"v{k}"] = self._widen(fn(*(env[r] for r in refs), **kw))
        del env[None]
        return env


def make_inputs(spec: Spec) -> tuple[torch.Tensor, ...]:
    return tuple(make_tensor(t, spec.seed) for t in spec.inputs)
