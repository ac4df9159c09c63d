"""Repeated layers traced once: capture of deep models in the time of one layer.

torch.export traces every op of every layer, and its core-ATen decomposition traces them again:
0.8 s a layer of LLaMA-7B's shapes on a 2-core machine, three quarters of a 32-layer
optimize() (benchmarks/scale.py). A deep model repeats one layer, so:

1. **Which layers are the same function.** Children of an `nn.ModuleList` / `nn.Sequential`
   are grouped when they compute the same function of their inputs and their own weights: the
   same classes all the way down, the same parameter and buffer names, shapes, dtypes and
   strides, equal plain attributes, no hooks and no patched `forward` (`same_function`). A
   layer index (transformers' layers carry theirs) may differ: see 4.
2. **Tracing.** While the model is exported, each grouped layer's forward is wrapped. A call's
   arguments, positional and keyword, are flattened into tensors and a *spec* of everything
   else (None, numbers, strings, tuples, and a KV cache, below); the first call with a given
   spec and tensor types is traced as usual and its result types recorded, with the tensors it
   wrote in place (their version counters moved); a later call of the group with the same spec
   and types becomes one node of the custom op `eqsat_llm::layer(inputs, weights, key)`
   returning the recorded results (flattened as the arguments are: a tuple holding a None is
   rebuilt) and the new values of the tensors it writes, which are copied into them
   (`copy_`, as export functionalizes any in-place write). Export and its decomposition then
   cost one layer plus the glue.
3. **Splicing.** The layer traced first is captured alone (a *template*: its own IR, weights as
   leaves named as in the layer, arguments rebuilt from the spec), and the frontend's
   converter of `eqsat_llm::layer` copies the template into the model's IR with the call's
   inputs and the call's own weights. The IR is the one a full trace gives (tests/
   test_stamping.py compares them, a transformers model over its KV cache included), so
   nothing after capture changes.
4. **KV caches and layer indices.** A cache argument is stamped when it is a transformers
   `Cache` with its base `update` whose layer for this call is a *stampable cache layer*: its
   class names in `STAMP_STATE` the tensors its `update` reads and writes and takes them, in
   that order, in its constructor (the Generator's static cache, generation/kv_cache.py). The
   call's state is that layer's tensors; the template's cache holds one such layer rebuilt on
   the template's inputs. The layer's index is its `layer_idx` (or `layer_id`) attribute; in
   the template every one is a marker (`_LayerIndex`) that the template's cache accepts and
   that refuses any other use (comparison, arithmetic, indexing, hashing, formatting): a layer
   whose code reads its index other than to find its cache layer fails its template, and the
   capture falls back to the full trace.

Anything unexpected falls back to the full trace: a template that writes its own state, that
writes other tensors than its first call did, that fails to export or reads its index, or a
trace that fails with stamping (the plain capture then reports its own error). For the time
of a capture the model's grouped layers are patched (their forward wrapped, the template's
index attributes marked), restored after: a model must not run in another thread while it
is captured.
"""

from __future__ import annotations

import functools
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
# the attributes naming a layer's index (transformers): may differ within a group (4. above)
LAYER_INDEX = ("layer_idx", "layer_id")
# plain values a call may pass besides tensors: part of the spec, equal in every stamped call
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)


@torch.library.custom_op("eqsat_llm::layer", mutates_args=())
def _layer(inputs: list[torch.Tensor], weights: list[torch.Tensor],
           key: int) -> list[torch.Tensor]:
    """A stamped layer call: exists only inside a capture (the converter replaces it)."""
    raise RuntimeError("eqsat_llm::layer is a capture placeholder and never runs")


@_layer.register_fake
def _layer_fake(inputs: list[torch.Tensor], weights: list[torch.Tensor],
                key: int) -> list[torch.Tensor]:
    stamp = _ACTIVE[key]
    device = inputs[0].device
    return [torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for shape, stride, dtype in stamp.results + [stamp.inputs[k] for k in stamp.written]]


Meta = tuple  # (shape, stride, dtype) of a tensor
Spec = tuple  # how a call's arguments are rebuilt from its flattened tensors (_flatten)


def _meta(t: torch.Tensor) -> Meta:
    return tuple(t.shape), tuple(t.stride()), t.dtype


@dataclass
class _Stamp:
    """One group of layers called with one spec and one tuple of input types: the layer traced
    for it, its result types and the inputs it writes; the template is captured after the
    trace."""

    key: int
    layer: nn.Module
    spec: Spec
    inputs: list[Meta]
    device: torch.device
    results: list[Meta]
    result_spec: Spec  # how the layer's result is rebuilt from its tensors
    written: list[int]  # the inputs the layer writes in place, by position
    weight_names: list[str]  # the layer's parameters then buffers, in the order calls pass them
    template: Captured | None = None
    shared: dict[str, int] = field(default_factory=dict)  # template constant -> its IR id


# --- 1. which layers compute the same function ------------------------------------------------
def same_function(a: nn.Module, b: nn.Module) -> bool:
    """Whether two modules compute the same function of their inputs and their own weights
    (their layer indices aside: checked when the template is captured)."""
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
    return all(k in vars(a) and k in vars(b) and _equal_attribute(k, vars(a)[k], vars(b)[k])
               for k in names)


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


def _equal_attribute(name: str, x: Any, y: Any) -> bool:
    if name in LAYER_INDEX and type(x) is int and type(y) is int:
        return True  # the template reads it as a marker: any other use fails it
    return _equal(x, y)


def _equal(x: Any, y: Any) -> bool:
    """Plain attributes are equal values of one type; any other object only itself."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return x is y
    if type(x) is not type(y):
        return False
    if type(x) is functools.partial:  # (an activation's bound function: GELU(approximate=...))
        return x.func is y.func and _equal(x.args, y.args) and _equal(x.keywords, y.keywords)
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


# --- 2. a call's arguments as tensors and a spec ------------------------------------------------
class _NotStamped(Exception):
    """A call whose arguments cannot be rebuilt from tensors and a spec: traced as usual."""


def _flatten(value: Any, tensors: list[torch.Tensor], index: int | None) -> Spec:
    """`value`'s spec, appending its tensors to `tensors`; `index` is the calling layer's
    index, for a cache argument."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("tensor", len(tensors) - 1)
    if isinstance(value, _PLAIN):  # (repr: 0.0 and -0.0 are equal, not the same argument)
        return ("value", value, type(value), repr(value))
    if type(value) in (tuple, list):
        return ("sequence", type(value), tuple(_flatten(v, tensors, index) for v in value))
    if type(value) is dict and all(type(k) is str for k in value):
        return ("dict", tuple((k, _flatten(v, tensors, index)) for k, v in value.items()))
    layer = _cache_layer(value, index)
    if layer is None:
        raise _NotStamped(type(value).__name__)
    return ("cache", type(layer), tuple(_flatten(getattr(layer, name), tensors, index)
                                        for name in type(layer).STAMP_STATE))


def _cache_layer(cache: Any, index: int | None) -> Any:
    """The stampable cache layer a call with `cache` reads and writes, or None (4. above)."""
    try:
        from transformers.cache_utils import Cache
    except ImportError:
        return None
    if index is None or not isinstance(cache, Cache) or type(cache).update is not Cache.update \
            or cache.offloading or cache.layer_class_to_replicate is not None:
        return None
    layer = cache.layers[index] if index < len(cache.layers) else None
    state = getattr(type(layer), "STAMP_STATE", None)
    if state is None or not all(isinstance(getattr(layer, n), torch.Tensor) for n in state):
        return None
    return layer


def _rebuild(spec: Spec, tensors: tuple[torch.Tensor, ...]) -> Any:
    kind = spec[0]
    if kind == "tensor":
        return tensors[spec[1]]
    if kind == "value":
        return spec[1]
    if kind == "sequence":
        return spec[1](_rebuild(s, tensors) for s in spec[2])
    if kind == "dict":
        return {k: _rebuild(s, tensors) for k, s in spec[1]}
    return _TemplateCache(spec[1](*(_rebuild(s, tensors) for s in spec[2])))


def _layer_index(layer: nn.Module) -> int | None:
    """The layer's index, where its modules carry one (one value for all), else None."""
    found = {vars(m)[name] for m in layer.modules() for name in LAYER_INDEX
             if type(vars(m).get(name)) is int}
    return found.pop() if len(found) == 1 else None


class _LayerIndexUsed(Exception):
    """A template's layer read its index other than to find its cache layer."""


class _LayerIndex:
    """Every `layer_idx` of a template's layer: the template's cache accepts it; any use that
    could make one layer's code differ from another's raises."""

    refused: str | None = None  # why the last template capture failed, if the marker refused

    def _refuse(self, *args: Any) -> Any:
        self.refused = "the layer reads its layer_idx"
        raise _LayerIndexUsed(self.refused)

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __bool__ = _refuse
    __index__ = __int__ = __float__ = __str__ = __format__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __mod__ = __rmod__ = _refuse
    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __neg__ = _refuse

    def __repr__(self) -> str:
        return "<layer index of a stamped layer>"


_INDEX = _LayerIndex()


class _TemplateCache:
    """The cache a template's layer is called with: its one cache layer, for the marker."""

    def __init__(self, layer: Any):
        self.layer = layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: Any,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx is not _INDEX:
            _INDEX.refused = "the layer updates another layer's cache"
            raise _LayerIndexUsed(_INDEX.refused)
        return self.layer.update(key_states, value_states, *args, **kwargs)


@contextmanager
def _marked_indices(layer: nn.Module) -> Iterator[None]:
    """The layer's index attributes as the marker for the time of its template capture."""
    saved = [(m, name, vars(m)[name]) for m in layer.modules() for name in LAYER_INDEX
             if type(vars(m).get(name)) is int]
    try:
        for m, name, _ in saved:
            vars(m)[name] = _INDEX
        yield
    finally:
        for m, name, index in saved:
            vars(m)[name] = index


# --- 3. tracing ---------------------------------------------------------------------------------
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
        # only torch.export's own (non-strict) trace is stamped
        if (not torch.compiler.is_exporting() or torch.compiler.is_dynamo_compiling()
                or torch.is_autocast_enabled()):
            return original(*args, **kwargs)
        tensors: list[torch.Tensor] = []
        try:
            spec = _flatten((args, kwargs), tensors, _layer_index(layer))
        except _NotStamped:
            return original(*args, **kwargs)
        inputs = [_meta(t) for t in tensors]
        if not tensors or not all(isinstance(d, int) for m in inputs for d in m[0]):
            return original(*args, **kwargs)  # symbolic shapes: not stamped
        key = (gid, spec, tuple(inputs), tensors[0].device)
        if key not in stamps:  # the first such call is traced; its result types recorded
            versions = [t._version for t in tensors]
            out = original(*args, **kwargs)
            written = [k for k, (t, v) in enumerate(zip(tensors, versions)) if t._version != v]
            stamps[key] = _record(layer, spec, inputs, tensors[0].device, out, written)
            return out
        stamp = stamps[key]
        if stamp is None:  # the traced call returned what tensors and a spec cannot rebuild
            return original(*args, **kwargs)
        weights = [t for _, t in layer.named_parameters()] + [t for _, t in layer.named_buffers()]
        out = torch.ops.eqsat_llm.layer(tensors, weights, stamp.key)
        for k, new in zip(stamp.written, out[len(stamp.results):]):
            tensors[k].copy_(new)
        return _rebuild(stamp.result_spec, tuple(out[:len(stamp.results)]))
    return forward


def _record(layer: nn.Module, spec: Spec, inputs: list[Meta], device: torch.device, out: Any,
            written: list[int]) -> _Stamp | None:
    results: list[torch.Tensor] = []
    try:
        result_spec = _flatten(out, results, None)
    except _NotStamped:
        return None
    if not results:
        return None
    names = [n for n, _ in layer.named_parameters()] + [n for n, _ in layer.named_buffers()]
    stamp = _Stamp(next(_KEYS), layer, spec, inputs, device, [_meta(o) for o in results],
                   result_spec, written, names)
    _ACTIVE[stamp.key] = stamp
    return stamp


# --- 4. templates and splicing ------------------------------------------------------------------
def capture_stamped(model: Any, example_inputs: tuple,
                    example_kwargs: dict | None) -> tuple[Captured | None, str | None]:
    """(the model's capture with its repeated layers traced once, its `stamped_calls` set;
    None where stamping does not apply or did not work out: the caller then captures in full)
    and, when it did not work out, why."""
    if not isinstance(model, nn.Module) or isinstance(model, torch.fx.GraphModule) or \
            _global_hooks():
        return None, None
    groups = repeated_layers(model)
    if not groups:
        return None, None
    stamps: dict[tuple, _Stamp | None] = {}
    try:
        with _stamped(groups, stamps):
            ep = export(model, example_inputs, example_kwargs)
        used = [n.args[2] for n in ep.graph.nodes
                if n.target is torch.ops.eqsat_llm.layer.default]
        for key in set(used):
            why = _template(_ACTIVE[key])
            if why:
                return None, why
        captured = from_exported(ep)
        captured.aten_op_counts = {k: n for k, n in captured.aten_op_counts.items() if n}
        captured.stamped_calls = len(used)
        return captured, None
    except Exception as exc:  # noqa: BLE001 - the full trace reports what is wrong, if anything
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        for stamp in stamps.values():
            if stamp is not None:
                _ACTIVE.pop(stamp.key, None)


class _Call(nn.Module):
    """A template's layer called as the model called it, its arguments rebuilt from tensors."""

    def __init__(self, layer: nn.Module, spec: Spec):
        super().__init__()
        self.layer, self._spec = layer, spec

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args, kwargs = _rebuild(self._spec, tensors)
        results: list[torch.Tensor] = []
        _flatten(self.layer(*args, **kwargs), results, None)
        return tuple(results)


def _template(stamp: _Stamp) -> str | None:
    """Capture the layer traced for `stamp` on its own; None when it is a function of its
    inputs and weights that writes what its first call wrote, else why not."""
    inputs = tuple(torch.empty_strided(shape, stride, dtype=dtype, device=stamp.device)
                   for shape, stride, dtype in stamp.inputs)
    _INDEX.refused = None
    try:
        with _marked_indices(stamp.layer):
            template = capture_plain(_Call(stamp.layer, stamp.spec), inputs, None)
    except Exception:  # (export reports what the layer raised as its own error)
        if _INDEX.refused is None:
            raise
        return f"a repeated layer's code depends on its index ({_INDEX.refused})"
    if template.state or len(template.graph.outputs) != \
            len(template.mutations) + len(stamp.results):
        return "a repeated layer writes state in place"
    if sorted(k for _, k in template.mutations) != stamp.written:
        return "a repeated layer writes other inputs than its first call did"
    stamp.template = template
    return None


@converts(torch.ops.eqsat_llm.layer.default)
def _splice(c: Any, node: Any, inputs: list, weights: list, key: int) -> tuple[int, ...]:
    """A stamped call: the template's IR, reading this call's inputs and weights; its values
    are the layer's results, then the new values of the inputs it writes."""
    stamp = _ACTIVE[key]
    template = stamp.template
    assert template is not None
    by_name = dict(zip(("layer." + n for n in stamp.weight_names), (c.t(w) for w in weights)))
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
    # getitems of its users are counted after this call: counted down ahead of them; the copies
    # of written values back leave no op: functionalization makes them the state's new value)
    getitems = sum(u.target is operator.getitem for u in node.users)
    for name, n in ((str(node.target), 1), (str(operator.getitem), getitems)):
        c.aten_counts[name] = c.aten_counts.get(name, 0) - n  # (zeros dropped after the capture)
    for op, count in template.aten_op_counts.items():
        c.aten_counts[op] = c.aten_counts.get(op, 0) + count
    c.fallbacks += template.fallback_ops
    writes = {k: t.outputs[j] for j, (_, k) in enumerate(template.mutations)}
    outputs = t.outputs[len(template.mutations):] + [writes[k] for k in stamp.written]
    return tuple(remap[o] for o in outputs)


def _shared(c: Any, stamp: _Stamp, n: Any) -> int:
    """A constant of the layer's own code (not one of its weights): one leaf for all calls."""
    name = n.attrs["name"]
    if name not in stamp.shared:
        shared = f"stamped{stamp.key}.{name}"
        c.g.constants[shared] = stamp.template.graph.constants[name]
        stamp.shared[name] = c.g.append(n.op, (), {"name": shared}, n.type)
    return stamp.shared[name]
