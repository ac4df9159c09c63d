"""The one GEMM op: a matmul with its prologue, weight format and epilogue (the fusion,
quantization, sparsity and half-precision rules build it)."""

from __future__ import annotations

from typing import Any

import torch

from .. import sparse_formats
from ..errors import GraphError
from ..half_formats import WEIGHT_FORMATS as HALF_FORMATS
from ..quant_formats import DYNAMIC, FORMATS, coded_activations, dequantize
from ..tensor_type import TensorType
from .activations import ACTIVATIONS
from .fused import rms_norm, rms_norm_parts
from .matmul import scaled
from .registry import Part, operands_of, register

# gemm(x, w, w_scale, norm, addend) = act(epilogue(alpha * prologue(x) @ W)), one kernel:
#   prologue  "none" | "rms_norm": x is rms_norm(x, norm, eps) first
#   weight    "float": W = w, [K, N] | a quantized format (quant_formats.FORMATS): W is
#             dequantize(w, w_scale), w holding the integers and w_scale the scales | a sparse
#             format (sparse_formats.FORMATS): W is unpack(w, w_scale), w holding the stored
#             values and w_scale (here not scales) their positions | a half format
#             (half_formats.WEIGHT_FORMATS: "fp16", "bf16"): W is w, held in that dtype
#             (w_scale unused) | "int8_dynamic": W as "int8", and x's rows coded in 7 bits
#             and decoded first (quant_formats.coded_activations: the integer product's result)
#   epilogue  "none" | "add": + addend (it broadcasts into the product) | "bias":
#             torch.addmm(addend, x, W, beta, alpha) (x 2-D) | "swiglu": W = [Wg | Wu] with n
#             columns each, silu(x @ Wg) * (x @ Wu)
#   act       "none" or an activation of ACTIVATIONS, applied last
# n is the output's last dim. An operand the descriptor does not use is the scalar 0.0.
# The fusion rules build it from the decompositions it replaces, and its reference spells
# them out the same way (bit-identical for the float format).
GEMM_DEFAULTS = {"alpha": 1.0, "beta": 1.0, "eps": 0.0, "prologue": "none", "weight": "float",
                 "epilogue": "none", "act": "none"}  # every attribute but n
# the descriptor's parts a label names when not the default, in this order
GEMM_LABEL_PARTS = ("prologue", "weight", "epilogue", "act")
GEMM_PROLOGUES = ("none", "rms_norm")
GEMM_EPILOGUES = ("none", "add", "bias", "swiglu")
GEMM_ACTS = ("none", *ACTIVATIONS)
GEMM_WEIGHTS = ("float", *FORMATS, DYNAMIC, *sparse_formats.FORMATS, *HALF_FORMATS)


def gemm_label(attrs: dict[str, Any]) -> str:
    """What reports call a gemm: its descriptor's parts that are not the default, gemm[rms_norm],
    gemm[add], gemm[bias+gelu_tanh], gemm[swiglu], gemm[int8+add]; a plain float gemm is
    "gemm"."""
    parts = [attrs[k] for k in GEMM_LABEL_PARTS if attrs.get(k, GEMM_DEFAULTS[k]) !=
             GEMM_DEFAULTS[k]]
    return f"gemm[{'+'.join(parts)}]" if parts else "gemm"


def _gemm(xs: list[Any], a: dict[str, Any]) -> Any:
    g = operands_of("gemm", xs)
    x, w, w_scale, norm, addend = g.x, g.w, g.w_scale, g.norm, g.addend
    if a["prologue"] == "rms_norm":
        x = rms_norm([x, norm], a)
    fmt, epilogue, alpha = a["weight"], a["epilogue"], a["alpha"]
    if fmt in sparse_formats.FORMATS:
        n = a["n"] * (2 if epilogue == "swiglu" else 1)
        weight = sparse_formats.unpack(w, w_scale, fmt, x.shape[-1], n).to(x.dtype)
    elif fmt in HALF_FORMATS:
        weight = w.to(x.dtype)
    elif fmt == DYNAMIC:
        x, weight = coded_activations(x), dequantize(w, w_scale, "int8").to(x.dtype)
    else:
        weight = w if fmt == "float" else dequantize(w, w_scale, fmt).to(x.dtype)
    if epilogue == "bias":
        y = torch.addmm(addend, x, weight, beta=a["beta"], alpha=alpha)
    elif epilogue == "swiglu":
        n = a["n"]
        g = scaled(torch.matmul(x, weight[:, :n]), alpha)
        y = g * torch.sigmoid(g) * scaled(torch.matmul(x, weight[:, n:]), alpha)
    else:
        y = scaled(torch.matmul(x, weight), alpha)
        if epilogue == "add":
            y = y + addend
    return y if a["act"] == "none" else ACTIVATIONS[a["act"]].ref(y)


def _gemm_type(ins: list[TensorType], a: dict[str, Any]) -> TensorType:
    x = ins[0]
    for name, allowed in (("prologue", GEMM_PROLOGUES), ("epilogue", GEMM_EPILOGUES),
                          ("act", GEMM_ACTS), ("weight", GEMM_WEIGHTS)):
        if a[name] not in allowed:
            raise GraphError(f"gemm: {name} {a[name]!r} is not one of {allowed}")
    if not x.shape:
        raise GraphError(f"gemm: x {x} is not a matrix")
    return TensorType(x.shape[:-1] + (a["n"],), x.dtype)


def gemm_writes_in_place(a: dict[str, Any]) -> bool:
    """Whether `_write` computes this descriptor in its buffer (the planned runtime computes
    the others with the reference, which makes temporaries, then copies)."""
    return a["prologue"] == "none" and a["weight"] == "float" and a["epilogue"] != "swiglu"


def _write(out: torch.Tensor, xs: list[Any], a: dict[str, Any]) -> None:
    # the reference's own steps in the buffer: the product (addmm with its bias), its scale
    # (prepared: xs[5]), + the addend, then the activation in place
    g = operands_of("gemm", xs[:5])
    x, w, addend = g.x, g.w, g.addend
    if a["epilogue"] == "bias":
        torch.addmm(addend, x, w, beta=a["beta"], alpha=a["alpha"], out=out)
    else:
        torch.matmul(x, w, out=out)
        if a["alpha"] != 1.0:
            out.mul_(xs[5])
        if a["epilogue"] == "add":
            out.add_(addend)
    if a["act"] != "none":
        ACTIVATIONS[a["act"]].inplace(out)


def _parts(a: dict[str, Any], ins: list[TensorType], out: TensorType) -> list[Part]:
    """What gemm's reference runs: the prologue's norm, the weight's dequantization, the
    product(s), the epilogue's add and activation."""
    g = operands_of("gemm", ins)
    x, w, w_scale, norm, addend = g.x, g.w, g.w_scale, g.norm, g.addend
    k = x.shape[-1]
    weight = TensorType((k, out.shape[-1] * (2 if a["epilogue"] == "swiglu" else 1)), x.dtype)
    parts: list[Part] = []
    if a["prologue"] == "rms_norm":
        parts += rms_norm_parts({"eps": a["eps"]}, [x, norm], x)
    if a["weight"] == DYNAMIC:  # x's rows coded and decoded: a pass over x (and the range's)
        parts += [("mul", {}, [x, x], x)] * 2
    if a["weight"] in HALF_FORMATS:
        parts.append(("to_dtype", {"dtype": x.dtype}, [w], weight))
    elif a["weight"] != "float":
        parts.append(("mul", {}, [w, w_scale], weight))
    mm = {"alpha": a.get("alpha", 1.0)}
    if a["epilogue"] == "bias":
        parts.append(("addmm", {"beta": a["beta"], **mm}, [addend, x, weight], out))
    elif a["epilogue"] == "swiglu":
        half = TensorType((k, out.shape[-1]), x.dtype)
        parts += [("matmul", mm, [x, half], out), ("matmul", mm, [x, half], out),
                  ("swiglu", {}, [out, out], out)]
    else:
        parts.append(("matmul", mm, [x, weight], out))
        if a["epilogue"] == "add":
            parts.append(("add", {}, [out, addend], out))
    if a["act"] != "none":
        act, act_attrs = ACTIVATIONS[a["act"]].op, dict(ACTIVATIONS[a["act"]].attrs)
        parts.append((act, act_attrs, [out], out))
    return parts


register("gemm", 5, "n:int alpha:float beta:float eps:float prologue:str weight:str "
         "epilogue:str act:str", ref=_gemm, category="matmul", shape="gemm", cost="matmul",
         parts=_parts, writer=_write, infer=_gemm_type, operands="x w w_scale norm addend")


def add_gemm(graph: Any, x: int, w: int, *, w_scale: int | None = None, norm: int | None = None,
             addend: int | None = None, alpha: float = 1.0, beta: float = 1.0,
             eps: float = 0.0, prologue: str = "none", weight: str = "float",
             epilogue: str = "none", act: str = "none") -> int:
    """Append a gemm to `graph` (an ir.Graph), the unused operands as the scalar 0.0 and n from
    the weight (half its columns for the SwiGLU epilogue). Returns its id."""
    none = None
    operands = []
    for v in (w_scale, norm, addend):
        if v is None:
            none = none if none is not None else graph.add("scalar", value=0.0, kind="float")
            v = none
        operands.append(v)
    n = graph.type_of(w).shape[-1] // (2 if epilogue == "swiglu" else 1)
    return graph.add("gemm", (x, w, *operands), n=n, alpha=alpha, beta=beta, eps=eps,
                     prologue=prologue, weight=weight, epilogue=epilogue, act=act)


