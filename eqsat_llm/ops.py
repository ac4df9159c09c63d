"""The op registry: every op of the IR is declared here, once.

An op declares its tensor inputs and attributes (which also fix its egglog constructor, see
`eqsat_llm.egraph.language`), its reference semantics (a torch function: the meaning of the
op, used by the reference runtime, by tests and by rule checking), how its shape and dtype are
inferred in Python, and which shape/dtype rule computes them inside the e-graph
(`eqsat_llm.egraph.analysis`). Adding an op touches this table plus its kernels.

Reference functions take `(xs, a)`: the input values (tensors, or Python numbers for
`scalar` nodes) and the attribute dict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from . import sparse_formats
from .errors import GraphError
from .half_formats import WEIGHT_FORMATS as HALF_FORMATS
from .quant_formats import (
    DYNAMIC,
    FORMATS,
    coded_activations,
    dequantize,
    quantize,
    quantized_types,
)
from .tensor_type import TensorType, dtype_name, dtype_of

aten = torch.ops.aten

# Attribute kinds and their Python types; the egglog sort of each is chosen in
# egraph/language.py (int/bool -> i64, float -> f64, ints -> Vec[i64], str -> String).
ATTR_KINDS = ("int", "float", "ints", "str", "bool")

WEAK_DTYPES = {"py_float": 1.0, "py_int": 1, "py_bool": True}


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: int | None  # number of tensor inputs; None: a list of tensors (cat, fallback)
    attrs: tuple[tuple[str, str], ...]
    reference: Callable[[list[Any], dict[str, Any]], Any] | None
    category: str  # source, layout, elementwise, reduction, matmul, attention, fallback
    shape_rule: str  # which e-graph shape rule applies (egraph/analysis.py); "given" = set
    dtype_rule: str  # "same", "same_float", "promote", "promote12", "bool", "attr", "scalar",
    # "quant_weight" / "quant_scales" (by the format attribute),
    # "given" (set by the encoder only: leaves, fallbacks, data-dependent ops)
    # Python type inference; by default the reference semantics run on meta tensors,
    # which gives torch's own shape and dtype rules exactly.
    infer: Callable[[list[TensorType], dict[str, Any]], TensorType] | None = None

    def infer_type(self, input_types: list, attrs: dict[str, Any]):
        self.check_attrs(attrs)
        if self.infer is not None:
            return self.infer(input_types, attrs)
        # running the reference on meta tensors costs up to 20 ms (attention, rope); a model's
        # layers ask the same question once per layer: the answers are kept (types are pure)
        key = _type_key(self.name, input_types, attrs)
        if key is not None and key in _INFERRED:
            return _INFERRED[key]
        node_type = self._infer_by_reference(input_types, attrs)
        if key is not None:
            if len(_INFERRED) >= _INFERRED_MAX:
                _INFERRED.clear()
            _INFERRED[key] = node_type
        return node_type

    def _infer_by_reference(self, input_types: list, attrs: dict[str, Any]) -> Any:
        if self.reference is None:
            raise GraphError(f"op {self.name!r} has no type rule; its type must be given")
        try:
            out = self.reference([_meta_value(t) for t in input_types], attrs)
        except Exception as exc:  # torch's own message says which shapes disagree
            types = ", ".join(map(str, input_types))
            raise GraphError(f"{self.name}({types}; {attrs}) does not type-check: {exc}") from exc
        return _type_of_value(out)

    def check_attrs(self, attrs: dict[str, Any]) -> None:
        names = {n for n, _ in self.attrs}
        missing = names - attrs.keys()
        if missing:
            raise GraphError(f"op {self.name!r} is missing attribute(s) {sorted(missing)}")


_INFERRED: dict[tuple, Any] = {}  # (op, input types, attributes) -> the inferred type
_INFERRED_MAX = 16384


def _type_key(op: str, input_types: list, attrs: dict[str, Any]) -> tuple | None:
    """A hashable key of a type question; None when an attribute is not a plain value. Each
    value keeps its Python type (1, 1.0 and True are equal keys, but may type differently)."""
    try:
        key = (op, tuple(input_types), tuple(sorted(
            (k, type(v).__name__, tuple(v) if isinstance(v, list) else v)
            for k, v in attrs.items())))
        hash(key)
    except TypeError:
        return None
    return key


def _meta_value(t: TensorType) -> Any:
    if t.dtype in WEAK_DTYPES:
        return WEAK_DTYPES[t.dtype]
    return torch.empty(t.shape, dtype=dtype_of(t.dtype), device="meta")


def _type_of_value(v: Any) -> TensorType | tuple[TensorType, ...]:
    if isinstance(v, torch.Tensor):
        return TensorType(tuple(int(d) for d in v.shape), dtype_name(v.dtype))
    if isinstance(v, (tuple, list)):
        return tuple(_type_of_value(x) for x in v)  # type: ignore[misc]
    if isinstance(v, bool):
        return TensorType((), "py_bool")
    if isinstance(v, int):
        return TensorType((), "py_int")
    if isinstance(v, float):
        return TensorType((), "py_float")
    raise GraphError(f"cannot type a value of Python type {type(v).__name__}")


REGISTRY: dict[str, OpDef] = {}


def register(name: str, arity: int | None, attrs: str = "", *, ref=None, category: str,
             shape: str, dtype: str = "same", infer=None) -> None:
    """Declare an op. `attrs` is "name:kind name:kind ..."."""
    parsed = tuple(tuple(a.split(":")) for a in attrs.split())
    for attr_name, kind in parsed:
        if kind not in ATTR_KINDS:
            raise ValueError(f"{name}: attribute {attr_name} has unknown kind {kind}")
    if name in REGISTRY:
        raise ValueError(f"op {name!r} registered twice")
    REGISTRY[name] = OpDef(name, arity, parsed, ref, category, shape, dtype, infer)  # type: ignore[arg-type]


def get_op(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise GraphError(f"unknown op {name!r}; registered ops: {sorted(REGISTRY)}") from None


def evaluate(op: str, xs: list[Any], attrs: dict[str, Any]) -> Any:
    """Run an op's reference semantics."""
    opdef = get_op(op)
    if opdef.reference is None:
        raise GraphError(f"op {op!r} has no reference semantics (a leaf is bound, not run)")
    return opdef.reference(xs, attrs)


def _scalar_value(a: dict[str, Any]) -> Any:
    kind, v = a["kind"], a["value"]
    return {"float": float, "int": int, "bool": bool}[kind](v)


def _scalar_type(_: list[TensorType], a: dict[str, Any]) -> TensorType:
    return TensorType((), "py_" + a["kind"])


def _leaf_type(_: list[TensorType], a: dict[str, Any]) -> TensorType:
    raise GraphError("leaf nodes (input/param/const) are appended with their type")


def typed_number(v: float, dtype: str) -> float | int:
    """An attribute's number as the Python type of `dtype`'s values (float or int): what
    full/arange pass to torch (shared with the planned runtime)."""
    return v if dtype_of(dtype).is_floating_point else int(v)


# --- sources: leaves bound at run time, scalars and generated tensors -------------------
register("input", 0, "name:str index:int", category="source", shape="given", dtype="given",
         infer=_leaf_type)
register("param", 0, "name:str", category="source", shape="given", dtype="given",
         infer=_leaf_type)
register("const", 0, "name:str", category="source", shape="given", dtype="given",
         infer=_leaf_type)
register("scalar", 0, "value:float kind:str", category="source", shape="scalar",
         dtype="scalar", ref=lambda xs, a: _scalar_value(a), infer=_scalar_type)
register("full", 0, "shape:ints value:float dtype:str", category="source", shape="attr",
         dtype="attr",
         ref=lambda xs, a: torch.full(a["shape"], typed_number(a["value"], a["dtype"]),
                                      dtype=dtype_of(a["dtype"])))
register("arange", 0, "start:float end:float step:float dtype:str", category="source",
         shape="given", dtype="attr",
         ref=lambda xs, a: torch.arange(typed_number(a["start"], a["dtype"]),
                                        typed_number(a["end"], a["dtype"]),
                                        typed_number(a["step"], a["dtype"]),
                                        dtype=dtype_of(a["dtype"])))

# --- layout: views and copies that move data but compute nothing -------------------------
register("view", 1, "shape:ints", ref=lambda xs, a: torch.reshape(xs[0], a["shape"]),
         category="layout", shape="attr")
register("permute", 1, "dims:ints", ref=lambda xs, a: torch.permute(xs[0], a["dims"]),
         category="layout", shape="permute")
register("transpose", 1, "dim0:int dim1:int",
         ref=lambda xs, a: torch.transpose(xs[0], a["dim0"], a["dim1"]),
         category="layout", shape="transpose")
register("expand", 1, "shape:ints", ref=lambda xs, a: xs[0].expand(a["shape"]),
         category="layout", shape="attr")
register("unsqueeze", 1, "dim:int", ref=lambda xs, a: torch.unsqueeze(xs[0], a["dim"]),
         category="layout", shape="unsqueeze")
register("clone", 1, ref=lambda xs, a: torch.clone(xs[0]), category="layout", shape="same")
register("to_dtype", 1, "dtype:str", ref=lambda xs, a: xs[0].to(dtype_of(a["dtype"])),
         category="elementwise", shape="same", dtype="attr")
register("slice", 1, "dim:int start:int end:int step:int",
         ref=lambda xs, a: aten.slice.Tensor(xs[0], a["dim"], a["start"], a["end"], a["step"]),
         category="layout", shape="slice")
register("select", 1, "dim:int index:int",
         ref=lambda xs, a: torch.select(xs[0], a["dim"], a["index"]),
         category="layout", shape="select")
register("cat", None, "dim:int", ref=lambda xs, a: torch.cat(xs, a["dim"]),
         category="layout", shape="cat")
register("getitem", 1, "index:int", ref=lambda xs, a: xs[0][a["index"]], category="layout",
         shape="given", dtype="given")

# --- matmuls (alpha: a scale folded into the product by the rules) -----------------------
register("mm", 2, "alpha:float", ref=lambda xs, a: _scaled(torch.mm(xs[0], xs[1]), a["alpha"]),
         category="matmul", shape="mm")
register("bmm", 2, "alpha:float",
         ref=lambda xs, a: _scaled(torch.bmm(xs[0], xs[1]), a["alpha"]),
         category="matmul", shape="bmm")
# matmul: batched over leading dims (b may be 2-D: x @ W); the rules rewrite the
# view/bmm/view and view/mm/view chains of the decompositions into it
register("matmul", 2, "alpha:float",
         ref=lambda xs, a: _scaled(torch.matmul(xs[0], xs[1]), a["alpha"]),
         category="matmul", shape="matmul")
register("addmm", 3, "beta:float alpha:float",
         ref=lambda xs, a: torch.addmm(xs[0], xs[1], xs[2], beta=a["beta"], alpha=a["alpha"]),
         category="matmul", shape="addmm")
register("linear", 2, ref=lambda xs, a: F.linear(xs[0], xs[1]), category="matmul",
         shape="linear")
register("linear_bias", 3, ref=lambda xs, a: F.linear(xs[0], xs[1], xs[2]), category="matmul",
         shape="linear")
@dataclass(frozen=True)
class Activation:
    """An activation a gemm applies last (its `act` attribute), declared once for every
    stage: its reference, the registry op it is (with attributes: what the fusion rules match
    and the cost model prices), the planned runtime's in-place op, and the C backend's code
    (eq_act's case in packed_gemm.py) and expression of a float v."""
    ref: Callable[[torch.Tensor], torch.Tensor]
    op: str
    attrs: tuple[tuple[str, Any], ...]
    inplace: Callable[[torch.Tensor], Any]
    code: int
    c_expr: str


ACTIVATIONS: dict[str, Activation] = {
    # (written so that NaN stays NaN, as torch.relu keeps it)
    "relu": Activation(torch.relu, "relu", (), torch.relu_, 1, "v < 0.0f ? 0.0f : v"),
    "silu": Activation(F.silu, "silu", (), torch.ops.aten.silu_, 2, "v * eq_sigmoidf(v)"),
    "gelu_tanh": Activation(
        lambda x: F.gelu(x, approximate="tanh"), "gelu", (("approximate", "tanh"),),
        lambda t: torch.ops.aten.gelu_(t, approximate="tanh"), 3,
        "0.5f * v * (1.0f + eq_tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))"),
    "gelu": Activation(
        lambda x: F.gelu(x, approximate="none"), "gelu", (("approximate", "none"),),
        lambda t: torch.ops.aten.gelu_(t, approximate="none"), 4,
        "0.5f * v * (1.0f + erff(v * 0.7071067811865476f))"),
}


def _scaled(x: torch.Tensor, alpha: float) -> torch.Tensor:
    # Multiplying by exactly 1.0 is skipped so that an unscaled product is bit-identical.
    return x if alpha == 1.0 else x * alpha


# --- elementwise ----------------------------------------------------------------------------
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
}
# the binary ops whose result is bool (the C backend and the planned runtime read this too)
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"})


def _binary(fn: Callable[..., Any]) -> Callable[[list[Any], dict[str, Any]], Any]:
    def ref(xs: list[Any], a: dict[str, Any]) -> Any:
        x, y = xs
        if not isinstance(x, torch.Tensor):  # scalar first: let torch promote as in eager
            return fn(torch.scalar_tensor(x, dtype=weak_scalar_dtype(x, y)), y)
        return fn(x, y)
    return ref


def weak_scalar_dtype(x: Any, y: Any) -> torch.dtype:
    """The dtype a Python number `x` takes next to `y` in a binary op, as torch promotes it
    (shared with the planned runtime)."""
    if isinstance(y, torch.Tensor) and not (isinstance(x, float) and
                                            not y.dtype.is_floating_point):
        return y.dtype
    return torch.get_default_dtype() if isinstance(x, float) else torch.int64


for _name, _fn in _BINARY.items():
    register(_name, 2, ref=_binary(_fn), category="elementwise", shape="broadcast",
             dtype="bool" if _name in COMPARISONS else "promote")

register("where", 3, ref=lambda xs, a: torch.where(*xs), category="elementwise",
         shape="broadcast", dtype="promote12")

_UNARY = {
    "neg": torch.neg, "rsqrt": torch.rsqrt, "sqrt": torch.sqrt, "exp": torch.exp,
    "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": F.silu,
    "relu": torch.relu, "reciprocal": torch.reciprocal, "abs": torch.abs, "cos": torch.cos,
    "sin": torch.sin, "erf": torch.erf, "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not,
}
def _unary(fn: Callable[[Any], Any]) -> Callable[[list[Any], dict[str, Any]], Any]:
    return lambda xs, a: fn(xs[0])


for _name, _fn in _UNARY.items():
    register(_name, 1, ref=_unary(_fn), category="elementwise",
             shape="same", dtype="bool" if _name == "logical_not" else "same")
register("gelu", 1, "approximate:str",
         ref=lambda xs, a: F.gelu(xs[0], approximate=a["approximate"]),
         category="elementwise", shape="same")
register("triu", 1, "diagonal:int", ref=lambda xs, a: torch.triu(xs[0], a["diagonal"]),
         category="elementwise", shape="same")
register("tril", 1, "diagonal:int", ref=lambda xs, a: torch.tril(xs[0], a["diagonal"]),
         category="elementwise", shape="same")

# --- reductions and normalisations -----------------------------------------------------------
_REDUCTIONS = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin}


def _reduction(fn: Callable[..., Any]) -> Callable[[list[Any], dict[str, Any]], Any]:
    return lambda xs, a: fn(xs[0], a["dims"], keepdim=a["keepdim"])


for _name, _fn in _REDUCTIONS.items():
    # sum promotes bool/int to int64, so its dtype is not always its input's
    register(_name, 1, "dims:ints keepdim:bool", ref=_reduction(_fn), category="reduction",
             shape="reduce", dtype="same_float" if _name == "sum" else "same")
# any: true where some element along the dims is non-zero (the masks' "some key visible")
register("any", 1, "dims:ints keepdim:bool",
         ref=lambda xs, a: torch.any(xs[0], a["dims"], keepdim=a["keepdim"]) if a["dims"]
         else torch.any(xs[0]).reshape([1] * xs[0].dim() if a["keepdim"] else []),
         category="reduction", shape="reduce", dtype="bool")
register("softmax", 1, "dim:int", ref=lambda xs, a: torch.softmax(xs[0], a["dim"]),
         category="reduction", shape="same")
register("log_softmax", 1, "dim:int", ref=lambda xs, a: torch.log_softmax(xs[0], a["dim"]),
         category="reduction", shape="same")
register("cumsum", 1, "dim:int", ref=lambda xs, a: torch.cumsum(xs[0], a["dim"]),
         category="reduction", shape="same", dtype="given")
register("layer_norm", 3, "normalized_shape:ints eps:float",
         ref=lambda xs, a: F.layer_norm(xs[0], a["normalized_shape"], xs[1], xs[2], a["eps"]),
         category="reduction", shape="same")

# --- gathers, attention ----------------------------------------------------------------------
register("embedding", 2, ref=lambda xs, a: F.embedding(xs[1], xs[0]), category="layout",
         shape="embedding")
register("index_select", 2, "dim:int",
         ref=lambda xs, a: torch.index_select(xs[0], a["dim"], xs[1]), category="layout",
         shape="given")
register("gather", 2, "dim:int", ref=lambda xs, a: torch.gather(xs[0], a["dim"], xs[1]),
         category="layout", shape="given", dtype="same")
register("index", None, "positions:ints", ref=lambda xs, a: _index(xs, a["positions"]),
         category="layout", shape="given", dtype="same")


def _index(xs: list[Any], positions: list[int]) -> Any:
    # aten.index with tensors at `positions` and full slices (None) elsewhere
    indices: list[Any] = [None] * (max(positions) + 1)
    for p, t in zip(positions, xs[1:]):
        indices[p] = t
    return aten.index.Tensor(xs[0], indices)


register("sdpa", 3, "is_causal:bool scale:float",
         ref=lambda xs, a: F.scaled_dot_product_attention(
             *xs, is_causal=a["is_causal"], scale=a["scale"], enable_gqa=_grouped(xs)),
         category="attention", shape="sdpa")
register("sdpa_masked", 4, "scale:float",
         ref=lambda xs, a: F.scaled_dot_product_attention(
             xs[0], xs[1], xs[2], attn_mask=xs[3], scale=a["scale"], enable_gqa=_grouped(xs)),
         category="attention", shape="sdpa")


def _grouped(xs: list[Any]) -> bool:
    """Grouped-query attention: k and v have fewer heads (dim -3) than q."""
    q, k = xs[0], xs[1]
    return q.dim() >= 3 and k.dim() >= 3 and k.shape[-3] != q.shape[-3]


def _kv_heads(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    # GQA: query head h reads kv head h // (Hq / Hkv), as repeat_kv / enable_gqa do
    if q.dim() < 3 or kv.dim() < 3 or not 1 < kv.shape[-3] < q.shape[-3]:
        return kv  # the same heads, or one KV head broadcast
    return kv.repeat_interleave(q.shape[-3] // kv.shape[-3], dim=-3)


# --- fused ops that the rules recognise (references spell out the decomposition they replace,
# so a recognised program is bit-identical to the captured one) -----------------------------
def _rms_norm(xs: list[Any], a: dict[str, Any]) -> Any:
    x, w = xs
    return x * torch.rsqrt(torch.mean(torch.pow(x, 2), [-1], keepdim=True) + a["eps"]) * w


def _attention(xs: list[Any], a: dict[str, Any]) -> Any:
    # softmax(q @ k^T * scale + bias) @ v; bias is additive (-inf where masked). As in sdpa,
    # k and v may have fewer heads than q (grouped-query attention), and a query row that sees
    # no key (every score -inf) is zero, where the plain formula would give NaN.
    q, bias = xs[0], xs[3]
    k, v = _kv_heads(q, xs[1]), _kv_heads(q, xs[2])
    scores = _scaled(torch.matmul(q, k.transpose(-2, -1)), a["scale"]) + bias
    out = torch.matmul(torch.softmax(scores, -1), v)
    blind = (scores == float("-inf")).all(-1, keepdim=True)
    return out.masked_fill(blind, 0.0)


register("rms_norm", 2, "eps:float", ref=_rms_norm, category="reduction", shape="same")
register("swiglu", 2, ref=lambda xs, a: xs[0] * torch.sigmoid(xs[0]) * xs[1],
         category="elementwise", shape="broadcast", dtype="same")
register("attention", 4, "scale:float", ref=_attention, category="attention", shape="sdpa")
def _rope(xs: list[Any], a: dict[str, Any]) -> Any:
    # rotary embedding: x * cos + rotate_half(x) * sin, the decomposition that
    # rules/fusion.py recognises, spelled the same way (bit-identical)
    x, cos, sin = xs
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


register("rope", 3, ref=_rope, category="elementwise", shape="broadcast", dtype="same")

# --- the one GEMM op: a matmul with its prologue, weight format and epilogue -------------------
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
GEMM_PROLOGUES = ("none", "rms_norm")
GEMM_EPILOGUES = ("none", "add", "bias", "swiglu")
GEMM_ACTS = ("none", *ACTIVATIONS)
GEMM_WEIGHTS = ("float", *FORMATS, DYNAMIC, *sparse_formats.FORMATS, *HALF_FORMATS)


def _gemm(xs: list[Any], a: dict[str, Any]) -> Any:
    x, w, w_scale, norm, addend = xs
    if a["prologue"] == "rms_norm":
        x = _rms_norm([x, norm], a)
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
        g = _scaled(torch.matmul(x, weight[:, :n]), alpha)
        y = g * torch.sigmoid(g) * _scaled(torch.matmul(x, weight[:, n:]), alpha)
    else:
        y = _scaled(torch.matmul(x, weight), alpha)
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


register("gemm", 5, "n:int alpha:float beta:float eps:float prologue:str weight:str "
         "epilogue:str act:str", ref=_gemm, category="matmul", shape="gemm", infer=_gemm_type)


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


# Quantized weights (optimize(quantize=...)): computed from a constant float weight [K, N] at
# compile time (constant folding), the integers and the scales of format `fmt`.
register("quantize_weight", 1, "fmt:str", ref=lambda xs, a: quantize(xs[0], a["fmt"])[0],
         category="quant", shape="quant_weight", dtype="quant_weight",
         infer=lambda ins, a: quantized_types(ins[0], a["fmt"])[0])
register("weight_scales", 1, "fmt:str", ref=lambda xs, a: quantize(xs[0], a["fmt"])[1],
         category="quant", shape="quant_scales", dtype="quant_scales",
         infer=lambda ins, a: quantized_types(ins[0], a["fmt"])[1])

# Sparse weights (optimize(sparsity="auto")): a constant float weight [K, N] with 2:4 or
# 16 x 16 block structure, as the stored values and their positions (sparse_formats.py),
# computed at compile time. `blocks`: the stored blocks of bsr16 (the encoder counts them),
# 0 for sparse24.
register("sparse_values", 1, "fmt:str blocks:int",
         ref=lambda xs, a: sparse_formats.pack(xs[0], a["fmt"])[0], category="quant",
         shape="sparse_values", dtype="same",
         infer=lambda ins, a: sparse_formats.packed_types(ins[0], a["fmt"], a["blocks"])[0])
register("sparse_index", 1, "fmt:str blocks:int",
         ref=lambda xs, a: sparse_formats.pack(xs[0], a["fmt"])[1], category="quant",
         shape="sparse_index", dtype="sparse_index",
         infer=lambda ins, a: sparse_formats.packed_types(ins[0], a["fmt"], a["blocks"])[1])

# --- fallback: an op outside the registry, run by torch as captured -----------------------
# attrs: "target" (the op's name, for reports and the e-graph), "key" (the node's identity
# in the e-graph), and "fn"/"template" (the callable and its argument structure; not encoded).
register("fallback", None, "target:str key:int", category="fallback", shape="given",
         dtype="given", infer=_leaf_type)

LEAF_OPS = frozenset({"input", "param", "const"})
