"""The one GEMM op: a matmul with its prologue, weight format and epilogue (the fusion,
quantization, sparsity and half-precision rules build it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from ..errors import GraphError
from ..formats import sparse_formats
from ..formats.half_formats import WEIGHT_FORMATS as HALF_FORMATS
from ..formats.quant_formats import (
    DYNAMIC,
    DYNAMIC4,
    FORMATS,
    coded_activations,
    coded_blocks,
    dequantize,
)
from ..tensor_type import TensorType
from . import draws
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
#             | "int4_dynamic": W as "int4_g32", and x's blocks of 32 coded in 8 bits and
#             decoded first (quant_formats.coded_blocks)
#   epilogue  "none" | "add": + addend (it broadcasts into the product) | "bias":
#             torch.addmm(addend, x, W, beta, alpha) (x 2-D) | "swiglu": W = [Wg | Wu] with n
#             columns each, silu(x @ Wg) * (x @ Wu)
#   act       "none" or an activation of ACTIVATIONS, applied last
# n is the output's last dim. An operand the descriptor does not use is the scalar 0.0.
# The fusion rules build it from the decompositions it replaces, and its reference spells
# them out the same way (bit-identical for the float format).
GEMM_PROLOGUES = ("none", "rms_norm")
GEMM_EPILOGUES = ("none", "add", "bias", "swiglu")
GEMM_ACTS = ("none", *ACTIVATIONS)
GEMM_WEIGHTS = ("float", *FORMATS, DYNAMIC, DYNAMIC4, *sparse_formats.FORMATS,
                *HALF_FORMATS)


@dataclass(frozen=True)
class GemmDescriptor:
    """A gemm node's attributes as one value: each as the comment above says, with its
    default, and what the consumers ask of them (the label, which operands the kernel reads,
    whether the planned runtime writes it in place)."""

    n: int
    alpha: float = 1.0
    beta: float = 1.0
    eps: float = 0.0
    prologue: str = "none"
    weight: str = "float"
    epilogue: str = "none"
    act: str = "none"

    @classmethod
    def of(cls, attrs: Mapping[str, Any]) -> GemmDescriptor:
        """The descriptor of a gemm's attributes (those not given: their defaults)."""
        return cls(**{f.name: attrs[f.name] for f in fields(cls) if f.name in attrs})

    def check(self) -> None:
        for name, allowed in (("prologue", GEMM_PROLOGUES), ("epilogue", GEMM_EPILOGUES),
                              ("act", GEMM_ACTS), ("weight", GEMM_WEIGHTS)):
            if getattr(self, name) not in allowed:
                raise GraphError(f"gemm: {name} {getattr(self, name)!r} is not one of {allowed}")

    @property
    def label(self) -> str:
        """What reports call it: its parts that are not the default, gemm[rms_norm], gemm[add],
        gemm[bias+gelu_tanh], gemm[swiglu], gemm[int8+add]; a plain float gemm is "gemm"."""
        parts = [getattr(self, k) for k in ("prologue", "weight", "epilogue", "act")
                 if getattr(self, k) != GEMM_DEFAULTS[k]]
        return f"gemm[{'+'.join(parts)}]" if parts else "gemm"

    @property
    def normed(self) -> bool:  # the rms_norm prologue
        return self.prologue == "rms_norm"

    @property
    def swiglu(self) -> bool:
        return self.epilogue == "swiglu"

    @property
    def stored(self) -> bool:  # a weight held in a format (not a float matrix)
        return self.weight != "float"

    @property
    def half(self) -> bool:
        return self.weight in HALF_FORMATS

    @property
    def sparse(self) -> bool:
        return self.weight in sparse_formats.FORMATS

    @property
    def dynamic(self) -> bool:  # int8 weights, activations coded per row
        return self.weight == DYNAMIC

    @property
    def dynamic4(self) -> bool:  # int4_g32 weights, activations coded per block of 32
        return self.weight == DYNAMIC4

    @property
    def columns(self) -> int:
        """The weight's columns: n, or 2 n for SwiGLU's gate and up halves."""
        return self.n * (2 if self.swiglu else 1)

    @property
    def writes_in_place(self) -> bool:
        """Whether `_write` computes it in its buffer (the planned runtime computes the others
        with the reference, which makes temporaries, then copies)."""
        return not self.normed and not self.stored and not self.swiglu


# every attribute but n, at its default
GEMM_DEFAULTS = {f.name: f.default for f in fields(GemmDescriptor) if f.name != "n"}


def gemm_label(attrs: Mapping[str, Any]) -> str:
    """GemmDescriptor.label of attributes that may be only the strings (the decisions
    report's: a label needs no n)."""
    return GemmDescriptor.of({"n": 0, **attrs}).label


def _gemm(xs: list[Any], a: dict[str, Any]) -> Any:
    g, d = operands_of("gemm", xs), GemmDescriptor.of(a)
    x, w, w_scale, norm, addend = g.x, g.w, g.w_scale, g.norm, g.addend
    if d.normed:
        x = rms_norm([x, norm], {"eps": d.eps})
    if d.sparse:
        weight = sparse_formats.unpack(w, w_scale, d.weight, x.shape[-1], d.columns).to(x.dtype)
    elif d.half:
        weight = w.to(x.dtype)
    elif d.dynamic:
        x, weight = coded_activations(x), dequantize(w, w_scale, "int8").to(x.dtype)
    elif d.dynamic4:
        x, weight = coded_blocks(x), dequantize(w, w_scale, "int4_g32").to(x.dtype)
    else:
        weight = dequantize(w, w_scale, d.weight).to(x.dtype) if d.stored else w
    if d.epilogue == "bias":
        y = torch.addmm(addend, x, weight, beta=d.beta, alpha=d.alpha)
    elif d.swiglu:
        gate = scaled(torch.matmul(x, weight[:, :d.n]), d.alpha)
        y = gate * torch.sigmoid(gate) * scaled(torch.matmul(x, weight[:, d.n:]), d.alpha)
    else:
        y = scaled(torch.matmul(x, weight), d.alpha)
        if d.epilogue == "add":
            y = y + addend
    return y if d.act == "none" else ACTIVATIONS[d.act].ref(y)


def _gemm_type(ins: list[TensorType], a: dict[str, Any]) -> TensorType:
    x = ins[0]
    GemmDescriptor.of(a).check()
    if not x.shape:
        raise GraphError(f"gemm: x {x} is not a matrix")
    return TensorType(x.shape[:-1] + (a["n"],), x.dtype)


def gemm_writes_in_place(a: Mapping[str, Any]) -> bool:
    return GemmDescriptor.of(a).writes_in_place


def _write(out: torch.Tensor, xs: list[Any], a: dict[str, Any]) -> None:
    # the reference's own steps in the buffer: the product (addmm with its bias), its scale
    # (prepared: xs[5]), + the addend, then the activation in place
    g, d = operands_of("gemm", xs[:5]), GemmDescriptor.of(a)
    x, w, addend = g.x, g.w, g.addend
    if d.epilogue == "bias":
        torch.addmm(addend, x, w, beta=d.beta, alpha=d.alpha, out=out)
    else:
        torch.matmul(x, w, out=out)
        if d.alpha != 1.0:
            out.mul_(xs[5])
        if d.epilogue == "add":
            out.add_(addend)
    if d.act != "none":
        ACTIVATIONS[d.act].inplace(out)


def _parts(a: dict[str, Any], ins: list[TensorType], out: TensorType) -> list[Part]:
    """What gemm's reference runs: the prologue's norm, the weight's dequantization, the
    product(s), the epilogue's add and activation."""
    g, d = operands_of("gemm", ins), GemmDescriptor.of(a)
    x, w, w_scale, norm, addend = g.x, g.w, g.w_scale, g.norm, g.addend
    k = x.shape[-1]
    weight = TensorType((k, out.shape[-1] * (2 if d.swiglu else 1)), x.dtype)
    parts: list[Part] = []
    if d.normed:
        parts += rms_norm_parts({"eps": d.eps}, [x, norm], x)
    if d.dynamic or d.dynamic4:  # x coded and decoded: a pass over x (and the range's)
        parts += [("mul", {}, [x, x], x)] * 2
    if d.half:
        parts.append(("to_dtype", {"dtype": x.dtype}, [w], weight))
    elif d.stored:
        parts.append(("mul", {}, [w, w_scale], weight))
    mm = {"alpha": d.alpha}
    if d.epilogue == "bias":
        parts.append(("addmm", {"beta": d.beta, **mm}, [addend, x, weight], out))
    elif d.swiglu:
        half = TensorType((k, out.shape[-1]), x.dtype)
        parts += [("matmul", mm, [x, half], out), ("matmul", mm, [x, half], out),
                  ("swiglu", {}, [out, out], out)]
    else:
        parts.append(("matmul", mm, [x, weight], out))
        if d.epilogue == "add":
            parts.append(("add", {}, [out, addend], out))
    if d.act != "none":
        act, act_attrs = ACTIVATIONS[d.act].op, dict(ACTIVATIONS[d.act].attrs)
        parts.append((act, act_attrs, [out], out))
    return parts


register("gemm", 5, "n:int alpha:float beta:float eps:float prologue:str weight:str "
         "epilogue:str act:str", ref=_gemm, category="matmul", shape="gemm", cost="matmul",
         parts=_parts, writer=_write, infer=_gemm_type, operands="x w w_scale norm addend",
         draw=draws.gemm)


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


