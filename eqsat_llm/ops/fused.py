"""Fused ops that the rules recognise. Each reference spells out the decomposition it replaces,
so a recognised program is bit-identical to the captured one, and its `parts` list the ops
that reference runs (what it costs when torch runs the reference, op by op)."""

from __future__ import annotations

from typing import Any

import torch

from ..tensor_type import TensorType
from . import draws
from .attention import kv_heads
from .matmul import scaled
from .registry import COPY_IN, TRANSCENDENTAL, Part, operands_of, register

PY = TensorType((), "py_float")  # a Python number operand: moves nothing


def rms_norm(xs: list[Any], a: dict[str, Any]) -> Any:
    """x / rms(x) * w; a half x normalised in float32 and rounded back before the weight, as
    the LLaMA family's RMSNorm writes it (rules/fusion.py "rms-norm-half")."""
    x, w = xs
    if x.dtype in (torch.float16, torch.bfloat16):
        x32 = x.float()
        return w * (x32 * torch.rsqrt(torch.mean(torch.pow(x32, 2), [-1], keepdim=True) +
                                      a["eps"])).to(x.dtype)
    return x * torch.rsqrt(torch.mean(torch.pow(x, 2), [-1], keepdim=True) + a["eps"]) * w


def rms_norm_parts(a: dict[str, Any], ins: list[TensorType], out: TensorType) -> list[Part]:
    x, w = ins
    r = TensorType(x.shape[:-1] + (1,), x.dtype)
    return [("pow", {}, [x, PY], x), ("mean", {}, [x], r), ("add", {}, [r, PY], r),
            ("rsqrt", {}, [r], r), ("mul", {}, [x, r], x), ("mul", {}, [x, w], out)]


def _swiglu_parts(a: dict[str, Any], ins: list[TensorType], out: TensorType) -> list[Part]:
    x, y = ins
    return [("sigmoid", {}, [x], x), ("mul", {}, [x, x], x), ("mul", {}, [x, y], out)]


def softcapped(scores: torch.Tensor, cap: float) -> torch.Tensor:
    # logit softcapping (Gemma 2): cap * tanh(s), spelled as the models spell it; 0: none
    return scores if not cap else torch.tanh(scores) * cap


def _attention(xs: list[Any], a: dict[str, Any]) -> Any:
    # softmax([softcap(q @ k^T * scale) + bias, sink]) @ [v; 0]: bias is additive (-inf where
    # masked); the sink (attention sinks, GPT-OSS: a logit per head and query row, -inf for
    # none) joins each row's softmax as a key whose value is zero, as the models spell it. As
    # in sdpa, k and v may have fewer heads than q (grouped-query attention), and a query row
    # that sees no key (every score and the sink -inf) is zero, where the formula gives NaN.
    x = operands_of("attention", xs)
    q, bias, sinks = x.q, x.bias, x.sinks
    k, v = kv_heads(q, x.k), kv_heads(q, x.v)
    scores = scaled(torch.matmul(q, k.transpose(-2, -1)), a["scale"])
    scores = softcapped(scores, a.get("softcap", 0.0)) + bias
    if isinstance(sinks, torch.Tensor) or sinks != float("-inf"):
        column = (sinks if isinstance(sinks, torch.Tensor) else torch.full(
            (), sinks, dtype=scores.dtype, device=scores.device)).expand(scores.shape[:-1] + (1,))
        scores = torch.cat([scores, column], -1)
        probs = torch.softmax(scores, -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    out = torch.matmul(probs, v)
    blind = (scores == float("-inf")).all(-1, keepdim=True)
    return out.masked_fill(blind, 0.0)


def _attention_parts(a: dict[str, Any], ins: list[TensorType], out: TensorType) -> list[Part]:
    x = operands_of("attention", ins)
    q, k, v, bias = x.q, x.k, x.v, x.bias
    kt = TensorType(k.shape[:-2] + (k.shape[-1], k.shape[-2]), k.dtype)  # a view
    s = TensorType(out.shape[:-1] + (k.shape[-2],), out.dtype)
    parts: list[Part] = [("matmul", {"alpha": 1.0}, [q, kt], s)]
    if a.get("scale", 1.0) != 1.0:
        parts.append(("mul", {}, [s, PY], s))
    if a.get("softcap", 0.0):
        parts += [("tanh", {}, [s], s), ("mul", {}, [s, PY], s)]
    return parts + [("add", {}, [s, bias], s), ("softmax", {}, [s], s),
                    ("matmul", {"alpha": 1.0}, [s, v], out)]


def _rope(xs: list[Any], a: dict[str, Any]) -> Any:
    # rotary embedding: x * cos + rotate_half(x) * sin, the decomposition that
    # rules/fusion.py recognises, spelled the same way (bit-identical)
    x, cos, sin = xs
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def _rope_parts(a: dict[str, Any], ins: list[TensorType], out: TensorType) -> list[Part]:
    x, cos, sin = ins
    half = TensorType(x.shape[:-1] + (x.shape[-1] // 2,), x.dtype)  # slices: views
    return [("neg", {}, [half], half), ("cat", {"dim": -1}, [half, half], x),
            ("mul", {}, [x, sin], out), ("mul", {}, [x, cos], out), ("add", {}, [out, out], out)]


# rms_norm: two passes (the sum of squares; normalise and scale); rope: two multiplies, a
# negation and an add per element (x read twice, at j and at its partner j +- D/2, in one
# kernel). Their references make temporaries: no writer computes them in place.
register("rms_norm", 2, "eps:float", ref=rms_norm, category="reduction", shape="same",
         cost="vector", flops=6.0, parts=rms_norm_parts, writer=COPY_IN, draw=draws.norm)
def swiglu(xs: list[Any], a: dict[str, Any]) -> Any:
    """silu(g) * u; a half g's silu computed in float32 and rounded back before the product,
    as torch's silu and its decomposition do (rules/fusion.py "swiglu-half")."""
    g, u = xs
    if g.dtype in (torch.float16, torch.bfloat16):
        g32 = g.float()
        return (g32 * torch.sigmoid(g32)).to(g.dtype) * u
    return g * torch.sigmoid(g) * u


register("swiglu", 2, ref=swiglu,
         category="elementwise", shape="broadcast", dtype="same", cost="vector",
         flops=TRANSCENDENTAL + 2, parts=_swiglu_parts, writer=COPY_IN)
register("attention", 5, "scale:float softcap:float", ref=_attention, category="attention",
         shape="sdpa", cost="attention", parts=_attention_parts, writer=COPY_IN, stride_free=True,
         operands="q k v bias sinks", draw=draws.attention(bool_mask=False))
register("rope", 3, ref=_rope, category="elementwise", shape="broadcast", dtype="same",
         cost="vector", flops=4.0, parts=_rope_parts, writer=COPY_IN)
