"""Frontend: a PyTorch model -> the IR, through torch.export and its core-aten decompositions.

Accepts an `nn.Module` (with example inputs), an `fx.GraphModule` (exported the same way) or
an `ExportedProgram`. Each aten op maps to a registry op by the table `ATEN`; an op outside it
becomes a `fallback` node that runs in torch as captured, so the regions around it are still
optimized, and its name is collected for the warning and the report.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import math
import operator
import os
import re
import sys
import traceback
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
from ..ops.elementwise import UNARY

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


class Unsupported(Exception):
    """A converter cannot express this particular call; the node falls back to torch."""


def export(model: Any, example_inputs: tuple, example_kwargs: dict | None = None
           ) -> ExportedProgram:
    """torch.export the model (strict mode first, then non-strict) and decompose to core aten."""
    if isinstance(model, ExportedProgram):
        ep = model
        check_example_inputs(ep, example_inputs, example_kwargs)
    else:
        if not isinstance(model, torch.nn.Module):
            raise CaptureError(f"expected an nn.Module, fx.GraphModule or ExportedProgram, "
                               f"got {type(model).__name__}")
        failures: list[tuple[str, Exception, str]] = []
        ep = None
        for strict in (False, True):
            # torch.export prints its partial graph to stderr when it fails and logs the
            # failed fake-tensor call: kept out of sight (CaptureError.details has them),
            # replayed when the export succeeds
            printed = io.StringIO()
            try:
                with contextlib.redirect_stderr(printed), _quiet(_EXPORT_LOGGERS):
                    ep = torch.export.export(model, tuple(example_inputs),
                                             example_kwargs or None, strict=strict)
                sys.stderr.write(printed.getvalue())
                break
            except Exception as exc:  # noqa: BLE001 - export's message names the construct
                failures.append((f"strict={strict}", exc, printed.getvalue()))
        if ep is None:
            raise _export_error(model, failures) from None
    return ep.run_decompositions(_decompositions())


# loggers that report, at ERROR/WARNING level with tracebacks, what the export's exception
# then says again (a failed fake-tensor call, an unbacked symbol without user code)
_EXPORT_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes",
                   "torch.export._trace")


@contextlib.contextmanager
def _quiet(names: tuple[str, ...]):
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# TypeErrors of binding the example inputs to forward's parameters (inspect.Signature.bind)
_SIGNATURE_ERROR = re.compile(r"too many positional arguments|missing a required argument|"
                              r"unexpected keyword argument|positional argument")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*([^\n]*)')
# torch's files and the whole eqsat_llm package's (this module is in eqsat_llm/capture/)
_NOT_USER = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)),
             "<frozen ")


def _user_line(texts: list[str], tracebacks: list[Any] = ()) -> str | None:
    """The innermost frame outside torch and eqsat_llm in torch's messages or stack traces
    ('File "m.py", line 6, in forward' + the code line) or the exceptions' tracebacks, as
    'm.py:6 in forward: `code`'; None when torch recorded none."""
    frames = [(f, int(n), fn, code.strip()) for t in texts for f, n, fn, code in _FRAME.findall(t)]
    frames += [(fr.filename, fr.lineno, fr.name, (fr.line or "").strip())
               for tb in tracebacks for fr in traceback.extract_tb(tb)]
    user = [f for f in frames if not f[0].startswith(_NOT_USER)]
    if not user:
        return None
    f, n, fn, code = user[-1]
    return f"{f}:{n} in {fn}" + (f": `{code}`" if code else "")


def _data_dependent(exc: BaseException) -> bool:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    text = str(exc).lower()
    return isinstance(exc, GuardOnDataDependentSymNode) or "data-dependent" in text \
        or "data dependent" in text


DATA_DEPENDENT_HELP = ("programs here are captured once, with fixed control flow and static "
                       "shapes: make it branchless (torch.where, a mask of fixed shape), express "
                       "the branch with torch.cond, or move it out of the model's forward")


def _export_error(model: Any, failures: list[tuple[str, Exception, str]]) -> CaptureError:
    """A short CaptureError for a failed torch.export: what went wrong, the model's source
    line where torch names one, what to do. torch's full messages (and the partial graph it
    prints) are in the error's `details`."""
    where = _user_line([str(e) for _, e, _ in failures], [e.__traceback__ for _, e, _ in failures])
    at = f" at {where}" if where else ""
    first = failures[0][1]
    if any(_data_dependent(e) for _, e, _ in failures):
        msg = (f"the model branches on the value of a tensor{at} (data-dependent control "
               f"flow: an `if`/`while` on a tensor, or `.item()`); {DATA_DEPENDENT_HELP}")
    elif isinstance(first, TypeError) and _SIGNATURE_ERROR.search(str(first)):
        try:
            sig = f"forward{inspect.signature(model.forward)}"
        except (TypeError, ValueError):
            sig = "the model's forward"
        msg = (f"the example inputs do not match {sig}: {first}; pass example_inputs "
               "(positional) and example_kwargs as forward takes them")
    else:
        text = str(first).strip()  # non-strict's: strict mode's mostly wraps the same error
        line = f"{type(first).__name__}: {text.splitlines()[0][:300] if text else ''}"
        msg = (f"torch.export could not capture the model{at}: {line} (check "
               "that the model runs in eager PyTorch on the example inputs; torch's full "
               "message: CaptureError.details)")
    err = CaptureError(msg)
    err.details = "\n".join(f"{mode}: {type(e).__name__}: {e}\n{printed}"
                             for mode, e, printed in failures)
    return err


def check_example_inputs(ep: ExportedProgram, example_inputs: tuple,
                         example_kwargs: dict | None) -> None:
    """An ExportedProgram is captured as exported (its example inputs are not traced again):
    example inputs given with it must be of the shapes and dtypes it was exported for."""
    if not example_inputs and not example_kwargs:
        return
    flat, spec = torch.utils._pytree.tree_flatten((tuple(example_inputs), example_kwargs or {}))
    if spec != ep.call_spec.in_spec:
        raise CaptureError(f"the example inputs are structured as {spec}, but the "
                           f"ExportedProgram takes {ep.call_spec.in_spec}")
    users = [s.arg.name for s in ep.graph_signature.input_specs
             if s.kind == InputKind.USER_INPUT]
    vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    for k, (x, name) in enumerate(zip(flat, users)):
        want = vals.get(name)
        if isinstance(x, torch.Tensor) and isinstance(want, torch.Tensor) and not _symbolic(
                want) and (x.shape != want.shape or x.dtype != want.dtype):
            raise CaptureError(f"example input {k} is {x.dtype}{list(x.shape)}, but the "
                               f"ExportedProgram was exported for {want.dtype}"
                               f"{list(want.shape)}: export it again for these shapes, or "
                               "pass the nn.Module")


def _symbolic(val: Any) -> bool:
    """A value torch left symbolic: a SymInt/SymFloat/SymBool (a number read from a tensor,
    `.item()`), or a tensor with a symbolic size (a dynamic dim, a data-dependent shape)."""
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    return isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape)


def _decompositions() -> dict:
    """Core-aten decompositions, except for scaled_dot_product_attention: kept whole, it maps
    to the registry's sdpa ops and the rules make it one attention kernel (decomposed, it is
    a dozen ops with a scale split across q and k and a guard for fully masked rows)."""
    table = torch.export.default_decompositions()
    table.pop(aten.scaled_dot_product_attention.default, None)
    return table


def capture_plain(model: Any, example_inputs: tuple,
                  example_kwargs: dict | None = None) -> Captured:
    """Every op of the model traced (no layer stamped)."""
    return from_exported(export(model, example_inputs, example_kwargs))


def from_exported(ep: ExportedProgram) -> Captured:
    return _Converter(ep).run()


class _Converter:
    def __init__(self, ep: ExportedProgram):
        self.ep = ep
        self.g = Graph()
        self.env: dict[FxNode, Any] = {}  # fx node -> IR id, or tuple of ids / None
        self.fallbacks: list[str] = []
        self.aten_counts: dict[str, int] = {}
        self.state: dict[str, torch.Tensor] = {}  # mutated buffers/parameters, read at run time
        self._known: dict[int, Any] = {}  # IR id -> its value where known at capture (or None)

    def run(self) -> Captured:
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
                if _symbolic(val):  # an ExportedProgram exported with dynamic_shapes
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
                                               "index": user_index}, _type(val))
                user_index += 1
                continue
            if spec.target in mutated:  # written in place: read at run time, never folded
                self.state[spec.target] = self._lookup_state(spec.target, spec.kind, live=True)
                self.env[node] = self.g.append("input", (), {
                    "name": node.name, "index": n_user + len(self.state) - 1}, _type(val))
                continue
            tensor = self._lookup_state(spec.target, spec.kind)
            op = "param" if spec.kind == InputKind.PARAMETER else "const"
            same = _zero_d_key(tensor) if op == "const" else None
            if same in zero_d:  # one node per 0-d value: its uses become the same term
                self.env[node] = zero_d[same]
                continue
            self.g.constants[spec.target] = tensor
            self.env[node] = self.g.append(op, (), {"name": spec.target}, _type(tensor))
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
                                                   _type(node.meta.get("val"))))
        val = node.meta.get("val")
        if _symbolic(val):  # exported with an unbacked size or number: data-dependent
            where = _user_line([node.meta.get("stack_trace") or ""])
            raise CaptureError(
                f"{node.name} ({node.target}) has a shape or value that depends on the values "
                f"of tensors{' at ' + where if where else ''} (data-dependent: a boolean mask "
                f"index, nonzero, `.item()`, a size read from a tensor); {DATA_DEPENDENT_HELP}")
        if isinstance(val, torch.Tensor) and val.numel() == 0:
            # an empty tensor has no values to compute: a constant of its shape (users drop it
            # from concatenations; any other user runs in torch with it baked in, below)
            return self.g.add("full", shape=_out_shape(node), value=0.0, dtype=_out_dtype(node))
        if node.target is not aten.cat.default and any(
                _is_empty(a) for a in node.all_input_nodes):
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
            inferred, expected = self.g.node(ir_id).type, _type(val)
            if inferred != expected:
                raise GraphError(f"{node.name} ({node.target}): inferred {inferred}, "
                                 f"torch recorded {expected}")
        return ir_id

    def _fallback(self, node: FxNode) -> int:
        tensors: list[FxNode] = []

        def mark(a: Any) -> Any:
            if isinstance(a, FxNode) and _is_empty(a):  # no values: baked into the call
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
            return self.g.append("const", (), {"name": name}, _type(known))
        vtype = (tuple(_type(v) for v in val) if isinstance(val, (tuple, list)) else _type(val))
        name = str(node.target)
        if any(_is_empty(a) for a in node.all_input_nodes):
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
        with torch.no_grad():
            out = run_fallback({"fn": fn, "template": template}, values)
        small = isinstance(out, torch.Tensor) and out.numel() <= KNOWN_NUMEL
        return out.detach().clone() if small else None

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
            elif node.op in ("input", "param", "fallback", "getitem") or any(
                    j in memo and memo[j] is None for j in node.inputs):
                memo[i] = None
            elif pending := [j for j in node.inputs if j not in memo]:
                stack.extend(pending)
                continue
            else:
                with torch.no_grad():
                    v = evaluate(node.op, [memo[j] for j in node.inputs], node.attrs)
                memo[i] = v if not isinstance(v, torch.Tensor) or v.numel() <= KNOWN_NUMEL \
                    else None
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


def _is_empty(a: FxNode) -> bool:
    v = a.meta.get("val")
    return isinstance(v, torch.Tensor) and v.numel() == 0


def _type(val: Any) -> TensorType:
    if not isinstance(val, torch.Tensor):
        raise CaptureError(f"expected a tensor value, got {type(val).__name__}")
    return TensorType(tuple(int(d) for d in val.shape), dtype_name(val.dtype))


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _out_shape(node: FxNode) -> list[int]:
    return [int(d) for d in node.meta["val"].shape]


def _zero_d_key(t: Any) -> tuple | None:
    """A 0-d tensor's dtype and bytes (0.0 and -0.0 apart), for tensors export lifts from
    `torch.tensor(False)` spelled twice; None for anything else."""
    if isinstance(t, torch.Tensor) and t.dim() == 0 and t.device.type != "meta":
        return (t.dtype, tuple(t.reshape(1).view(torch.uint8).tolist()))
    return None


def _out_dtype(node: FxNode) -> str:
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


@converts(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _view(c: _Converter, node: FxNode, x: FxNode, *_: Any) -> int:
    return c.g.add("view", (c.t(x),), shape=_out_shape(node))


@converts(aten.permute.default)
def _permute(c: _Converter, node: FxNode, x: FxNode, dims: list[int]) -> int:
    r = c.rank(x)
    return c.g.add("permute", (c.t(x),), dims=[_dim(d, r) for d in dims])


@converts(aten.transpose.int)
def _transpose(c: _Converter, node: FxNode, x: FxNode, d0: int, d1: int) -> int:
    r = c.rank(x)
    return c.g.add("transpose", (c.t(x),), dim0=_dim(d0, r), dim1=_dim(d1, r))


@converts(aten.t.default)
def _t(c: _Converter, node: FxNode, x: FxNode) -> int:
    if c.rank(x) < 2:
        return c.g.add("clone", (c.t(x),))
    return c.g.add("transpose", (c.t(x),), dim0=0, dim1=1)


@converts(aten.expand.default)
def _expand(c: _Converter, node: FxNode, x: FxNode, size: list[int], **_: Any) -> int:
    return c.g.add("expand", (c.t(x),), shape=_out_shape(node))


@converts(aten.repeat.default)
def _repeat(c: _Converter, node: FxNode, x: FxNode, repeats: list[int]) -> int:
    """x.repeat(r) as the layout ops it is: a unit axis before each dim (view), that axis
    expanded to r[i], the pairs merged (the view that copies): no torch step (BLOOM's ALiBi)."""
    s = [1] * (len(repeats) - c.rank(x)) + list(c.shape(x))
    unit = c.g.add("view", (c.t(x),), shape=[d for n in s for d in (1, n)])
    tiled = c.g.add("expand", (unit,), shape=[d for r, n in zip(repeats, s) for d in (r, n)])
    return c.g.add("view", (tiled,), shape=_out_shape(node))


@converts(aten.unsqueeze.default)
def _unsqueeze(c: _Converter, node: FxNode, x: FxNode, dim: int) -> int:
    return c.g.add("unsqueeze", (c.t(x),), dim=_dim(dim, c.rank(x) + 1))


@converts(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _clone(c: _Converter, node: FxNode, x: FxNode, **_: Any) -> int:
    return c.g.add("clone", (c.t(x),))


@converts(aten._to_copy.default)
def _to_copy(c: _Converter, node: FxNode, x: FxNode, **kwargs: Any) -> int:
    # (a model whose weights are on the meta device moves its buffers to its activations'
    # device, meta: the program runs on one device, its backend's)
    if kwargs.get("device") not in (None, torch.device("cpu"), torch.device("meta")) and \
            "val" in node.meta:
        raise Unsupported
    return c.g.add("to_dtype", (c.t(x),), dtype=_out_dtype(node))


@converts(aten.slice.Tensor)
def _slice(c: _Converter, node: FxNode, x: FxNode, dim: int = 0, start: int | None = None,
           end: int | None = None, step: int = 1) -> int:
    shape = c.shape(x)
    dim = _dim(dim, len(shape))
    n = shape[dim]
    start = 0 if start is None else max(0, min(n, start + n if start < 0 else start))
    end = n if end is None else max(0, min(n, end + n if end < 0 else end))
    return c.g.add("slice", (c.t(x),), dim=dim, start=start, end=max(start, end), step=step)


@converts(aten.slice_scatter.default)
def _slice_scatter(c: _Converter, node: FxNode, base: FxNode, src: FxNode, dim: int = 0,
                   start: int | None = None, end: int | None = None, step: int = 1) -> int:
    """x[..., a:b] = src written functionally (MLA's q_pe / k_pe placed beside the rest): the
    parts of `base` either side of [a, b) concatenated around `src`."""
    shape = c.shape(base)
    dim = _dim(dim, len(shape))
    n = shape[dim]
    start = 0 if start is None else max(0, min(n, start + n if start < 0 else start))
    end = n if end is None else max(start, min(n, end + n if end < 0 else end))
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


def _strided_scatter(c: _Converter, base: FxNode, src: FxNode, dim: int, start: int, end: int,
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
def _copy(c: _Converter, node: FxNode, dst: FxNode, src: FxNode, non_blocking: bool = False
          ) -> int:
    """dst.copy_(src) written functionally: src's values in dst's dtype and shape (dst's own
    values are not read)."""
    x = c.t(src)
    if c.g.type_of(x).dtype != _out_dtype(node):
        x = c.g.add("to_dtype", (x,), dtype=_out_dtype(node))
    if list(c.g.type_of(x).shape) != _out_shape(node):
        x = c.g.add("expand", (x,), shape=_out_shape(node))
    return x


@converts(aten.empty.memory_format)
def _empty(c: _Converter, node: FxNode, size: list[int], **_: Any) -> int:
    # its values are unspecified (the model writes them before reading): zeros are as good
    return c.g.add("full", shape=_out_shape(node), value=0.0, dtype=_out_dtype(node))


@converts(aten.select.int)
def _select(c: _Converter, node: FxNode, x: FxNode, dim: int, index: int) -> int:
    shape = c.shape(x)
    dim = _dim(dim, len(shape))
    return c.g.add("select", (c.t(x),), dim=dim, index=_dim(index, shape[dim]))


@converts(aten.cat.default)
def _cat(c: _Converter, node: FxNode, xs: list[FxNode], dim: int = 0) -> int:
    parts = [x for x in xs if not _is_empty(x)]  # empty pieces add nothing (output non-empty)
    return c.g.add("cat", [c.t(x) for x in parts], dim=_dim(dim, len(_out_shape(node))))


@converts(aten.split_with_sizes.default, aten.split.Tensor)
def _split(c: _Converter, node: FxNode, x: FxNode, sizes: Any, dim: int = 0) -> tuple:
    shape = c.shape(x)
    dim = _dim(dim, len(shape))
    if isinstance(sizes, int):
        sizes = [min(sizes, shape[dim] - s) for s in range(0, shape[dim], sizes)]
    pieces, start = [], 0
    for s in sizes:
        pieces.append(c.g.add("slice", (c.t(x),), dim=dim, start=start, end=start + s, step=1))
        start += s
    return tuple(pieces)


@converts(aten.mm.default)
def _mm(c: _Converter, node: FxNode, a: FxNode, b: FxNode) -> int:
    return c.g.add("mm", (c.t(a), c.t(b)), alpha=1.0)


@converts(aten.bmm.default)
def _bmm(c: _Converter, node: FxNode, a: FxNode, b: FxNode) -> int:
    return c.g.add("bmm", (c.t(a), c.t(b)), alpha=1.0)


@converts(aten.addmm.default)
def _addmm(c: _Converter, node: FxNode, bias: FxNode, a: FxNode, b: FxNode, *,
           beta: float = 1, alpha: float = 1) -> int:
    return c.g.add("addmm", (c.t(bias), c.t(a), c.t(b)), beta=float(beta), alpha=float(alpha))


@converts(aten.matmul.default)
def _matmul(c: _Converter, node: FxNode, a: FxNode, b: FxNode) -> int:
    if c.rank(b) > c.rank(a) or c.rank(a) < 2:
        raise Unsupported  # broadcasting a lower-rank left side: run in torch
    return c.g.add("matmul", (c.t(a), c.t(b)), alpha=1.0)


@converts(aten.linear.default)
def _linear(c: _Converter, node: FxNode, x: FxNode, w: FxNode, b: FxNode | None = None) -> int:
    if b is None:
        return c.g.add("linear", (c.t(x), c.t(w)))
    return c.g.add("linear_bias", (c.t(x), c.t(w), c.t(b)))


def _binary(op: str) -> Converter:
    def convert(c: _Converter, node: FxNode, a: Any, b: Any, *, alpha: Any = 1) -> int:
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
def _rsub(c: _Converter, node: FxNode, a: Any, b: Any, *, alpha: Any = 1) -> int:
    return _binary("sub")(c, node, b, a, alpha=alpha)


def _number(c: _Converter, a: Any) -> Any:
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


def _filled(c: _Converter, a: Any) -> int:
    """A 0-d float constant as a `full` of the value it holds (so that the rules see it, as
    XGLM's `maximum(scores, finfo.min)`); anything else as it is."""
    value = _number(c, a)
    if isinstance(value, float) and isinstance(a, FxNode):
        return c.g.add("full", shape=[], value=value, dtype=_out_dtype(a))
    return c.t(a)


@converts(aten.maximum.default, aten.minimum.default)
def _maximum_minimum(c: _Converter, node: FxNode, a: Any, b: Any) -> int:
    op = "maximum" if node.target is aten.maximum.default else "minimum"
    return c.g.add(op, (_filled(c, a), _filled(c, b)))


@converts(aten.where.self)
def _where(c: _Converter, node: FxNode, cond: FxNode, a: Any, b: Any) -> int:
    return c.g.add("where", (c.t(cond), c.t(_number(c, a)), c.t(_number(c, b))))


@converts(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(c: _Converter, node: FxNode, x: FxNode, mask: FxNode, value: Any) -> int:
    return c.g.add("where", (c.t(mask), c.t(value), c.t(x)))


def _unary(op: str) -> Converter:
    def convert(c: _Converter, node: FxNode, x: FxNode) -> int:
        return c.g.add(op, (c.t(x),))
    return convert


for _op in UNARY:  # each the aten op of its name
    converts(getattr(aten, _op).default)(_unary(_op))


@converts(aten.gelu.default)
def _gelu(c: _Converter, node: FxNode, x: FxNode, approximate: str = "none") -> int:
    return c.g.add("gelu", (c.t(x),), approximate=approximate)


@converts(aten.triu.default, aten.tril.default)
def _tri(c: _Converter, node: FxNode, x: FxNode, diagonal: int = 0) -> int:
    return c.g.add(node.target.__name__.split(".")[0], (c.t(x),), diagonal=diagonal)


def _reduction(op: str) -> Converter:
    def convert(c: _Converter, node: FxNode, x: FxNode, dims: Any = None,
                keepdim: bool = False, *, dtype: Any = None) -> int:
        r, xs = c.rank(x), c.t(x)
        if dtype is not None:  # torch converts the input, then reduces in that dtype
            xs = c.g.add("to_dtype", (xs,), dtype=_out_dtype(node))
        return c.g.add(op, (xs,), dims=_dims(dims, r), keepdim=bool(keepdim))
    return convert


def _dims(dims: Any, rank: int) -> list[int]:
    """A reduction's dims, non-negative and sorted (none or [] = all)."""
    dims = list(range(rank)) if dims is None or dims == [] else dims
    dims = [dims] if isinstance(dims, int) else dims
    return sorted(_dim(d, rank) for d in dims)


converts(aten.sum.dim_IntList, aten.sum.default)(_reduction("sum"))
converts(aten.mean.dim, aten.mean.default)(_reduction("mean"))
converts(aten.amax.default)(_reduction("amax"))
converts(aten.amin.default)(_reduction("amin"))
converts(aten.any.dim, aten.any.dims, aten.any.default)(_reduction("any"))


@converts(aten.var.correction)
def _var(c: _Converter, node: FxNode, x: FxNode, dims: Any = None, *, correction: Any = None,
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


@converts(aten.clamp.default)
def _clamp(c: _Converter, node: FxNode, x: FxNode, lo: Any = None, hi: Any = None) -> int:
    """clamp(x, lo, hi) with number bounds on a float tensor: maximum / minimum with them
    (NaN stays NaN in both)."""
    dtype = c.g.type_of(c.t(x)).dtype
    if not dtype.startswith(("float", "bfloat")) or not all(
            isinstance(b, (int, float)) or b is None for b in (lo, hi)):
        raise Unsupported
    out = c.t(x)
    for op, bound in (("maximum", lo), ("minimum", hi)):
        if bound is not None:
            out = c.g.add(op, (out, c.g.add("full", shape=[], value=float(bound),
                                            dtype=dtype)))
    return out


@converts(aten.max.dim, aten.min.dim)
def _max_dim(c: _Converter, node: FxNode, x: FxNode, dim: int, keepdim: bool = False) -> tuple:
    # (values, indices): the values alone are amax / amin (attention sinks subtract the row
    # max before their softmax); the indices run in torch
    if not node.users or any(u.args[1] != 0 for u in node.users):
        raise Unsupported
    op = "amax" if node.target == aten.max.dim else "amin"
    out = c.g.add(op, (c.t(x),), dims=[_dim(dim, c.rank(x))], keepdim=bool(keepdim))
    c._check(next(iter(node.users)), out)
    return (out, None)


@converts(aten._softmax.default, aten._log_softmax.default, aten.softmax.int,
          aten.log_softmax.int)
def _softmax(c: _Converter, node: FxNode, x: FxNode, dim: int, half_to_float: Any = False,
             **_: Any) -> int:
    if half_to_float not in (False, None):
        raise Unsupported
    op = "log_softmax" if "log" in str(node.target) else "softmax"
    return c.g.add(op, (c.t(x),), dim=_dim(dim, c.rank(x)))


@converts(aten.cumsum.default)
def _cumsum(c: _Converter, node: FxNode, x: FxNode, dim: int, *, dtype: Any = None) -> int:
    if dtype is not None:
        raise Unsupported
    return c.g.add("cumsum", (c.t(x),), dim=_dim(dim, c.rank(x)))


@converts(aten.native_layer_norm.default)
def _native_layer_norm(c: _Converter, node: FxNode, x: FxNode, normalized_shape: list[int],
                       w: FxNode | None, b: FxNode | None, eps: float) -> tuple:
    if any(u.args[1] != 0 for u in node.users):
        raise Unsupported  # the mean/rstd outputs run in torch
    out = c.g.add("layer_norm", (c.t(x), *_affine(c, x, normalized_shape, w, b)),
                  normalized_shape=list(normalized_shape), eps=float(eps))
    c._check(next(iter(node.users)), out)
    return (out, None, None)


@converts(aten.layer_norm.default)
def _layer_norm(c: _Converter, node: FxNode, x: FxNode, normalized_shape: list[int],
                w: FxNode | None = None, b: FxNode | None = None, eps: float = 1e-5,
                *_: Any) -> int:
    return c.g.add("layer_norm", (c.t(x), *_affine(c, x, normalized_shape, w, b)),
                   normalized_shape=list(normalized_shape), eps=float(eps))


def _affine(c: _Converter, x: FxNode, shape: list[int], w: FxNode | None,
            b: FxNode | None) -> tuple[int, int]:
    """A layer norm's weight and bias; a missing one is the identity (ones / zeros), which
    is what torch computes without it (x * 1 + 0 is exact)."""
    dtype = c.g.type_of(c.t(x)).dtype

    def given_or(a: FxNode | None, value: float) -> int:
        return c.t(a) if a is not None else c.g.add("full", shape=list(shape), value=value,
                                                      dtype=dtype)
    return given_or(w, 1.0), given_or(b, 0.0)


@converts(aten.embedding.default)
def _embedding(c: _Converter, node: FxNode, w: FxNode, ids: FxNode, *rest: Any) -> int:
    return c.g.add("embedding", (c.t(w), c.t(ids)))


@converts(aten.index_select.default)
def _index_select(c: _Converter, node: FxNode, x: FxNode, dim: int, idx: FxNode) -> int:
    return c.g.add("index_select", (c.t(x), c.t(idx)), dim=_dim(dim, c.rank(x)))


@converts(aten.index.Tensor)
def _index(c: _Converter, node: FxNode, x: FxNode, indices: list[FxNode | None]) -> int:
    positions = [i for i, t in enumerate(indices) if t is not None]
    inputs = [c.t(x)] + [c.t(indices[i]) for i in positions]
    return c.g.append("index", tuple(inputs), {"positions": positions},
                      _type(node.meta["val"]))


@converts(aten.full.default)
def _full(c: _Converter, node: FxNode, size: list[int], value: Any, **_: Any) -> int:
    return c.g.add("full", shape=_out_shape(node), value=float(value), dtype=_out_dtype(node))


@converts(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default)
def _full_like(c: _Converter, node: FxNode, x: FxNode, *args: Any, **_: Any) -> int:
    # only x's shape and dtype are read: a shape-only constant
    value = args[0] if node.target == aten.full_like.default else \
        float("zeros" not in str(node.target))
    return c.g.add("full", shape=_out_shape(node), value=float(value), dtype=_out_dtype(node))


@converts(aten.gather.default)
def _gather(c: _Converter, node: FxNode, x: FxNode, dim: int, idx: FxNode, **kw: Any) -> int:
    if kw.get("sparse_grad"):
        raise Unsupported
    return c.g.append("gather", (c.t(x), c.t(idx)), {"dim": _dim(dim, c.rank(x))},
                      _type(node.meta["val"]))


@converts(aten.scalar_tensor.default)
def _scalar_tensor(c: _Converter, node: FxNode, value: Any, **_: Any) -> int:
    return c.g.add("full", shape=[], value=float(value), dtype=_out_dtype(node))


@converts(aten.zeros.default, aten.ones.default)
def _zeros_ones(c: _Converter, node: FxNode, size: list[int], **_: Any) -> int:
    value = 0.0 if "zeros" in str(node.target) else 1.0
    return c.g.add("full", shape=_out_shape(node), value=value, dtype=_out_dtype(node))


@converts(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(c: _Converter, node: FxNode, *args: Any, **_: Any) -> int:
    if node.target == aten.arange.default:
        start, end, step = 0, args[0], 1
    else:
        start, end, step = (list(args) + [1])[:3]
    out = _type(node.meta["val"])
    return c.g.append("arange", (), {"start": float(start), "end": float(end),
                                     "step": float(step), "dtype": out.dtype}, out)


@converts(aten.scaled_dot_product_attention.default,
          aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa(c: _Converter, node: FxNode, q: FxNode, k: FxNode, v: FxNode, *args: Any,
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


