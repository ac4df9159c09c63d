"""Where every value of a planned program lives, as seen from the generated C code.

A `Ref` is a strided view (shape, element strides, element offset) into one of five spaces:
the arena (`A`, a byte pointer; `offset` is in bytes of the root buffer plus elements), the
user inputs (`IN[k]`), the prepared weights (`W[k]`), the per-call outputs (`OUT[k]`), or a
Python number inlined as a literal (`scalar`). Every value but the torch temporaries (TEMP)
has one; one whose dtype has no C type (`Ref.in_c`) is only read and written by torch steps."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...ir import Graph, TensorType, contiguous_strides, dtype_of
from ...memcheck import release_freed_memory
from ...ops import evaluate
from ...plan import ALIAS, ARENA, COPY_OUT, EXTERN_VIEW, LEAF, OUTPUT, SCALAR, TEMP, MemoryPlan
from ...weights.interning import intern
from .errors import UnsupportedByBackend
from .packed_gemm import PackedWeight
from .quant_gemm import WeightView

CTYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t",
          "bool": "_Bool", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t"}


_W_SLOT = re.compile(r"\bW\[(\d+)\]")  # how Ref.ptr names a W slot in C
_UNREAD = torch.empty(0, dtype=torch.uint8)  # the tensor of a W slot no kernel reads
# the fields of a prepared weight's spec (PackedWeight, QuantPanels, ...) that name a constant
NAMING_FIELDS = ("name",)


@dataclass(frozen=True)
class Ref:
    space: str  # "A", "IN", "W", "OUT", "scalar"
    slot: int  # index into IN / W / OUT; byte offset of the root buffer for "A"
    offset: int  # element offset inside the slot / root buffer
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    value: float | int | bool | None = None  # scalars
    root: int = -1  # the node owning the storage

    @property
    def ctype(self) -> str:
        return CTYPES[self.dtype]

    @property
    def in_c(self) -> bool:
        """Whether the generated C code can read or write this value (its dtype has a C
        type); others are only touched by the torch steps between segments."""
        return self.dtype in CTYPES

    def ptr(self, const: bool = True) -> str:
        q = "const " if const else ""
        t = self.ctype
        if self.space == "A":
            return f"(({q}{t}*)(A + {self.slot}) + {self.offset})"
        return f"(({q}{t}*){self.space}[{self.slot}] + {self.offset})"

    def literal(self, ctype: str) -> str:
        v = self.value
        if isinstance(v, bool):
            return f"(({ctype}){int(v)})"
        if isinstance(v, int):
            return f"(({ctype}){v}LL)"
        assert isinstance(v, float)
        if math.isnan(v):
            return f"(({ctype})NAN)"
        if v in (float("inf"), float("-inf")):
            return f"(({ctype}){'-' if v < 0 else ''}INFINITY)"
        return f"(({ctype}){v.hex()})"

    def with_view(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Ref:
        return Ref(self.space, self.slot, offset, shape, strides, self.dtype, None, self.root)


@dataclass
class Layout:
    refs: dict[int, Ref]
    n_inputs: int
    # by W slot: a constant's name, or a weight prepared for a kernel (added while emitting:
    # PackedWeight, quant_gemm.QuantPanels)
    weights: list[Any]
    outputs: list[int]  # node ids with an OUT slot, by slot
    copy_out: list[int]  # COPY_OUT nodes (a kernel copies them into their OUT slot)
    # the W slots some kernel or result reads (emit.py sets it once the kernels are emitted):
    # a constant a kernel only reads prepared (quantized panels, packed) gets no copy as is
    read: set[int] | None = None

    def constant_name(self, ref: Ref) -> str | None:
        """The name of the constant `ref` views, or None when it is not a view of one."""
        if ref.space != "W" or not isinstance(self.weights[ref.slot], str):
            return None
        return self.weights[ref.slot]  # type: ignore[return-value]

    def constant(self, ref: Ref, constants: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The values `ref` reads when it is a view of a constant, else None."""
        name = self.constant_name(ref)
        if name is None:
            return None
        return constants[name].detach().reshape(-1).as_strided(ref.shape, ref.strides, ref.offset)

    def packed_weight(self, w: Ref, k: int, n: int, rs: int, cs: int) -> Ref | None:
        """The W slot holding the [k, n] view (strides rs, cs) of the constant `w` views,
        packed for the GEMM; one slot per distinct packing. None when `w` is not a view of a
        constant."""
        name = self.constant_name(w)
        if name is None:
            return None
        spec = PackedWeight(name, w.offset, k, n, rs, cs)
        if spec not in self.weights:
            self.weights.append(spec)
        return Ref("W", self.weights.index(spec), 0, (k, n), contiguous_strides((k, n)),
                   "float32")

    def prepared(self, spec: Any, shape: tuple[int, ...], dtype: str) -> Ref:
        """The W slot holding the prepared constant `spec` (an object with
        `prepare(constants)`, compared by value: one slot per distinct one), seen as a
        contiguous `shape` of `dtype`."""
        if spec not in self.weights:
            self.weights.append(spec)
        return Ref("W", self.weights.index(spec), 0, shape, contiguous_strides(shape), dtype)

    def prepared_weights(self, constants: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The tensors of the W slots, contiguous, in slot order (equal ones shared with
        other programs: interning.intern); an empty tensor for a slot nothing reads."""
        return [self._prepared(w, constants) if self.is_read(slot) else _UNREAD
                for slot, w in enumerate(self.weights)]

    def is_read(self, slot: int) -> bool:
        return self.read is None or slot in self.read

    def note_reads(self, code: str) -> None:
        """Record the W slots `code` (emitted C) reads."""
        self.read = (self.read or set()) | {int(k) for k in _W_SLOT.findall(code)}

    @staticmethod
    def _prepared(w: Any, constants: Mapping[str, torch.Tensor]) -> torch.Tensor:
        def make() -> torch.Tensor:
            return constants[w].contiguous() if isinstance(w, str) else w.prepare(constants)

        if not hasattr(constants, "shared"):  # folded constants: equal ones across programs
            return intern(make())
        # weights made on access (weights/lazy_weights.py) are shared by recipe, not by value: an
        # equal tensor of another live model would tie this program to that model's storage

        def make_and_trim() -> torch.Tensor:
            t = make()
            # a weight's intermediates, freed: handed back before the next weight's, or the
            # freed blocks pile up (TinyLlama shape, int4: 0.3 GB by the end of the load)
            release_freed_memory()
            return t

        t = constants.shared(spec_key(w, constants), make_and_trim)  # type: ignore
        if isinstance(w, (WeightView, PackedWeight)):  # the parts another program may
            # prepare alone
            for part, rows in w.parts(constants):
                constants.remember(spec_key(part, constants), t, rows)  # type: ignore
        return t


def spec_key(spec: Any, constants: Any) -> Hashable | None:
    """What the W slot `spec` holds, with each constant it names replaced by what that
    constant is made of (LazyConstants.key / view_key): equal in every program that prepares
    the same weight. None when a constant it names has no such key."""
    if isinstance(spec, str):
        k = constants.key(spec)
        return None if k is None else ("as stored", k)
    if isinstance(spec, WeightView):  # by the columns it reads: a SwiGLU half is its weight
        view = constants.view_key(spec.name, spec.offset, spec.rows, spec.halves * spec.n,
                                  spec.rs)
        rest = tuple((f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec)
                     if f.name not in ("name", "offset", "rs"))
        return None if view is None else (type(spec).__name__, view, rest)
    if isinstance(spec, PackedWeight) and spec.cs == 1:  # likewise (the gate half of a
        # merged gate|up is the gate alone, the q of a merged qkv the q)
        view = constants.view_key(spec.name, spec.offset, spec.k, spec.n, spec.rs)
        return None if view is None else ("PackedWeight", view)
    parts: list[Hashable] = [type(spec).__name__]
    for f in dataclasses.fields(spec):
        v = getattr(spec, f.name)
        if isinstance(v, str) and f.name in NAMING_FIELDS:
            v = constants.key(v)
            if v is None:
                return None
        parts.append((f.name, v))
    return tuple(parts)


def view_of(base: Ref, op: str, attrs: dict[str, Any], shape: tuple[int, ...]) -> Ref:
    """The strided view a layout op gives of `base` (torch decides, on meta tensors)."""
    meta = torch.empty(0, dtype=dtype_of(base.dtype), device="meta").as_strided(
        base.shape, base.strides, base.offset)
    out = evaluate(op, [meta], attrs)
    if out._base is None and out is not meta:
        raise UnsupportedByBackend([op], f"planned as a view, but torch copies here ({shape})")
    return base.with_view(tuple(out.shape), tuple(out.stride()), out.storage_offset())


def build_layout(graph: Graph, plan: MemoryPlan) -> Layout:
    refs: dict[int, Ref] = {}
    weights: list[str] = []
    outputs: list[int] = []
    copy_out: list[int] = []
    n_inputs = 0
    # OUT slots: the graph's outputs first, in their order (the standalone main writes the
    # slots in order), then buffers that outputs only view
    slot_of: dict[int, int] = {}
    for nid in list(graph.outputs) + plan.order:
        if plan.kinds.get(nid) in (OUTPUT, COPY_OUT) and nid not in slot_of:
            slot_of[nid] = len(slot_of)
    outputs.extend(sorted(slot_of, key=slot_of.__getitem__))
    for nid in plan.order:
        node = graph.node(nid)
        kind = plan.kinds[nid]
        t = node.type
        if kind == SCALAR:
            v = evaluate("scalar", [], node.attrs)
            refs[nid] = Ref("scalar", 0, 0, (), (), {"py_float": "float64", "py_int": "int64",
                                                      "py_bool": "bool"}[t.dtype], v)
            continue
        if kind == TEMP:  # a value torch allocates (a tuple): only torch steps read it
            continue
        assert isinstance(t, TensorType)  # a dtype outside CTYPES: only torch steps touch it
        if kind == LEAF:
            if node.op == "input":
                k = node.attrs["index"]
                n_inputs = max(n_inputs, k + 1)
                refs[nid] = Ref("IN", k, 0, t.shape, contiguous_strides(t.shape), t.dtype, root=nid)
            else:
                weights.append(node.attrs["name"])
                refs[nid] = Ref("W", len(weights) - 1, 0, t.shape, contiguous_strides(t.shape),
                                t.dtype, root=nid)
        elif kind == ARENA:
            b = plan.buffers[nid]
            refs[nid] = Ref("A", b.offset, 0, t.shape, plan.strides[nid], t.dtype, root=nid)
        elif kind == OUTPUT:
            refs[nid] = Ref("OUT", slot_of[nid], 0, t.shape, plan.strides[nid], t.dtype,
                            root=nid)
        elif node.attrs.get("inplace"):  # a state write in place: the state input itself
            refs[nid] = refs[node.inputs[0]]
        elif kind in (ALIAS, EXTERN_VIEW, COPY_OUT):
            refs[nid] = view_of(refs[node.inputs[0]], node.op, node.attrs, t.shape)
            if kind == COPY_OUT:
                copy_out.append(nid)
        else:
            raise UnsupportedByBackend([node.op], f"storage kind {kind}")
    return Layout(refs, n_inputs, weights, outputs, copy_out)
