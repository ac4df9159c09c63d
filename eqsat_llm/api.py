"""`optimize()`: model in, faster equivalent program out, with a report of what was done."""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils._pytree as pytree

from .capture import capture
from .capture.converter import Captured
from .capture.state import write_state_in_place
from .egraph.analysis import analysis
from .egraph.decode import decode, let_classes, program_view, serialize
from .egraph.encode import declared, encode, let_name
from .egraph.provenance import read as read_provenance
from .egraph.provenance import recording_ruleset, rules_in_classes, rules_used
from .egraph.saturate import Limits, saturate
from .errors import EqsatError, RuleError
from .extraction import extract as extractors
from .extraction.cost import enode_cost_fn, program_cost
from .extraction.costmodel import CostModel
from .extraction.egraph_json import load_egraph
from .extraction.ilp import extract_ilp
from .fold import KEEP, Folded, const_classes, fold_constants
from .formats.half import compute_in_float32, has_half
from .formats.quant_formats import DYNAMIC_STORED
from .formats.quant_formats import FORMATS as QUANT_FORMATS
from .formats.quantization import (
    QuantizationReport,
    check_keep_float,
    keep_float_matcher,
    output_errors,
    resolve_format,
    rule_families,
)
from .generation import program_cache
from .ir import Graph, TensorType, dtype_of
from .memcheck import check_fits, fold_bytes
from .plan import MemoryPlan, plan_memory
from .reporting.alternatives import ProgramChoices
from .reporting.decisions import Decisions, kernel_entries
from .reporting.report import Report, RuleStat, memory_summary
from .rulebook import Rule, resolve
from .weights.lazy_weights import LazyConstants, WeightSource
from .weights.meta import MetaRuntime, meta_constants, meta_error, refuse_sparsity

BACKENDS = ("c", "triton", "auto", "reference")
EXTRACTORS = {"tree": extractors.extract_tree_greedy, "dag": extractors.extract_dag_greedy,
              "ilp": extract_ilp}


class FallbackWarning(UserWarning):
    """Some ops of the model are outside the registry and run in torch."""


class EagerFallbackWarning(FallbackWarning):
    """A graph torch.compile handed over could not be optimized for the shapes it was called
    with (a dynamic graph that does not specialise) and runs in eager PyTorch."""


class Compiled:
    """The optimized program: call it like the model."""

    def __init__(self, graph: Graph, captured: Captured, report: Report,
                 backend: str = "c", plan: MemoryPlan | None = None):
        self.graph = graph
        self.captured = captured
        self.report = report
        if plan is None:  # (a program from the cache brings its own)
            with _phase(report.timings, "plan"):
                plan = plan_memory(graph)
        self.plan = plan
        # weights on the meta device: planned only, no code to generate from them (weights/meta.py)
        self.meta_weights = meta_constants(graph)
        report.meta_weights = len(self.meta_weights)
        self._backend = backend
        if self.meta_weights:
            self._runtime, report.backend = MetaRuntime(self.meta_weights), "none"
        else:
            with _phase(report.timings, "codegen"):
                self._runtime, report.backend = _make_runtime(graph, self.plan, backend)
        self._report_runtime()
        self._lock = threading.Lock()  # the arena is shared state: one call at a time
        self.cost_model: CostModel | None = None  # the model extraction used
        self.cached_as: str | None = None  # its program cache key, where it has one
        # the user's inputs; the mutated buffers (captured.state) are bound after them
        n_state = len(captured.state)
        ids = captured.graph.input_ids
        self._input_types = [captured.graph.type_of(i) for i in ids[:len(ids) - n_state]]
        self._state = list(captured.state.values())
        self._writes = list(captured.mutations)
        self._prepare_call()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Fast path (decode calls take a fraction of a millisecond): positional tensors in the
        # structure the model was captured with need no pytree walk.
        if kwargs or not self._positional or len(args) != len(self._expected):
            flat, spec = pytree.tree_flatten((args, kwargs))
            if spec != self.captured.in_spec:
                raise EqsatError(f"called with {_arguments(spec)}, but the model was optimized "
                                 f"for {_arguments(self.captured.in_spec)}")
        else:
            flat = args
        for k, (x, (shape, dtype)) in enumerate(zip(flat, self._expected)):
            if not isinstance(x, torch.Tensor) or x.shape != shape or x.dtype != dtype:
                t = self._input_types[k]
                got = f"{x.dtype}{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x)
                raise EqsatError(f"input {k}: expected {t}, got {got}; shapes and dtypes are "
                                 "static: optimize again for new ones")
            # (the C kernels would read a meta or CUDA tensor's address as host memory)
            if self._device is not None and x.device != self._device:
                raise EqsatError(f"input {k} is on {x.device}, but the program runs on "
                                 f"{self._device} ({self.report.backend} backend): move it "
                                 f"there (x.to('{self._device}')) or optimize for its device")
        if self._written_inputs:
            _refuse_aliased_writes(flat, self._written_inputs, self._state)
        with self._lock, torch.no_grad():
            outs = self._runtime.run(list(flat) + self._state if self._state else list(flat))
            if self._writes:
                outs = self._write_back(outs, flat)
        if self._out_kind == "leaf":
            return outs[0]
        if self._out_kind == "tuple":
            return tuple(outs)
        return pytree.tree_unflatten(outs, self.captured.out_spec)

    @property
    def target_backend(self) -> str:
        """The backend the program runs on (before a meta program's weights are loaded, its
        report says "none")."""
        return self._backend

    def load_weights(self, source: WeightSource,
                     state: dict[str, torch.Tensor] | None = None) -> None:
        """Make a program planned on meta weights runnable: `source(name)` gives each weight's
        values by the graph's constant name, and each prepared weight is made from them one at
        a time (weights/lazy_weights.py), so the model is never held whole beside its prepared form.
        `state`: real tensors for the buffers the model writes in place (a KV cache), by
        name, where those were planned on the meta device too."""
        if not self.meta_weights:
            raise EqsatError("this program's weights are loaded already")
        for name, tensor in (state or {}).items():
            key = next((k for k in self.captured.state if k.split(".")[-1] == name), name)
            if key not in self.captured.state:
                raise EqsatError(f"state {name}: the program writes no such buffer")
            self.captured.state[key] = tensor
        self._state = list(self.captured.state.values())
        constants = LazyConstants(self.graph.constants, source)
        with _phase(self.report.timings, "load"):
            try:
                self._runtime, self.report.backend = _make_runtime(self.graph, self.plan,
                                                                   self._backend, constants)
            finally:
                constants.release()
        self.meta_weights = []
        self.report.meta_weights = 0
        self._report_runtime()
        self._prepare_call()

    def _report_runtime(self) -> None:
        """What the report reads off the runtime: the copies in, and the nodes the C
        backend runs in torch between its compiled segments, by op."""
        report = self.report
        report.memory = memory_summary(self.plan, getattr(self._runtime, "copy_in_ops", []))
        report.torch_ops = dict(Counter(op for _, op in getattr(self._runtime, "torch_steps",
                                                                  [])))

    def on_backend(self, backend: str) -> Compiled:
        """The same optimized program on another backend ("c", "triton", "reference"): no
        second optimization (the extracted program does not depend on the backend)."""
        if backend not in BACKENDS:
            raise EqsatError(f"unknown backend {backend!r}; available: {BACKENDS}")
        backend = resolve_backend(backend, [])
        other = Compiled(self.graph, self.captured, dataclasses.replace(self.report), backend)
        other.cost_model = self.cost_model
        return other

    def source(self, kind: str | None = None) -> str:
        """The generated program: C source ("c") or the Triton kernels with their launch
        listing ("triton"); the backend's own by default."""
        if self.meta_weights:
            raise meta_error(self.meta_weights, "generate the source of")
        kind = kind or self.report.backend
        if kind != self.report.backend or not hasattr(self._runtime, "source"):
            raise EqsatError(f"this program runs on the {self.report.backend} backend; it "
                             f"has no {kind} source")
        return self._runtime.source

    def _write_back(self, outs: list[Any], flat: Any) -> list[Any]:
        """Copy the program's new values of the state the model writes in place (its first
        outputs) into the module's buffers and the caller's tensors; the model's outputs
        remain. A value still sharing memory with a written tensor (the old state, returned
        or stored as is) is cloned first, so no write is seen by another value."""
        k = len(self._writes)
        targets = [self.captured.state[t] if kind == "state" else flat[t]
                   for kind, t in self._writes]
        written = {t.untyped_storage().data_ptr() for t in targets}
        values = [v if k_ < k and _same_tensor(v, targets[k_]) else v.clone()
                  if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in written
                  else v for k_, v in enumerate(outs)]
        for target, value in zip(targets, values[:k]):
            if value is not target and not _same_tensor(value, target):
                target.copy_(value)  # (a write run in place left nothing to copy)
        return values[k:]

    def _prepare_call(self) -> None:
        n = len(self._input_types)
        # the device inputs must be on: the C and reference runtimes run on the CPU
        self._device = (torch.device("cpu") if self.report.backend in ("c", "reference")
                        else getattr(self._runtime, "device", None))
        self._written_inputs = [k for kind, k in self._writes if kind == "input"]
        self._expected = [(torch.Size(t.shape), dtype_of(t.dtype)) for t in self._input_types]
        self._positional = pytree.tree_flatten((tuple(range(n)), {}))[1] == \
            self.captured.in_spec
        out_spec, k = self.captured.out_spec, len(self.graph.outputs) - len(self._writes)
        self._out_kind = ("leaf" if out_spec == pytree.tree_flatten(0)[1] else
                          "tuple" if out_spec == pytree.tree_flatten(tuple(range(k)))[1] else
                          "tree")


_CHECKED: dict[tuple[str, str], Any] = {}


def refuse_unchecked(rules: list[Rule]) -> None:
    """Check every rule that is not part of the library (whose rules the test suite checks);
    raise RuleError naming the first that fails, with its counterexample."""
    from .rulebook import FAMILIES
    from .rulecheck import check_rule

    library = {id(r) for rs in FAMILIES.values() for r in rs}
    for r in rules:
        if id(r) in library:
            continue
        key = (r.name, str(r.command))
        if key not in _CHECKED:
            _CHECKED[key] = check_rule(r, instances=5)
        result = _CHECKED[key]
        if not result.ok:
            cex = result.counterexample or {}
            shown = ", ".join([f"{k}: {v}" for k, v in cex.get("leaves", {}).items()]
                              + [f"{k}={v}" for k, v in cex.get("attributes", {}).items()])
            raise RuleError(f"rule {r.name!r} failed its check ({result.status}): "
                            f"{result.message}; counterexample: {shown or 'none'} (`eqsat-llm "
                            "rules check` prints the whole instance). Fix the rule, or pass "
                            "force_rules=True to use it anyway.")


def _arguments(spec: Any) -> str:
    """A call's (args, kwargs) structure in words: counts and keyword names."""
    args, kwargs = spec.children()
    nested = any(not c.is_leaf() for c in args.children() + kwargs.children())
    return (f"{args.num_children} positional argument(s)"
            + (f", keyword arguments {list(kwargs.context)}" if kwargs.context else "")
            + (f" (nested: {spec})" if nested else ""))


def _refuse_aliased_writes(flat: Any, written: list[int], state: list[torch.Tensor]) -> None:
    """The program reads every input before it writes the ones the model writes in place
    (functionalized): an input it writes that shares memory with another input (the same
    tensor twice, overlapping views) would give other results than eager, which sees the
    write in the other argument."""
    tensors = [(j, x) for j, x in enumerate(flat) if isinstance(x, torch.Tensor)] + \
        [(-1, t) for t in state]
    for k in written:
        for j, y in tensors:
            if j != k and _overlap(flat[k], y):
                raise EqsatError(f"input {k} is written in place by the model and shares memory "
                                 "with another input: the program reads its inputs before it "
                                 "writes them, eager would not; pass separate tensors (clone)")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes two tensors span intersect (their extents; strides are >= 0)."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def extent(t: torch.Tensor) -> tuple[int, int]:
        span = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1 if t.numel() else 0
        return t.data_ptr(), t.data_ptr() + span * t.element_size()
    (a0, a1), (b0, b1) = extent(a), extent(b)
    return a0 < b1 and b0 < a1


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


class BackendFallbackWarning(UserWarning):
    """The requested backend could not run the program; the reference runtime does."""


def resolve_backend(backend: str, inputs: list[Any]) -> str:
    """"auto": Triton when the inputs are on a CUDA device, C otherwise. "triton" on a
    machine that cannot run its kernels (codegen/triton/launch.py: check_mode) is refused
    here, before any work."""
    if backend == "auto":
        on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
        return "triton" if on_cuda else "c"
    if backend == "triton":
        from .codegen.triton import launch

        launch.check_mode()
        if not launch.interpreting() and not torch.cuda.is_available():
            raise EqsatError("backend='triton' needs a CUDA device (or TRITON_INTERPRET=1)")
    return backend


def _make_runtime(graph: Graph, plan: Any, backend: str,
                  constants: Mapping[str, torch.Tensor] | None = None) -> tuple[Any, str]:
    """The runtime of `backend` on the planned program. The C backend runs the nodes it does
    not generate in torch between its compiled segments (CRuntime.torch_steps); it falls back
    to the reference runtime (torch ops on the same arena plan) with a warning naming why only
    when the C compile fails (the kernel and the compiler's message) or, should one remain, a
    program it cannot run at all."""
    from .codegen.planned import PlannedRuntime

    if backend == "triton":
        from .codegen.triton.runtime import TritonRuntime

        if constants is not None:
            raise EqsatError("weights loaded after optimizing run on the C backend only")
        return TritonRuntime(graph, plan), "triton"
    if backend == "c":
        from .codegen.c import CCompileError, CRuntime, UnsupportedByBackend

        try:
            return CRuntime(graph, plan, constants=constants), "c"
        except UnsupportedByBackend as exc:
            why = f"the C backend does not support {', '.join(exc.ops)}"
        except CCompileError as exc:
            kernel = f" in kernel {exc.kernel}" if exc.kernel else ""
            said = exc.message.strip()[:2000] or \
                f"{(exc.command or ['the compiler'])[0]} failed and printed nothing"
            why = f"the C compile failed{kernel}: {said}"
        warnings.warn(f"{why}; running the reference runtime instead", BackendFallbackWarning,
                      stacklevel=3)
    if constants is not None:
        raise EqsatError(f"the weights were loaded lazily, which the C backend needs ({why})")
    return PlannedRuntime(graph, plan, check=True), "reference"


@contextmanager
def _phase(timings: dict[str, float], name: str):
    t = time.perf_counter()
    yield
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - t


def optimize(model: Any, example_inputs: Iterable[Any] = (), *,
             example_kwargs: dict | None = None,
             rules: Iterable[str | Rule] | None = None,
             backend: str = "auto",
             extractor: str = "ilp",
             limits: Limits | None = None,
             progress: Callable[[str], None] | None = None,
             measure_eager: bool = True,
             force_rules: bool = False,
             quantize: str | None = None,
             keep_float: Iterable[str] = (),
             sparsity: str | None = None) -> Compiled:
    """Optimize a model (nn.Module, fx.GraphModule or ExportedProgram) for the example inputs'
    shapes. `rules`: family names ("all" by default), Rule objects, rule modules or egglog
    rulesets; [] runs no rules. `measure_eager` runs the model once under the profiler to
    report eager PyTorch's peak memory beside the arena. Rules from outside the library are
    checked first (rulecheck.check_rule); one that fails is refused unless `force_rules`.
    `quantize` ("int8", "fp8" (= fp8_e4m3), "int4", ...: quant_formats.FORMATS) stores constant
    weights as integers (weight-only, approximate: the report measures the error against the
    float model; "int8_dynamic" also codes the activations per row where an integer product
    pays, at prefill; "int4_dynamic" int4_g32 weights with the activations coded per block of
    32 where the byte product pays, at decode), except those `keep_float` names (modules or
    parameter-name globs).
    `sparsity="auto"` reads the 2:4 and 16 x 16 block structure of constant weights and runs
    the GEMMs where skipping their zeros pays on sparse kernels (exact: docs/sparsity.md)."""
    if backend not in BACKENDS:
        raise EqsatError(f"unknown backend {backend!r}; available: {BACKENDS}")
    example_inputs = tuple(example_inputs)
    if isinstance(model, torch.export.ExportedProgram) and not example_inputs and \
            not example_kwargs and model.example_inputs:
        example_inputs, example_kwargs = model.example_inputs  # what it was exported with
    backend = resolve_backend(backend, list(example_inputs) + list((example_kwargs or {})
                                                                   .values()))
    if extractor not in EXTRACTORS:
        raise EqsatError(f"unknown extractor {extractor!r}; available: {sorted(EXTRACTORS)}")
    cached_as, hit = _program_cache_lookup(
        model, example_inputs, example_kwargs, rules=rules, backend=backend,
        extractor=extractor, limits=limits, force_rules=force_rules, quantize=quantize,
        keep_float=keep_float, sparsity=sparsity)
    if hit is not None:
        return hit
    if backend == "c":  # (compiled while the graph is optimized, if the cache lacks it)
        from .codegen.c.build import prepare_kernel_library
        prepare_kernel_library()
    report = Report(backend=backend, extraction_method=extractor)
    report.program_cache = "miss" if cached_as else "off"
    timings = report.timings
    with _phase(timings, "capture"):
        captured = capture(model, tuple(example_inputs), example_kwargs)
    if captured.fallback_ops:
        warnings.warn("these ops are not in the registry and run in torch (fallback): "
                      + ", ".join(captured.fallback_ops), FallbackWarning, stacklevel=2)
    rule_list = resolve(rules) if rules is None or list(rules) else []
    if not force_rules:
        refuse_unchecked(rule_list)
    fmt = resolve_format(quantize) if quantize is not None else None
    if fmt is not None:
        rule_list += resolve(rule_families(fmt))
        check_keep_float(keep_float, [n.attrs["name"] for n in captured.graph.nodes
                                      if n.op == "param"])
    elif list(keep_float):
        raise EqsatError("keep_float applies to quantize=: without it every weight stays float")
    if sparsity not in (None, "auto"):
        raise EqsatError(f"sparsity must be None or 'auto', not {sparsity!r}")
    if sparsity:
        refuse_sparsity(captured.graph)
        rule_list += resolve(["sparsity"])
    cost_model = CostModel()  # calibrated numbers when `eqsat-llm calibrate` ran, else defaults
    graph = captured.graph
    # the C kernels are float32: a half model is computed in float32 there (formats/half.py);
    # the Triton kernels load and store half values (float32 inside), so a half model keeps
    # its activations half on Triton (docs/triton-backend.md)
    if backend == "c" and has_half(graph):
        graph = compute_in_float32(graph)
        report.computed_in_float32 = True
    graph = optimize_graph(graph, rule_list, extractor, limits, report, progress,
                           cost_model=cost_model, keep_float=keep_float_matcher(keep_float),
                           sparsity=bool(sparsity))
    report.aten_op_counts = captured.aten_op_counts
    report.fallback_ops = captured.fallback_ops
    report.stamped_calls = captured.stamped_calls
    report.stamping_fallback = captured.stamping_fallback
    report.state_in_place = len(write_state_in_place(graph, captured))
    compiled = Compiled(graph, captured, report, backend)
    compiled.cost_model = cost_model
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()
    # a model that writes its state or its inputs in place is not run: the run would write
    # nor is a model on the meta device (nothing to measure)
    if measure_eager and callable(model) and not captured.mutations and \
            not compiled.meta_weights:
        from .codegen.planned import peak_bytes

        with torch.no_grad():
            report.memory["eager_peak_bytes"] = peak_bytes(
                lambda: model(*example_inputs, **(example_kwargs or {})))
    report.weight_formats = dict(Counter(
        n.attrs["weight"] for n in compiled.graph.nodes
        if n.op == "gemm" and n.attrs["weight"] != "float"))
    if fmt is not None:
        report.quantization = _quantization_report(compiled, model, fmt, list(keep_float),
                                                   tuple(example_inputs), example_kwargs)
    if cached_as is not None and compiled.meta_weights:  # the report complete: a hit's too
        program_cache.store(cached_as, (graph, captured, report, compiled.plan))
        compiled.cached_as = cached_as
    return compiled


def _program_cache_lookup(model: Any, example_inputs: tuple, example_kwargs: dict | None, *,
                          rules: Iterable[str | Rule] | None = None, backend: str,
                          extractor: str = "ilp", limits: Limits | None = None,
                          force_rules: bool = False, quantize: str | None = None,
                          keep_float: Iterable[str] = (), sparsity: str | None = None
                          ) -> tuple[str | None, Compiled | None]:
    """The program cache's key for optimize()'s call (None where the cache does not apply)
    and the program stored under it (None: a miss)."""
    if not program_cache.enabled(model):  # only a meta-device model's program is on disk
        return None, None
    options = {"rules": resolve(rules) if rules is None or list(rules) else [],
               "backend": backend, "extractor": extractor, "limits": limits,
               "force_rules": force_rules, "quantize": quantize,
               "keep_float": list(keep_float), "sparsity": sparsity}
    cached_as = program_cache.key(model, example_inputs, example_kwargs, options,
                                  CostModel().machine)
    named = dict(model.named_buffers())
    hit = cached_program(cached_as, backend, lambda name: named[name] if name in named
                         else model.get_parameter(name))
    return cached_as, hit


def cached_program(name: str, backend: str,
                   state: Callable[[str], torch.Tensor] | None = None) -> Compiled | None:
    """The program stored under `name` (generation/program_cache.py); None when there is none.
    `state`: the model's tensor of each buffer the program writes, by name (else bound later, by
    Compiled.load_weights)."""
    t0 = time.perf_counter()
    entry = program_cache.load(name)
    if entry is None:
        return None
    graph, captured, report, plan = entry
    if state is not None:
        try:
            captured.state = {name: state(name) for name in captured.state}
        except AttributeError:
            return None
    report.program_cache = "hit"
    compiled = Compiled(graph, captured, report, backend, plan)
    compiled.cached_as = name
    report.timings = {"program cache": time.perf_counter() - t0}
    if captured.fallback_ops:
        warnings.warn("these ops are not in the registry and run in torch (fallback): "
                      + ", ".join(captured.fallback_ops), FallbackWarning, stacklevel=3)
    return compiled


def _quantization_report(compiled: Compiled, model: Any, fmt: str, keep_float: list[str],
                         inputs: tuple, kwargs: dict | None) -> QuantizationReport:
    """How many GEMMs read integer weights, and the error against the float model on the
    example inputs (not run for a model that writes its state in place)."""
    count = sum(n.op in ("gemm", "expert_mm") and n.attrs["weight"] in (
        *QUANT_FORMATS, *DYNAMIC_STORED) for n in compiled.graph.nodes)
    errors = []
    if callable(model) and not compiled.captured.mutations and not compiled.meta_weights:
        with torch.no_grad():
            errors = output_errors(model(*inputs, **(kwargs or {})),
                                   compiled(*inputs, **(kwargs or {})))
    experts = sum(n.op == "expert_mm" and n.attrs["weight"] == "float"
                  for n in compiled.graph.nodes)
    return QuantizationReport(fmt, count, keep_float, errors, experts)


def optimize_graph(graph: Graph, rules: list[Rule], extractor: str = "ilp",
                   limits: Limits | None = None, report: Report | None = None,
                   progress: Callable[[str], None] | None = None, fold: bool = True,
                   cost_model: CostModel | None = None,
                   keep_float: Callable[[str], bool] | None = None,
                   sparsity: bool = False) -> Graph:
    """The graph-to-graph core: encode, saturate, extract, decode, and (with `fold`) evaluate
    constant subgraphs once into prepared constants. `keep_float(name)`: weights the quantize
    rules leave alone. `sparsity`: let the encoder read the weights' sparsity structure."""
    report = report if report is not None else Report()
    timings = report.timings
    with _phase(timings, "encode"):
        # the rules declared before the program's lets (encode.declared: 9x faster at 32 layers)
        egraph = declared(analysis, *([recording_ruleset(rules)] if rules else []))
        enc = encode(graph, egraph=egraph, keep_float=keep_float, sparsity=sparsity)
    with _phase(timings, "saturate"):
        sat = saturate(enc.egraph, rules, limits or Limits(), progress)
    with _phase(timings, "serialize"):
        serialized = serialize(enc.egraph)
        classes = let_classes(serialized)
        roots = [classes[let_name(i)] for i in graph.outputs]
        view = program_view(serialized, roots)
        constant = const_classes(serialized)
    with _phase(timings, "extract"):
        egraph = load_egraph(view)
        # predicted microseconds per e-node; constant classes fold at compile time: free
        model = cost_model or CostModel()
        cost_fn = enode_cost_fn(serialized, view, constant, model)
        result = EXTRACTORS[extractor](egraph, roots, cost=cost_fn)
        report.unpriced_enodes = dict(Counter(cost_fn.unpriced))
    with _phase(timings, "decode"):
        class_types = {classes[let_name(n.id)]: n.type for n in graph.nodes
                       if let_name(n.id) in classes}
        built: dict[str, int] = {}  # e-class -> decoded node id
        out, out_ids = decode(view, result.choices, roots, graph, class_types, built)
        out.outputs = out_ids
    with _phase(timings, "fold"):
        if fold:  # refused before folding allocates what does not fit (memcheck.py)
            check_fits({"folded constants": fold_bytes(out, KEEP)}, "fold the constants")
        folded = fold_constants(out) if fold else Folded(out, 0, 0, {i: i for i in
                                                                      out.live_ids()})
        out = folded.graph
        report.folded_constants = folded.count
        report.folded_bytes = folded.nbytes
    for gid, oid in zip(graph.outputs, out.outputs):
        if isinstance(graph.node(gid).type, TensorType) and graph.node(gid).type != out.node(
                oid).type:
            raise EqsatError(f"output %{gid} changed type during optimization")
    report.op_counts_before = graph.op_counts()
    report.op_counts_after = out.op_counts()
    report.iterations = sat.iterations
    report.stop_reason = sat.stop_reason
    report.egraph_size_per_iteration = sat.enodes_per_iteration
    report.eclasses = len(egraph.classes)
    report.enodes = len(egraph.nodes)
    with _phase(timings, "explain"):
        made, merged = read_provenance(serialized)
        used = rules_used(result.choices, made, merged)
        in_classes = rules_in_classes(egraph, result.choices, made)
        report.rules = [RuleStat(r.name, r.family, r.soundness, sat.matches.get(r.name, 0),
                                 r.name in used, r.name in in_classes) for r in rules]
        ids = {cls: folded.remap[i] for cls, i in built.items() if i in folded.remap}
        program = ProgramChoices(egraph, result.choices, extractors.node_costs(egraph, cost_fn),
                                 roots)
        report.kernels = kernel_entries(out, model, {i: cls for cls, i in ids.items()},
                                        Decisions(program, made, ids))
    report.cost_before = program_cost(graph, model)
    report.cost_after = result.cost
    report.lower_bound = result.lower_bound
    return out
