"""The planned runtime: runs an IR program inside one arena laid out by a `MemoryPlan`.

The arena (one uint8 tensor, 64-byte aligned) is allocated at construction, and so is every
intermediate: a strided view of the arena at its planned offset, and every view of one (the
plan says which layout ops torch returns as views). A call then only runs kernels that write
into those views through their `out=` variants (or in place); Python numbers that torch would
wrap into a fresh 0-dim tensor on every call are prepared once, in the dtype torch would
convert them to, so the kernels and the values are the reference runtime's own.

What still allocates per call, by design: the outputs (returned to the caller; a buffer that
an output views whole is allocated with them, one that it views in part is copied out of the
arena), and the ops whose registry entry declares no writer (`ops.COPY_IN`: no allocation-free
out= kernel in torch, fallbacks among them): they are computed into a torch temporary and
copied into their buffer. Kernels may also allocate internally where the reference does too
(a dtype conversion of a mixed-dtype input, a half-precision scalar). docs/memory.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

from ..capture.converter import run_fallback
from ..errors import GraphError
from ..ir import Graph, Node, TensorType, dtype_of
from ..memcheck import check_fits, output_bytes
from ..ops import (
    COMPARISONS,
    REGISTRY,
    Writer,
    evaluate,
    gemm_writes_in_place,
    weak_scalar_dtype,
)
from ..ops.elementwise import BINARY
from ..plan import (
    ALIAS,
    ARENA,
    COPY_OUT,
    EXTERN_VIEW,
    LEAF,
    OUTPUT,
    SCALAR,
    TEMP,
    MemoryPlan,
    check_plan,
    plan_memory,
)
from . import poison

# op(out, inputs, attrs) computes the reference result into `out`: each op's registry entry
# declares its writer (ops/registry.py), or COPY_IN (computed into a temporary, then copied)
WRITERS: dict[str, Writer] = {name: d.writer for name, d in REGISTRY.items()
                              if callable(d.writer)}


# inputs that are indices or conditions, not values to convert: op -> positions that are values
VALUE_INPUTS: dict[str, slice] = {"where": slice(1, 3), "index": slice(0, 1),
                                  "index_select": slice(0, 1), "embedding": slice(0, 1)}


def _may_convert(op: str, metas: list[Any], prep: dict[int, Any], out: torch.dtype) -> bool:
    """Whether torch converts an input to another dtype inside this kernel (a temporary the
    reference makes too): the value inputs disagree on a dtype, or differ from the result's
    (except for comparisons, and ops that convert as they copy)."""
    values = [prep.get(k, m) for k, m in enumerate(metas)][VALUE_INPUTS.get(op, slice(None))]
    dtypes = {v.dtype for v in values if isinstance(v, torch.Tensor)}
    if len(dtypes) > 1:
        return True
    if op in COMPARISONS or op in ("to_dtype", "clone", "cumsum"):
        return False
    return bool(dtypes) and dtypes != {out}


def _exact_scalar_dtype(dt: torch.dtype) -> bool:
    """Dtypes whose kernels compute in the dtype itself, so a number stored in it has the value
    the kernel would use (for half/bfloat16 the kernel computes in float32 from the double)."""
    return dt in (torch.float32, torch.float64) or not (dt.is_floating_point or dt.is_complex)


def _input_meta(node: Node) -> Any:
    """What _prepared_inputs and _may_convert read of an input: a number's value, a tensor's
    dtype and shape (a meta tensor; its strides do not matter there), None for the rest."""
    if node.op == "scalar":
        return evaluate("scalar", [], node.attrs)
    t = node.type
    if not isinstance(t, TensorType):
        return None
    return torch.empty(t.shape, dtype=dtype_of(t.dtype), device="meta")


def _prepared_inputs(node: Node, xs: list[Any], out_dtype: torch.dtype) -> dict[int, Any]:
    """Constant stand-ins for some inputs (by position), made once: the 0-dim tensors that torch
    would otherwise build from Python numbers on every call, and extra kernel arguments."""
    op, a = node.op, node.attrs
    prep: dict[int, Any] = {}
    if op in BINARY:
        x, y = xs
        if not isinstance(x, torch.Tensor):  # exactly the reference's own stand-in
            prep[0] = torch.scalar_tensor(x, dtype=weak_scalar_dtype(x, y))
        elif not isinstance(y, torch.Tensor) and op != "pow":  # pow(x, number): no wrapper
            common = torch.result_type(x, y)
            if _exact_scalar_dtype(common):
                prep[1] = torch.tensor(y, dtype=common)
    elif op == "where":
        for k in (1, 2):
            if not isinstance(xs[k], torch.Tensor):
                prep[k] = torch.tensor(xs[k], dtype=out_dtype)
    elif op in ("mm", "bmm", "matmul", "gemm"):
        alpha = a["alpha"]
        exact = _exact_scalar_dtype(out_dtype)
        prep[5 if op == "gemm" else 2] = torch.tensor(alpha, dtype=out_dtype) if exact else alpha
    elif op == "mean" and out_dtype in (torch.float32, torch.float64):
        shape = xs[0].shape
        count = 1
        for d in (a["dims"] or range(len(shape))):
            count *= shape[d]
        prep[1] = torch.tensor(float(count), dtype=out_dtype)
    return prep


# --- the runtime ----------------------------------------------------------------------------------
Step = tuple[Node, str, list[int], dict[int, Any], Writer | None]


class ArenaSteps:
    """A planned program's values as torch tensors on an arena, and the steps that compute
    nodes into them with torch ops. Shared by PlannedRuntime (every node) and the C backend's
    CRuntime (the nodes its C code does not generate, run between its compiled segments on
    the same arena: `nodes` selects them, plus the inputs and views they read).

    `static` holds, by node id, what does not change between calls: numbers, the constants
    (the graph's own tensors, never a backend's packed copy), every arena buffer and every view
    of one (a strided view of `arena` at its planned offset). A call copies it into `values`,
    binds the per-call values (inputs, OUTPUT tensors, which a caller may preset) and runs
    `steps` in order with `run`."""

    def __init__(self, graph: Graph, plan: MemoryPlan, arena: torch.Tensor,
                 nodes: Collection[int] | None = None,
                 constants: Mapping[str, torch.Tensor] | None = None):
        self.graph, self.plan, self.arena = graph, plan, arena
        constants = graph.constants if constants is None else constants
        # with `nodes`, only the constants they read are bound (a lazily loaded program's
        # other weights are made by the backend into its own forms: weights/lazy_weights.py)
        read = None if nodes is None else {i for n in nodes for i in graph.node(n).inputs}
        self.copy_in_nodes: list[int] = []  # nodes computed into a torch temporary per call
        self.converting_nodes: list[int] = []  # kernels that may convert an input (temporary)
        n = max((nd.id for nd in graph.nodes), default=-1) + 1
        self.static: list[Any] = [None] * n
        self.steps: list[Step] = []
        for nid in plan.order:
            node = graph.node(nid)
            kind = plan.kinds[nid]
            if kind == SCALAR:
                self.static[nid] = evaluate("scalar", [], node.attrs)
            elif node.op in ("param", "const"):
                if read is None or nid in read:
                    self.static[nid] = constants[node.attrs["name"]]
            elif kind == ARENA:
                self.static[nid] = self._buffer_tensor(nid, node.type)
            elif kind in (ALIAS, COPY_OUT):
                self.static[nid] = self._alias_tensor(node)
            if nodes is not None and nid not in nodes:
                continue
            if kind in (ARENA, OUTPUT, COPY_OUT, EXTERN_VIEW, TEMP) or node.op == "input":
                writer = WRITERS.get(node.op) if kind in (ARENA, OUTPUT) else None
                if kind in (ARENA, OUTPUT) and (writer is None or (
                        node.op == "gemm" and not gemm_writes_in_place(node.attrs))):
                    writer = None
                    self.copy_in_nodes.append(nid)
                out_dtype = (dtype_of(node.type.dtype) if isinstance(node.type, TensorType)
                             and kind in (ARENA, OUTPUT) else torch.float32)
                metas = [_input_meta(graph.node(i)) for i in node.inputs] if writer else []
                prep = _prepared_inputs(node, metas, out_dtype) if writer else {}
                if writer and _may_convert(node.op, metas, prep, out_dtype):
                    self.converting_nodes.append(nid)
                self.steps.append((node, kind, list(node.inputs), prep, writer))
        # temporaries (fallback results) are dropped after their last use
        last: dict[int, int] = {}
        for p, (node, *_rest) in enumerate(self.steps):
            for i in node.inputs:
                last[i] = p
        self.free_after: list[list[int]] = [[] for _ in self.steps]
        for i, p in last.items():
            if plan.kinds.get(i) == TEMP and i not in set(graph.outputs):
                self.free_after[p].append(i)
        self.copy_in_ops = sorted({graph.node(i).op for i in self.copy_in_nodes})

    def _buffer_tensor(self, nid: int, t: Any) -> torch.Tensor:
        b = self.plan.buffers[nid]
        dt = dtype_of(t.dtype)
        raw = self.arena[b.offset:b.offset + t.numel * dt.itemsize]
        return raw.view(dt).as_strided(t.shape, self.plan.strides[nid])

    def _alias_tensor(self, node: Node) -> torch.Tensor:
        xs = [self.static[i] for i in node.inputs]
        v = evaluate(node.op, xs, node.attrs)
        b = self.plan.buffers[node.id]
        start = v.data_ptr() - self.arena.data_ptr()
        if v.untyped_storage().data_ptr() != self.arena.untyped_storage().data_ptr() or \
                start != b.offset:
            raise GraphError(f"%{node.id} = {node.op}: planned as a view at arena offset "
                             f"{b.offset}, but torch did not return that view")
        return v

    def run(self, values: list[Any], inputs: list[torch.Tensor],
            copies: dict[int, torch.Tensor], start: int = 0, stop: int | None = None,
            label: bool = False) -> None:
        """Run steps [start, stop). `values`: a copy of `static`, an OUTPUT's entry preset to
        the tensor to write it into (else allocated here); `copies`: COPY_OUT results by node
        id, an entry preset to the tensor to copy into (else a clone is made)."""
        for p in range(start, len(self.steps) if stop is None else stop):
            step = self.steps[p]
            if label:
                with record_function(f"node:{step[0].id}"):
                    self._run_step(step, values, inputs, copies)
            else:
                self._run_step(step, values, inputs, copies)
            for i in self.free_after[p]:
                values[i] = None

    def _run_step(self, step: Step, values: list[Any], inputs: list[torch.Tensor],
                  copies: dict[int, torch.Tensor]) -> None:
        node, kind, srcs, prep, writer = step
        nid = node.id
        if node.op == "input":
            values[nid] = inputs[node.attrs["index"]]
            return
        if kind == COPY_OUT:  # the caller gets its own copy; the arena is reused next call
            dst = copies.get(nid)
            if dst is None:
                copies[nid] = values[nid].clone()
            else:
                dst.copy_(values[nid])
            return
        xs = [prep[k] if k in prep else values[i] for k, i in enumerate(srcs)]
        if kind in (EXTERN_VIEW, TEMP) or (kind == OUTPUT and writer is None
                                          and values[nid] is None):
            values[nid] = run_fallback(node.attrs, xs) if node.op == "fallback" \
                else evaluate(node.op, xs, node.attrs)
            return
        if values[nid] is None:  # an OUTPUT: allocated per call, with the plan's strides
            t = node.type
            values[nid] = torch.empty_strided(t.shape, self.plan.strides[nid],
                                              dtype=dtype_of(t.dtype))
        out = values[nid]
        if writer is None:  # copy-in: a torch temporary, copied into the buffer
            tmp = run_fallback(node.attrs, xs) if node.op == "fallback" \
                else evaluate(node.op, xs, node.attrs)
            out.copy_(tmp)
        else:
            writer(out, xs + [prep[k] for k in sorted(prep) if k >= len(srcs)],
                   node.attrs)


class PlannedRuntime:
    """Same interface as ReferenceRuntime: `run(inputs) -> outputs`, the same outputs."""

    def __init__(self, graph: Graph, plan: MemoryPlan | None = None, *, check: bool = False):
        self.graph = graph
        self.plan = plan = plan if plan is not None else plan_memory(graph)
        if check:
            check_plan(graph, plan)
        # refused before the arena is allocated (memcheck.py)
        check_fits({"arena": plan.arena_bytes, "outputs per call": output_bytes(graph)},
                   "run this program on the reference backend")
        self.arena = aligned_bytes(plan.arena_bytes)
        self.label_steps = False  # wrap each step in record_function("node:%d") (profiling)
        self.steps = ArenaSteps(graph, plan, self.arena)
        self.copy_in_nodes = self.steps.copy_in_nodes
        self.converting_nodes = self.steps.converting_nodes
        self.copy_in_ops = self.steps.copy_in_ops
        self.n_inputs = 1 + max((nd.attrs["index"] for nd in graph.nodes
                                 if nd.op == "input" and plan.kinds.get(nd.id) == LEAF),
                                default=-1)

    @torch.no_grad()  # out= kernels do not record autograd history; this is inference only
    def run(self, inputs: list[torch.Tensor]) -> list[Any]:
        if poison.enabled():
            return poison.checked_run(self.arena, inputs, lambda: self._run(inputs),
                                      "planned program")
        return self._run(inputs)

    def _run(self, inputs: list[torch.Tensor]) -> list[Any]:
        if len(inputs) < self.n_inputs:
            raise GraphError(f"the program reads {self.n_inputs} inputs, got {len(inputs)}")
        values = list(self.steps.static)
        copies: dict[int, torch.Tensor] = {}
        self.steps.run(values, inputs, copies, label=self.label_steps)
        return [copies[i] if i in copies else values[i] for i in self.graph.outputs]


def aligned_bytes(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """An arena: n bytes (at least 1, so that it has an address), 64-byte aligned."""
    raw = torch.empty(max(n, 1) + 64, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % 64
    return raw[skip:skip + max(n, 1)]


# --- measuring allocations ------------------------------------------------------------------------
def memory_events(fn: Callable[[], Any]) -> list[tuple[int, int, str | None]]:
    """Every storage allocation (+bytes) and free (-bytes) torch makes on the CPU while `fn`
    runs, in time order, each with the innermost enclosing `record_function` label (or None)."""
    # (a call measured for its allocations runs once: the poisoned-arena check's second run
    # and its copies are not the call's)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
            poison.suspended():
        fn()
    events: list[tuple[int, int, str | None]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.typed[0] == _EventType.Allocation:
            label, parent = None, e.parent
            while parent is not None and label is None:
                if parent.name.startswith("node:"):
                    label = parent.name
                parent = parent.parent
            events.append((e.start_time_ns, int(e.typed[1].alloc_size), label))
    events.sort(key=lambda ev: ev[0])
    return events


def peak_bytes(fn: Callable[[], Any]) -> int:
    """The peak of (bytes allocated - bytes freed) while `fn` runs: eager peak memory."""
    total = peak = 0
    for _, size, _ in memory_events(fn):
        total += size
        peak = max(peak, total)
    return peak


def allocations_by_node(runtime: PlannedRuntime, inputs: list[torch.Tensor]
                        ) -> dict[int | None, list[int]]:
    """The allocations one call makes, by the node whose step made them (None: outside any)."""
    runtime.label_steps = True
    try:
        events = memory_events(lambda: runtime.run(inputs))
    finally:
        runtime.label_steps = False
    out: dict[int | None, list[int]] = {}
    for _, size, label in events:
        if size > 0:
            out.setdefault(int(label[5:]) if label else None, []).append(size)
    return out
