"""Repeated layers traced once: capture of deep models in the time of one layer.

torch.export traces every op of every layer, and its core-ATen decomposition traces them again:
0.8 s a layer of LLaMA-7B's shapes on a 2-core machine, three quarters of a 32-layer
optimize() (benchmarks/scale.py). A deep model repeats one layer, so:

1. **Which layers are the same function.** Children of an `nn.ModuleList` / `nn.Sequential`
   are grouped when they compute the same function of their inputs and their own weights: the
   same classes all the way down, the same parameter and buffer names, shapes, dtypes and
   strides, equal plain attributes (a `layer_idx` that differs keeps layers apart: the forward
   may branch on it), no hooks and no patched `forward` (`same_function`).
2. **Tracing.** While the model is exported, each grouped layer's forward is wrapped: the first
   call with given input types is traced as usual and its output types are recorded; a later
   call of the group with the same input types (and only tensors, positionally) becomes one
   node of the custom op `eqsat_llm::layer(inputs, weights, key)` whose result has the
   recorded types. Export and its decomposition then cost one layer plus the glue.
3. **Splicing.** The layer traced first is captured alone (a *template*: its own IR, weights as
   leaves named as in the layer), and the frontend's converter of `eqsat_llm::layer` copies the
   template into the model's IR with the call's inputs and the call's own weights. The IR is
   the one a full trace gives (tests/test_stamping.py compares them), so nothing after capture
   changes.

Anything unexpected falls back to the full trace: a template that writes state in place, that
fails to export, or a trace that fails with stamping (the plain capture then reports its own
error). Models whose layers take keyword arguments or caches (transformers') are traced in
full: their calls are not stamped.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .converter import Captured, capture_plain, converts, from_exported
from .export import export

_KEYS = itertools.count()
# key -> the stamp its `eqsat_llm::layer` nodes stand for, while a capture runs
_ACTIVE: dict[int, _Stamp] = {}
# the attributes every nn.Module has (training, parameter and hook tables): not compared as
# plain attributes
_MODULE_INTERNALS = frozenset(vars(nn.Module()))
_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                "_backward_pre_hooks")
# the last capture: how many layer calls were stamped, or why it fell back to a full trace
LAST: dict[str, Any] = {"stamped_calls": 0, "fallback": None}


@torch.library.custom_op("eqsat_llm::layer", mutates_args=())
def _layer(inputs: list[torch.Tensor], weights: list[torch.Tensor],
           key: int) -> list[torch.Tensor]:
    """A stamped layer call: exists only inside a capture (the converter replaces it)."""
    raise RuntimeError("eqsat_llm::layer is a capture placeholder and never runs")


@_layer.register_fake
def _layer_fake(inputs: list[torch.Tensor], weights: list[torch.Tensor],
                key: int) -> list[torch.Tensor]:
    device = inputs[0].device
    return [torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for shape, stride, dtype in _ACTIVE[key].outputs]


Meta = tuple  # (shape, stride, dtype) of a tensor


def _meta(t: torch.Tensor) -> Meta:
    return tuple(t.shape), tuple(t.stride()), t.dtype


@dataclass
class _Stamp:
    """One group of layers called with one tuple of input types: the layer traced for it and
    its result types; the template is captured after the trace."""

    key: int
    layer: nn.Module
    inputs: list[Meta]
    device: torch.device
    outputs: list[Meta]
    single: bool  # the layer returns a tensor, not a tuple
    weight_names: list[str]  # the layer's parameters then buffers, in the order calls pass them
    template: Captured | None = None
    shared: dict[str, int] = field(default_factory=dict)  # template constant -> its IR id


# --- 1. which layers compute the same function ------------------------------------------------
def same_function(a: nn.Module, b: nn.Module) -> bool:
    """Whether two modules compute the same function of their inputs and their own weights."""
    ma, mb = dict(a.named_modules()), dict(b.named_modules())
    return ma.keys() == mb.keys() and all(_same_module(ma[k], mb[k]) for k in ma)


def _same_module(a: nn.Module, b: nn.Module) -> bool:
    if type(a) is not type(b) or a.training != b.training:
        return False
    if any(getattr(m, h) for m in (a, b) for h in _HOOK_TABLES) or \
            "forward" in vars(a) or "forward" in vars(b):
        return False
    if a._non_persistent_buffers_set != b._non_persistent_buffers_set:
        return False
    if not (_same_tensors(a._parameters, b._parameters)
            and _same_tensors(a._buffers, b._buffers)):
        return False
    names = (vars(a).keys() | vars(b).keys()) - _MODULE_INTERNALS
    return all(k in vars(a) and k in vars(b) and _equal(vars(a)[k], vars(b)[k]) for k in names)


def _same_tensors(x: dict[str, Any], y: dict[str, Any]) -> bool:
    if x.keys() != y.keys():
        return False
    for k, t in x.items():
        u = y[k]
        if (t is None) != (u is None):
            return False
        if t is not None and (_meta(t) != _meta(u) or t.device != u.device
                              or t.requires_grad != u.requires_grad):
            return False
    return True


def _equal(x: Any, y: Any) -> bool:
    """Plain attributes are equal values of one type; any other object only itself."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return x is y
    if type(x) is not type(y):
        return False
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - an object that cannot say: not the same
        return False


# Below this many layers the template's own export costs more than the layers it saves
# (LLaMA-7B's block, CPU time: 2 layers 2.2 s stamped against 1.4 s traced in full, 3 layers
# 2.6 against 2.3, 4 layers 2.3 against 2.9, 6 layers 2.5 against 3.7).
MIN_LAYERS = 4


def repeated_layers(model: nn.Module) -> list[list[nn.Module]]:
    """Groups of MIN_LAYERS or more sibling layers (of a ModuleList or Sequential) that compute
    the same function. Only layers made of modules: a single Linear or activation is one or
    two ops, cheaper to trace than to splice."""
    groups: list[list[nn.Module]] = []
    for container in model.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        found: list[list[nn.Module]] = []
        for child in container.children():
            if not any(True for _ in child.children()):
                continue
            group = next((g for g in found if same_function(g[0], child)), None)
            if group is None:
                found.append([child])
            else:
                group.append(child)
        groups += [g for g in found if len(g) >= MIN_LAYERS]
    return groups


def _global_hooks() -> bool:
    from torch.nn.modules import module

    return any(getattr(module, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks"))


# --- 2. tracing ---------------------------------------------------------------------------------
@contextmanager
def _stamped(groups: list[list[nn.Module]], stamps: dict[tuple, _Stamp | None]) -> Iterator[None]:
    """Wrap the forward of every grouped layer for the time of one export (restored after);
    `stamps` collects what the trace records."""
    patched = []
    try:
        for gid, group in enumerate(groups):
            for layer in group:
                layer.forward = _stamped_forward(layer, gid, layer.forward, stamps)
                patched.append(layer)
        yield
    finally:
        for layer in patched:
            del layer.forward


def _stamped_forward(layer: nn.Module, gid: int, original: Any,
                     stamps: dict[tuple, _Stamp | None]) -> Any:
    def forward(*args: Any, **kwargs: Any) -> Any:
        # only torch.export's own (non-strict) trace is stamped, and only plain tensor calls
        if (kwargs or not args or not torch.compiler.is_exporting()
                or torch.compiler.is_dynamo_compiling() or torch.is_autocast_enabled()
                or not all(isinstance(a, torch.Tensor) for a in args)):
            return original(*args, **kwargs)
        inputs = [_meta(a) for a in args]
        if not all(isinstance(d, int) for m in inputs for d in m[0]):  # symbolic: not stamped
            return original(*args)
        key = (gid, tuple(inputs), args[0].device)
        if key not in stamps:  # the first such call is traced; its result types recorded
            out = original(*args)
            stamps[key] = _record(layer, inputs, args[0].device, out)
            return out
        stamp = stamps[key]
        if stamp is None:  # the traced call returned something else than tensors
            return original(*args)
        weights = [t for _, t in layer.named_parameters()] + [t for _, t in layer.named_buffers()]
        out = torch.ops.eqsat_llm.layer(list(args), weights, stamp.key)
        return out[0] if stamp.single else tuple(out)
    return forward


def _record(layer: nn.Module, inputs: list[Meta], device: torch.device,
            out: Any) -> _Stamp | None:
    outs = [out] if isinstance(out, torch.Tensor) else out
    if not isinstance(outs, (list, tuple)) or not outs or not all(
            isinstance(o, torch.Tensor) for o in outs):
        return None
    names = [n for n, _ in layer.named_parameters()] + [n for n, _ in layer.named_buffers()]
    stamp = _Stamp(next(_KEYS), layer, inputs, device, [_meta(o) for o in outs],
                   isinstance(out, torch.Tensor), names)
    _ACTIVE[stamp.key] = stamp
    return stamp


# --- 3. templates and splicing ------------------------------------------------------------------
def capture_stamped(model: Any, example_inputs: tuple,
                    example_kwargs: dict | None) -> Captured | None:
    """The model's capture with its repeated layers traced once; None where stamping does not
    apply or did not work out (the caller then captures in full)."""
    LAST.update(stamped_calls=0, fallback=None)
    if not isinstance(model, nn.Module) or isinstance(model, torch.fx.GraphModule) or \
            _global_hooks():
        return None
    groups = repeated_layers(model)
    if not groups:
        return None
    stamps: dict[tuple, _Stamp | None] = {}
    try:
        with _stamped(groups, stamps):
            ep = export(model, example_inputs, example_kwargs)
        used = [n.args[2] for n in ep.graph.nodes
                if n.target is torch.ops.eqsat_llm.layer.default]
        for key in set(used):
            if not _template(_ACTIVE[key]):
                LAST["fallback"] = "a repeated layer writes state in place"
                return None
        captured = from_exported(ep)
        captured.aten_op_counts = {k: n for k, n in captured.aten_op_counts.items() if n}
        LAST["stamped_calls"] = len(used)
        return captured
    except Exception as exc:  # noqa: BLE001 - the full trace reports what is wrong, if anything
        LAST["fallback"] = f"{type(exc).__name__}: {exc}"
        return None
    finally:
        for stamp in stamps.values():
            if stamp is not None:
                _ACTIVE.pop(stamp.key, None)


def _template(stamp: _Stamp) -> bool:
    """Capture the layer traced for `stamp` on its own; False unless it is a pure function of
    its tensor inputs and weights (no state written in place)."""
    inputs = tuple(torch.empty_strided(shape, stride, dtype=dtype, device=stamp.device)
                   for shape, stride, dtype in stamp.inputs)
    template = capture_plain(stamp.layer, inputs, None)
    if template.mutations or template.state or \
            len(template.graph.outputs) != len(stamp.outputs):
        return False
    stamp.template = template
    return True


@converts(torch.ops.eqsat_llm.layer.default)
def _splice(c: Any, node: Any, inputs: list, weights: list, key: int) -> tuple[int, ...]:
    """A stamped call: the template's IR, reading this call's inputs and weights."""
    stamp = _ACTIVE[key]
    template = stamp.template
    assert template is not None
    by_name = dict(zip(stamp.weight_names, (c.t(w) for w in weights)))
    args = [c.t(x) for x in inputs]
    g, t = c.g, template.graph
    remap: dict[int, int] = {}
    live = t.live_ids()
    for n in t.nodes:
        if n.id not in live:
            continue
        if n.op == "input":
            remap[n.id] = args[n.attrs["index"]]
        elif n.op in ("param", "const"):
            name = n.attrs["name"]
            remap[n.id] = by_name[name] if name in by_name else _shared(c, stamp, n)
        else:
            attrs = dict(n.attrs)  # each call's node its own attributes
            if n.op == "fallback":  # fallbacks are found by key: one per node
                attrs["key"] = len(g.nodes)
            remap[n.id] = g.append(n.op, tuple(remap[i] for i in n.inputs), attrs, n.type)
    # the report counts the layer's own ATen ops, not the placeholder and its getitems (the
    # getitems of its users are counted after this call: counted down ahead of them)
    getitems = sum(u.target is operator.getitem for u in node.users)
    for name, n in ((str(node.target), 1), (str(operator.getitem), getitems)):
        c.aten_counts[name] = c.aten_counts.get(name, 0) - n  # (zeros dropped after the capture)
    for op, count in template.aten_op_counts.items():
        c.aten_counts[op] = c.aten_counts.get(op, 0) + count
    c.fallbacks += template.fallback_ops
    return tuple(remap[o] for o in t.outputs)


def _shared(c: Any, stamp: _Stamp, n: Any) -> int:
    """A constant of the layer's own code (not one of its weights): one leaf for all calls."""
    name = n.attrs["name"]
    if name not in stamp.shared:
        shared = f"stamped{stamp.key}.{name}"
        c.g.constants[shared] = stamp.template.graph.constants[name]
        stamp.shared[name] = c.g.append(n.op, (), {"name": shared}, n.type)
    return stamp.shared[name]
