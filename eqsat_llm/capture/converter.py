"""The converter: an ExportedProgram's fx graph -> the IR, node by node. Each aten op maps to
a registry op by the table `ATEN` (its entries in aten_table.py, registered with `converts`);
an op outside it becomes a `fallback` node that runs in torch as captured, so the regions
around it are still optimized, and its name is collected for the warning and the report. A
pure op outside the table whose inputs are small constants is evaluated here instead."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import Node as FxNode

from ..errors import CaptureError, GraphError
from ..ir import Graph, TensorType, dtype_name
from ..ops import evaluate
from .export import DATA_DEPENDENT_HELP, export, has_symbolic_dims, user_line
from .moe_forms import recognise_experts

aten = torch.ops.aten

# Side-effect-only checks of metadata that export already verified at capture time.
DROPPED = {aten._assert_tensor_metadata.default, aten._assert_scalar.default,
           torch.ops.aten.sym_constrain_range_for_size.default}


@dataclass
class Captured:
    """The IR of a captured model and what is needed to call it like the model."""

    graph: Graph
    in_spec: Any
    out_spec: Any
    fallback_ops: list[str] = field(default_factory=list)
    aten_op_counts: dict[str, int] = field(default_factory=dict)
    # State the model writes in place (functionalized by torch.export): the graph's first
    # len(mutations) outputs are the new values, ("state", name) of a buffer or parameter,
    # ("input", k) of user input k; the user outputs follow. `state` holds the written
    # tensors themselves (the module's own), read at run time as inputs after the user's.
    mutations: list[tuple[str, Any]] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    # layer calls spliced from a layer traced once (stamping.py), or why every layer was traced
    stamped_calls: int = 0
    stamping_fallback: str | None = None


class Unsupported(Exception):
    """A converter cannot express this particular call; the node falls back to torch."""



def capture_plain(model: Any, example_inputs: tuple,
                  example_kwargs: dict | None = None) -> Captured:
    """Every op of the model traced (no layer stamped)."""
    return from_exported(export(model, example_inputs, example_kwargs))


def from_exported(ep: ExportedProgram) -> Captured:
    return GraphConverter(ep).run()



class GraphConverter:
    def __init__(self, ep: ExportedProgram):
        self.ep = ep
        self.g = Graph()
        self.env: dict[FxNode, Any] = {}  # fx node -> IR id, or tuple of ids / None
        self.fallbacks: list[str] = []
        self.aten_counts: dict[str, int] = {}
        self.state: dict[str, torch.Tensor] = {}  # mutated buffers/parameters, read at run time
        self._known: dict[int, Any] = {}  # IR id -> its value where known at capture (or None)

    def run(self) -> Captured:
        recognise_experts(self.ep.graph)  # MoE experts as expert_mm (moe_forms.py)
        self._bind_inputs()
        out_node = None
        for node in self.ep.graph.nodes:
            if node.op == "call_function":
                if node.target in DROPPED:
                    continue
                name = str(node.target)
                self.aten_counts[name] = self.aten_counts.get(name, 0) + 1
                self.env[node] = self._convert(node)
            elif node.op == "output":
                out_node = node
        assert out_node is not None
        outs = torch.utils._pytree.tree_leaves(out_node.args[0])
        specs = self.ep.graph_signature.output_specs
        if len(specs) != len(outs):
            raise CaptureError(f"the exported graph has {len(outs)} outputs but its signature "
                               f"describes {len(specs)}")
        writes, mutations, results = [], [], []
        for o, spec in zip(outs, specs):
            value = self.env.get(o) if isinstance(o, FxNode) else None
            if not isinstance(value, int):
                raise CaptureError(f"model output {o!r} is not a tensor computed by the graph; "
                                   "only tensor outputs are supported")
            if spec.kind == OutputKind.USER_OUTPUT:
                results.append(value)
            else:
                writes.append(value)
                mutations.append(self._mutation(spec))
        self.g.outputs = writes + results
        spec = self.ep.call_spec
        return Captured(self.g, spec.in_spec, spec.out_spec, sorted(set(self.fallbacks)),
                        self.aten_counts, mutations, self.state)

    def _mutation(self, spec: Any) -> tuple[str, Any]:
        """Where an in-place write of the model lands: ("state", name) or ("input", k)."""
        if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION):
            return ("state", spec.target)
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            users = [s.arg.name for s in self.ep.graph_signature.input_specs
                     if s.kind == InputKind.USER_INPUT]
            return ("input", users.index(spec.target))
        raise CaptureError(f"the exported graph has an output of kind {spec.kind.name} "
                           f"({spec.target or spec.arg.name}); only model outputs and in-place "
                           "writes of buffers, parameters and inputs are supported")

    # -- inputs ----------------------------------------------------------------------------
    def _bind_inputs(self) -> None:
        placeholders = [n for n in self.ep.graph.nodes if n.op == "placeholder"]
        sig = self.ep.graph_signature
        user_index = 0
        n_user = sum(s.kind == InputKind.USER_INPUT for s in sig.input_specs)
        mutated = {s.target for s in sig.output_specs
                   if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)}
        zero_d: dict[tuple, int] = {}
        for node, spec in zip(placeholders, self.ep.graph_signature.input_specs):
            val = node.meta.get("val")
            if spec.kind == InputKind.USER_INPUT:
                if has_symbolic_dims(val):  # an ExportedProgram exported with dynamic_shapes
                    raise CaptureError(
                        f"input {node.name} has symbolic dims ({list(val.shape)}; ranges "
                        f"{self.ep.range_constraints}): programs here have static shapes. "
                        "Export without dynamic_shapes, or pass the nn.Module with example "
                        "inputs of the shapes it will be called with (torch.compile(model, "
                        "backend='eqsat_llm') specialises dynamic shapes per call)")
                if not isinstance(val, torch.Tensor):
                    raise CaptureError(f"input {node.name} is not a tensor ({type(val).__name__})"
                                       "; only tensor inputs are supported")
                self.env[node] = self.g.append("input", (), {"name": node.name,
                                               "index": user_index}, value_type(val))
                user_index += 1
                continue
            if spec.target in mutated:  # written in place: read at run time, never folded
                self.state[spec.target] = self._lookup_state(spec.target, spec.kind, live=True)
                self.env[node] = self.g.append("input", (), {
                    "name": node.name, "index": n_user + len(self.state) - 1}, value_type(val))
                continue
            tensor = self._lookup_state(spec.target, spec.kind)
            op = "param" if spec.kind == InputKind.PARAMETER else "const"
            same = _zero_d_key(tensor) if op == "const" else None
            if same in zero_d:  # one node per 0-d value: its uses become the same term
                self.env[node] = zero_d[same]
                continue
            self.g.constants[spec.target] = tensor
            self.env[node] = self.g.append(op, (), {"name": spec.target}, value_type(tensor))
            if same is not None:
                zero_d[same] = self.env[node]

    def _lookup_state(self, target: str, kind: InputKind, live: bool = False) -> torch.Tensor:
        """The tensor behind a parameter, buffer or constant; `live`: the object itself (the
        module's own, for writing into), else a detached alias."""
        for table in (self.ep.state_dict, self.ep.constants):
            if target in table:
                value = table[target]
                return value.detach() if isinstance(value, torch.Tensor) and not live else value
        raise CaptureError(f"{kind.name.lower()} {target!r} not found in the exported program")

    # -- ops ---------------------------------------------------------------------------------
    def _convert(self, node: FxNode) -> Any:
        if node.target is operator.getitem:
            base, index = node.args
            value = self.env[base]
            if isinstance(value, tuple):  # a supported multi-output op: its pieces
                if value[index] is None:
                    raise GraphError(f"{node.name}: output {index} of {base.target} is unused "
                                     "by the converter but read by the graph")
                return value[index]
            return self._check(node, self.g.append("getitem", (value,), {"index": index},
                                                   value_type(node.meta.get("val"))))
        val = node.meta.get("val")
        if has_symbolic_dims(val):  # exported with an unbacked size or number: data-dependent
            where = user_line([node.meta.get("stack_trace") or ""])
            raise CaptureError(
                f"{node.name} ({node.target}) has a shape or value that depends on the values "
                f"of tensors{' at ' + where if where else ''} (data-dependent: a boolean mask "
                f"index, nonzero, `.item()`, a size read from a tensor); {DATA_DEPENDENT_HELP}")
        if isinstance(val, torch.Tensor) and val.numel() == 0:
            # an empty tensor has no values to compute: a constant of its shape (users drop it
            # from concatenations; any other user runs in torch with it baked in, below)
            return self.g.add("full", shape=out_shape(node), value=0.0, dtype=out_dtype(node))
        if node.target is not aten.cat.default and any(
                is_empty(a) for a in node.all_input_nodes):
            return self._fallback(node)
        converter = ATEN.get(node.target)
        if converter is not None:
            try:
                result = converter(self, node, *node.args, **node.kwargs)
                return result if isinstance(result, tuple) else self._check(node, result)
            except Unsupported:
                pass
        return self._fallback(node)

    def _check(self, node: FxNode, ir_id: int) -> int:
        """The IR's inferred type must be the one torch recorded; a mismatch is a bug here."""
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            inferred, expected = self.g.node(ir_id).type, value_type(val)
            if inferred != expected:
                raise GraphError(f"{node.name} ({node.target}): inferred {inferred}, "
                                 f"torch recorded {expected}")
        return ir_id

    def _fallback(self, node: FxNode) -> int:
        tensors: list[FxNode] = []

        def mark(a: Any) -> Any:
            if isinstance(a, FxNode) and is_empty(a):  # no values: baked into the call
                v = a.meta["val"]
                return torch.empty(v.shape, dtype=v.dtype)
            if isinstance(a, FxNode):
                tensors.append(a)
                return Slot(len(tensors) - 1)
            return a

        template = torch.fx.node.map_aggregate((node.args, dict(node.kwargs)), mark)
        inputs = []
        for t in tensors:
            v = self.env[t]
            if not isinstance(v, int):
                raise CaptureError(f"{node.name}: unsupported op {node.target} reads a value "
                                   "that is not a single tensor")
            inputs.append(v)
        val = node.meta.get("val")
        known = self._constant_call(node, template, inputs)
        if known is not None:  # computed once, here: a constant, no torch step
            name = f"captured.{node.name}"
            self.g.constants[name] = known
            return self.g.append("const", (), {"name": name}, value_type(known))
        vtype = (tuple(value_type(v) for v in val) if isinstance(val, (tuple, list))
                 else value_type(val))
        name = str(node.target)
        if any(is_empty(a) for a in node.all_input_nodes):
            name += " (reading an empty tensor)"
        self.fallbacks.append(name)
        return self.g.append("fallback", tuple(inputs),
                             {"target": name, "key": len(self.g.nodes), "fn": node.target,
                              "template": template}, vtype)

    def _constant_call(self, node: FxNode, template: Any, inputs: list[int]
                       ) -> torch.Tensor | None:
        """The value of an op the registry lacks when its inputs are small constants known now
        (Gemma 3n's erfinv of its sparsity target) and it is a pure aten op; else None."""
        fn = node.target
        if not isinstance(fn, torch._ops.OpOverload) or fn._schema.is_mutable or \
                torch.Tag.nondeterministic_seeded in fn.tags:
            return None
        values = [self._known_value(i) for i in inputs]
        if any(v is None for v in values):
            return None
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.numel() > KNOWN_NUMEL:
            return None  # (a tuple, or a large result: left to run in torch)
        try:
            with torch.no_grad():
                out = run_fallback({"fn": fn, "template": template}, values)
        except Exception:  # noqa: BLE001 - whatever torch refuses here, it runs as a torch step
            return None
        return out.detach().clone() if isinstance(out, torch.Tensor) else None

    def _known_value(self, root: int) -> Any:
        """The value of IR node `root` if it is computed from small real constants only (no
        input, weight or meta tensor), by the ops' reference semantics; else None."""
        memo = self._known
        stack = [root]
        while stack:
            i = stack[-1]
            if i in memo:
                stack.pop()
                continue
            node = self.g.node(i)
            if node.op == "const":
                t = self.g.constants.get(node.attrs["name"])
                memo[i] = t if isinstance(t, torch.Tensor) and not t.is_meta and \
                    t.numel() <= KNOWN_NUMEL else None
            elif node.op in ("input", "param", "fallback", "getitem") or _large(node) or any(
                    j in memo and memo[j] is None for j in node.inputs):
                memo[i] = None
            elif pending := [j for j in node.inputs if j not in memo]:
                stack.extend(pending)
                continue
            else:
                try:
                    with torch.no_grad():
                        memo[i] = evaluate(node.op, [memo[j] for j in node.inputs], node.attrs)
                except Exception:  # noqa: BLE001 - not known here: the node stays as it is
                    memo[i] = None
            stack.pop()
        return memo[root]

    # helpers for converters
    def t(self, a: Any) -> int:
        """IR id of an argument: an fx node's value, or a Python number as a scalar node."""
        if isinstance(a, FxNode):
            v = self.env[a]
            if not isinstance(v, int):
                raise Unsupported
            return v
        if isinstance(a, bool):
            return self.g.add("scalar", value=float(a), kind="bool")
        if isinstance(a, int):
            return self.g.add("scalar", value=float(a), kind="int")
        if isinstance(a, float):
            return self.g.add("scalar", value=a, kind="float")
        raise Unsupported

    def rank(self, a: FxNode) -> int:
        return len(self.g.type_of(self.t(a)).shape)

    def shape(self, a: FxNode) -> tuple[int, ...]:
        return self.g.type_of(self.t(a)).shape


KNOWN_NUMEL = 4096  # constants evaluated at capture: small ones (a threshold, a table)


def _large(node: Any) -> bool:
    """A value too large to evaluate at capture (judged by its type, before computing it)."""
    return isinstance(node.type, TensorType) and math.prod(node.type.shape) > KNOWN_NUMEL


@dataclass(frozen=True)
class Slot:
    """Where a fallback's tensor argument goes in its captured call."""

    index: int


def run_fallback(attrs: dict[str, Any], xs: list[Any]) -> Any:
    """Call a fallback node's torch op with its inputs put back into the captured call."""
    def fill(a: Any) -> Any:
        return xs[a.index] if isinstance(a, Slot) else a
    args, kwargs = torch.fx.node.map_aggregate(attrs["template"], fill)
    return attrs["fn"](*args, **kwargs)


def is_empty(a: FxNode) -> bool:
    v = a.meta.get("val")
    return isinstance(v, torch.Tensor) and v.numel() == 0


def value_type(val: Any) -> TensorType:
    if not isinstance(val, torch.Tensor):
        raise CaptureError(f"expected a tensor value, got {type(val).__name__}")
    return TensorType(tuple(int(d) for d in val.shape), dtype_name(val.dtype))


def norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def out_shape(node: FxNode) -> list[int]:
    return [int(d) for d in node.meta["val"].shape]


def _zero_d_key(t: Any) -> tuple | None:
    """A 0-d tensor's dtype and bytes (0.0 and -0.0 apart), for tensors export lifts from
    `torch.tensor(False)` spelled twice; None for anything else."""
    if isinstance(t, torch.Tensor) and t.dim() == 0 and t.device.type != "meta":
        return (t.dtype, tuple(t.reshape(1).view(torch.uint8).tolist()))
    return None


def out_dtype(node: FxNode) -> str:
    return dtype_name(node.meta["val"].dtype)


# --- converters: aten op -> IR ------------------------------------------------------------------
Converter = Callable[..., Any]
ATEN: dict[Any, Converter] = {}


def converts(*targets: Any) -> Callable[[Converter], Converter]:
    def deco(fn: Converter) -> Converter:
        for t in targets:
            ATEN[t] = fn
        return fn
    return deco
