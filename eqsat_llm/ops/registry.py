"""The op registry's machinery: an op's declaration (`OpDef`), `register`, lookup, evaluation
and type inference. The ops themselves are declared in the sibling modules, a family each.

An op is declared once, in one `register` call:
- its tensor inputs and attributes (which also fix its egglog constructor, see
  `eqsat_llm.egraph.language`);
- its reference semantics (a torch function: the meaning of the op, used by the reference
  runtime, by tests and by rule checking);
- how its shape and dtype are inferred in Python, and which shape/dtype rule computes them
  inside the e-graph (`eqsat_llm.egraph.analysis`);
- its cost: the kind of kernel the cost model prices it as (`COST_KINDS`), a vector op's work
  per element (`flops`, in adds), and for a fused op the ops its reference runs (`parts`:
  what it costs when the reference runs it, op by op);
- its writer: the reference computed into a given buffer (the planned runtime's step), or
  `COPY_IN` where torch has no out= kernel that writes without allocating (the reference
  runs, then its result is copied in); and whether torch may return its result as a view of
  its input (`may_view`: the memory plan then places it there).

Reference functions take `(xs, a)`: the input values (tensors, or Python numbers for `scalar`
nodes) and the attribute dict. Writers take `(out, xs, a)`; the planned runtime appends
prepared stand-ins to `xs` (codegen/planned.py `_prepared_inputs`: a product's alpha as a 0-dim
tensor, a mean's element count).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import GraphError
from ..tensor_type import TensorType, dtype_name, dtype_of

Reference = Callable[[list[Any], dict[str, Any]], Any]
Writer = Callable[[torch.Tensor, list[Any], dict[str, Any]], Any]
# one op the reference of a fused op runs: (op, attributes, input types, output type)
Part = tuple[str, dict[str, Any], list[TensorType], TensorType]
Parts = Callable[[dict[str, Any], list[TensorType], TensorType], list[Part]]

# Attribute kinds and their Python types; the egglog sort of each is chosen in
# egraph/language.py (int/bool -> i64, float -> f64, ints -> Vec[i64], str -> String).
ATTR_KINDS = ("int", "float", "ints", "str", "bool")

WEAK_DTYPES = {"py_float": 1.0, "py_int": 1, "py_bool": True}


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: int | None  # number of tensor inputs; None: a list of tensors (cat, fallback)
    attrs: tuple[tuple[str, str], ...]
    reference: Reference | None
    category: str  # source, layout, elementwise, reduction, matmul, attention, fallback
    shape_rule: str  # which e-graph shape rule applies (egraph/analysis.py); "given" = set
    dtype_rule: str  # "same", "same_float", "promote", "promote12", "bool", "attr", "scalar",
    # "quant_weight" / "quant_scales" (by the format attribute),
    # "given" (set by the encoder only: leaves, fallbacks, data-dependent ops)
    cost: str  # the kernel kind the cost model prices (COST_KINDS)
    flops: float = 0.0  # a "vector" op's work per element, in adds (EXP_FLOPS for an exp)
    parts: Parts | None = None  # a fused op: the ops its reference runs, for their prices
    writer: Writer | str | None = None  # into a buffer; COPY_IN; None: not computed (leaves)
    may_view: bool = False  # torch may return its result as a view of its input (plan.py)
    # its kernels write the result through any strides (every runtime: written in place or
    # copied in), so the planner may give its buffer the strides of its only consumer, a
    # permute, making that permute a free view (plan.py)
    stride_free: bool = False
    # a form only the frontend emits, which the fusion rules replace by a fused op: priced
    # with a fallback's overhead, so that extraction prefers the fused op (costmodel.py)
    frontend_form: bool = False
    # Python type inference; by default the reference semantics run on meta tensors,
    # which gives torch's own shape and dtype rules exactly.
    infer: Callable[[list[TensorType], dict[str, Any]], TensorType] | None = None
    # the inputs' roles, in order (attention: q k v bias sinks): consumers name an input by
    # its role (operands_of), so that an op that gains an input changes here alone
    operands: tuple[str, ...] = ()
    # how `rules check` draws input `pos`'s type to fit the inputs already drawn, where they
    # must agree beyond broadcasting (a matmul's contracted K, attention's heads): draw(c, pos)
    # -> (TensorType, bound of int64 values or None), or None for any type; `c` is the
    # checker's context (rulecheck/draws.py Demand: rng, built shapes, a drawn size, ...)
    draw: Callable[[Any, int], Any] | None = None
    # the operand roles whose constant its kernels prepare from any strides (an expert
    # GEMM packs its weight as stored): a layout view of a weight read there stays a view,
    # not folded into a copy held beside the packed form (fold.py)
    packs_strided: tuple[str, ...] = ()

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


# The kernel kinds of the cost model (extraction/costmodel.py prices each).
COST_KINDS = ("leaf", "generate", "view", "copy", "matmul", "fold", "vector", "gather",
              "attention", "fallback")
# A writer's declaration that torch has no out= kernel for the op: the planned runtime runs the
# reference, then copies its result into the buffer.
COPY_IN = "copy_in"
# Flop-equivalents per element of vector work, relative to an add (the vector rate is
# calibrated from exp at EXP_FLOPS). Transcendentals are dearer.
EXP_FLOPS = 10.0
TRANSCENDENTAL = 20.0


def register(name: str, arity: int | None, attrs: str = "", *, ref=None, category: str,
             shape: str, dtype: str = "same", cost: str, flops: float = 0.0,
             parts: Parts | None = None, writer: Writer | str | None = None,
             may_view: bool = False, stride_free: bool = False, frontend_form: bool = False,
             infer=None, operands: str = "", draw: Callable[[Any, int], Any] | None = None,
             packs_strided: str = "") -> None:
    """Declare an op. `attrs` is "name:kind name:kind ..."; `operands` "role role ...", one
    per input."""
    parsed = tuple(tuple(a.split(":")) for a in attrs.split())
    roles = tuple(operands.split())
    if roles and len(roles) != arity:
        raise ValueError(f"{name}: {len(roles)} operand roles for {arity} inputs")
    for attr_name, kind in parsed:
        if kind not in ATTR_KINDS:
            raise ValueError(f"{name}: attribute {attr_name} has unknown kind {kind}")
    if name in REGISTRY:
        raise ValueError(f"op {name!r} registered twice")
    if cost not in COST_KINDS:
        raise ValueError(f"{name}: cost kind {cost!r} is not one of {COST_KINDS}")
    if (cost == "vector") != (flops > 0):
        raise ValueError(f"{name}: a vector op gives its flops per element, no other op does")
    REGISTRY[name] = OpDef(name, arity, parsed, ref, category, shape, dtype,  # type: ignore
                           cost, flops, parts, writer, may_view, stride_free, frontend_form,
                           infer, roles, draw, tuple(packs_strided.split()))
    if roles:
        _OPERANDS[name] = namedtuple(f"{name}_operands", roles)  # type: ignore[misc]


_OPERANDS: dict[str, type] = {}


def operands_of(op: str, inputs: Sequence[Any]) -> Any:
    """An op's inputs by their roles (OpDef.operands): `operands_of("attention", ins).bias`."""
    try:
        return _OPERANDS[op](*inputs)
    except KeyError:
        raise GraphError(f"op {op!r} declares no operand roles") from None


def ops_where(fact: str) -> frozenset[str]:
    """The ops whose boolean declaration `fact` (an OpDef field) is true."""
    return frozenset(name for name, op in REGISTRY.items() if getattr(op, fact))


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


def leaf_type(_: list[TensorType], a: dict[str, Any]) -> TensorType:
    raise GraphError("leaf nodes (input/param/const) are appended with their type")


def typed_number(v: float, dtype: str) -> float | int:
    """An attribute's number as the Python type of `dtype`'s values (float or int): what
    full/arange pass to torch (shared with the planned runtime)."""
    return v if dtype_of(dtype).is_floating_point else int(v)

