"""CRuntime: a planned program run as generated C (same interface as ReferenceRuntime).

    rt = CRuntime(graph)                  # or CRuntime(graph, plan); emits, compiles, loads
    outs = rt.run(inputs)                 # fresh output tensors per call
    rt.run(inputs, out=outs)              # or into caller-provided ones (same layouts)

Nodes the backend does not generate (ops outside SUPPORTED_OPS, fallbacks, dtypes or shapes an
emitter declines) run in torch between compiled segments, on the same arena (`torch_steps`
lists them): one ctypes call per segment, the torch steps (codegen/planned.py's ArenaSteps:
out= writers into the planned buffers, copy-in, fallbacks) in between. Without them a call is
one ctypes call of `eq_forward`. `profile=True` builds the same source with `-DEQ_PROFILE`
(cached apart, as any other flags): each generated kernel then adds its seconds to
`eq_profile` and each torch step is timed alone; `profile_reset()` and `profile_read()` give
them. Construction raises `CCompileError` (naming the kernel and the
compiler's message) when compiling fails: the caller then runs the reference runtime. The
arena and the prepared weights are allocated once; the generated code allocates nothing. Not
reentrant: one call at a time per CRuntime (they share the arena)."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from ...errors import GraphError
from ...ir import Graph, Node, TensorType, dtype_of, node_label
from ...memcheck import check_fits, collapse_in_background, output_bytes
from ...ops import evaluate
from ...plan import COPY_OUT, EXTERN_VIEW, LEAF, OUTPUT, SCALAR, MemoryPlan, plan_memory
from .. import poison
from ..planned import ArenaSteps, aligned_bytes
from . import blas
from .build import CFLAGS, PROFILE_FLAG, build
from .emit import KernelHook, Program, emit_program
from .errors import KernelIndexError


class CRuntime:
    def __init__(self, graph: Graph, plan: MemoryPlan | None = None, *,
                 use_blas: bool | None = None, flags: list[str] | None = None,
                 kernel_hook: KernelHook | None = None, fuse_rope: bool = True,
                 profile: bool = False, constants: Mapping[str, torch.Tensor] | None = None):
        # `constants`: the graph's, or a mapping that makes them on access (weights/lazy_weights.py)
        self.graph = graph
        self.constants = constants = graph.constants if constants is None else constants
        self.plan = plan = plan if plan is not None else plan_memory(graph)
        self._options = {"use_blas": use_blas, "flags": flags, "kernel_hook": kernel_hook,
                         "fuse_rope": fuse_rope, "constants": constants}
        made = compiled_program(graph, plan, use_blas=use_blas, flags=flags,
                                kernel_hook=kernel_hook, fuse_rope=fuse_rope, profile=profile)
        self.program = prog = made.program
        self.flags, self.uses_blas, built = made.flags, made.uses_blas, made.built
        self.so_path, self.cache_hit, self.compile_seconds = (built.path, built.cache_hit,
                                                              built.seconds)
        if self.uses_blas:
            blas.load_openblas()
        self._lib = ctypes.CDLL(str(built.path))
        self._index_error = ctypes.c_int.in_dll(self._lib, built.index_error_symbol)
        # a profiling build's seconds per kernel (emit.py: EQ_T1) and per torch step
        self._kernel_seconds = (ctypes.c_double * max(len(prog.kernels), 1)).in_dll(
            self._lib, "eq_profile") if profile else None
        self._step_seconds: dict[int, float] | None = {} if profile else None
        lay = prog.layout
        # refused before the arena and the prepared weights are allocated (memcheck.py)
        check_fits({"arena": plan.arena_bytes,
                    "prepared weights": prepared_bytes(
                        [w for k, w in enumerate(lay.weights) if lay.is_read(k)],
                        graph.constants),
                    "outputs per call": output_bytes(graph)}, "run this program on the C backend")
        self.arena = aligned_bytes(plan.arena_bytes)
        # the nodes run in torch between segments: (node id, op; a fallback's aten target)
        self.torch_steps = [(nid, torch_op_name(graph.node(nid))) for nid in prog.torch_nodes]
        self._torch: ArenaSteps | None = None
        self.copy_in_ops: list[str] = []
        if prog.torch_phases:
            self._setup_segments(prog)
        else:
            self._fn = self._lib.eq_forward
            self._fn.restype = None
            self._fn.argtypes = [ctypes.c_void_p] * 4
        self.weights = lay.prepared_weights(constants)
        # streamed once a call (a decode step's weights): moved onto 2 MiB pages (fewer TLB
        # walks) by a background thread, off the start's path; not float32 ones, which
        # stream as fast on 4 KiB pages while the move slows every call it overlaps ~7x
        # (docs/c-backend.md, "Weights on 2 MiB pages")
        self.huge_pages = collapse_in_background(
            [w for w in self.weights if w.dtype != torch.float32])
        self._w = (ctypes.c_void_p * max(len(self.weights), 1))(
            *[w.data_ptr() for w in self.weights])
        self.n_inputs = lay.n_inputs
        self._in = (ctypes.c_void_p * max(self.n_inputs, 1))()
        self._out = (ctypes.c_void_p * max(len(prog.out_refs), 1))()
        self._in_types: dict[int, TensorType] = {}
        for n in graph.nodes:
            if n.op == "input" and n.id in lay.refs:
                self._in_types[n.attrs["index"]] = n.type  # type: ignore[assignment]
        self._out_specs = [(r.shape, r.strides, dtype_of(r.dtype)) for r in prog.out_refs]
        self._results = [self._result_spec(i) for i in graph.outputs]
        self._ptrs = (ctypes.c_void_p(self.arena.data_ptr()),
                      ctypes.cast(self._in, ctypes.c_void_p),
                      ctypes.cast(self._w, ctypes.c_void_p),
                      ctypes.cast(self._out, ctypes.c_void_p))

    def _setup_segments(self, prog: Program) -> None:
        """The torch side: ArenaSteps for the torch steps (and the inputs and views of inputs
        or outputs they read) on this arena, the step range of each phase, and which OUT
        buffers the steps write into."""
        graph, plan, lay = self.graph, self.plan, prog.layout
        self._seg = self._lib.eq_segment
        self._seg.restype = None
        self._seg.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4
        needed = set(prog.torch_nodes)
        stack = list(needed)
        while stack:
            for i in graph.node(stack.pop()).inputs:
                if i not in needed and (plan.kinds.get(i) == EXTERN_VIEW
                                        or graph.node(i).op == "input"):
                    needed.add(i)
                    stack.append(i)
        self._torch = steps = ArenaSteps(graph, plan, self.arena, needed, self.constants)
        self.copy_in_ops = steps.copy_in_ops
        pos = {node.id: p for p, (node, *_rest) in enumerate(steps.steps)}
        ends = [pos[phase[-1]] + 1 for phase in prog.torch_phases]
        self._phases = list(zip([0, *ends[:-1]], ends))
        self._c_segs = [bool(seg) for seg in prog.segments]  # empty ones are not called
        self._out_nodes = [(nid, k) for k, nid in enumerate(lay.outputs)
                           if plan.kinds[nid] == OUTPUT]
        self._copy_nodes = [(nid, lay.outputs.index(nid)) for nid in prog.torch_nodes
                            if plan.kinds[nid] == COPY_OUT]

    def _run_segments(self, ins: list[torch.Tensor], bufs: list[torch.Tensor]) -> None:
        if torch.is_grad_enabled():  # out= kernels record no autograd history
            with torch.no_grad():
                return self._run_segments(ins, bufs)
        steps = self._torch
        assert steps is not None
        values = list(steps.static)
        for nid, k in self._out_nodes:  # outputs live in this call's OUT buffers
            values[nid] = bufs[k]
        copies = {nid: bufs[k] for nid, k in self._copy_nodes}
        for k, (a, b) in enumerate(self._phases):
            if self._c_segs[k]:
                self._seg(k, *self._ptrs)
            if self._step_seconds is None:
                steps.run(values, ins, copies, a, b)
            else:
                timed_steps(steps, values, ins, copies, a, b, self._step_seconds)
        if self._c_segs[-1]:
            self._seg(len(self._phases), *self._ptrs)
        return None

    def _result_spec(self, nid: int) -> tuple[str, Any]:
        """How a graph output is returned: an OUT slot, a view of one, an input, a weight or a
        number."""
        lay = self.program.layout
        kind = self.plan.kinds[nid]
        node = self.graph.node(nid)
        if kind == SCALAR:
            return "value", evaluate("scalar", [], node.attrs)
        if nid in lay.outputs:
            return "out", lay.outputs.index(nid)
        r = lay.refs[nid]
        if kind in (LEAF, EXTERN_VIEW):
            src = r.root
            if src in lay.outputs:
                return "view_out", (lay.outputs.index(src), r.shape, r.strides, r.offset)
            if r.space == "IN":
                return "view_in", (r.slot, r.shape, r.strides, r.offset)
            return "view_w", (r.slot, r.shape, r.strides, r.offset)
        raise GraphError(f"output %{nid} ({kind}) has no place in the C program")

    def run(self, inputs: list[torch.Tensor], out: list[torch.Tensor] | None = None
            ) -> list[Any]:
        if poison.enabled():
            return poison.checked_run(self.arena, inputs, lambda: self._run(inputs, out),
                                      "C program")
        return self._run(inputs, out)

    def _run(self, inputs: list[torch.Tensor], out: list[torch.Tensor] | None) -> list[Any]:
        if len(inputs) < self.n_inputs:
            raise GraphError(f"the program reads {self.n_inputs} inputs, got {len(inputs)}")
        ins = list(inputs)
        for k, t in self._in_types.items():
            x = ins[k]
            if tuple(x.shape) != t.shape or x.dtype != dtype_of(t.dtype):
                raise GraphError(f"input {k}: expected {t}, got {x.dtype}{list(x.shape)}")
            if not x.is_contiguous():
                x = ins[k] = x.contiguous()
            self._in[k] = x.data_ptr()
        if out is None:
            bufs = [torch.empty_strided(s, st, dtype=dt) for s, st, dt in self._out_specs]
        else:
            bufs = self._check_out(out)
        for k, b in enumerate(bufs):
            self._out[k] = b.data_ptr()
        if self._torch is None:
            self._fn(*self._ptrs)
        else:
            self._run_segments(ins, bufs)
        if self._index_error.value:
            self._index_error.value = 0
            raise KernelIndexError("an index is out of range (an embedding id, or the indices "
                                   "of gather / index_select / index): torch raises here too")
        res: list[Any] = []
        for how, a in self._results:
            if how == "out":
                res.append(bufs[a])
            elif how == "value":
                res.append(a)
            else:
                slot, shape, strides, off = a
                base = bufs[slot] if how == "view_out" else ins[slot] if how == "view_in" \
                    else self.weights[slot]
                res.append(base.as_strided(shape, strides, base.storage_offset() + off))
        return res

    def _check_out(self, out: list[torch.Tensor]) -> list[torch.Tensor]:
        """Caller-provided result tensors, one per graph output that has an OUT slot."""
        slots = {a: k for k, (how, a) in enumerate(self._results) if how == "out"}
        if len(slots) != len(self._out_specs) or len(out) != len(self.graph.outputs):
            raise GraphError("out= needs one tensor per output, and every output must be "
                             "written by the program (not a view or an input)")
        bufs = []
        for slot, (shape, strides, dt) in enumerate(self._out_specs):
            t = out[slots[slot]]
            if tuple(t.shape) != shape or tuple(t.stride()) != strides or t.dtype != dt:
                raise GraphError(f"out[{slots[slot]}]: expected {dt}{list(shape)} with strides "
                                 f"{strides}, got {t.dtype}{list(t.shape)} {t.stride()}")
            bufs.append(t)
        return bufs

    @property
    def source(self) -> str:
        return self.program.source

    def profiling(self) -> CRuntime:
        """The same program built for profiling (`profile=True`): its own arena and
        weights, so that profiling leaves this runtime's state alone."""
        return CRuntime(self.graph, self.plan, profile=True, **self._options)

    def profile_reset(self) -> None:
        """Zero a profiling build's accumulated times."""
        if self._kernel_seconds is None or self._step_seconds is None:
            raise GraphError("not a profiling build: construct CRuntime(..., profile=True)")
        ctypes.memset(self._kernel_seconds, 0, ctypes.sizeof(self._kernel_seconds))
        self._step_seconds.clear()

    def profile_read(self) -> tuple[list[float], dict[int, float]]:
        """Seconds since `profile_reset`: per generated kernel (`program.kernels` order) and per
        torch step (by node id)."""
        if self._kernel_seconds is None or self._step_seconds is None:
            raise GraphError("not a profiling build: construct CRuntime(..., profile=True)")
        return list(self._kernel_seconds)[:len(self.program.kernels)], dict(self._step_seconds)


def timed_steps(steps: ArenaSteps, values: list[Any], ins: list[torch.Tensor],
                copies: dict[int, torch.Tensor], start: int, stop: int,
                seconds: dict[int, float]) -> None:
    """Run steps [start, stop) one at a time, adding each one's wall time to
    `seconds[node id]` (a profile of the torch side of a program)."""
    for p in range(start, stop):
        t = time.perf_counter()
        steps.run(values, ins, copies, p, p + 1)
        nid = steps.steps[p][0].id
        seconds[nid] = seconds.get(nid, 0.0) + time.perf_counter() - t


class CompiledProgram(NamedTuple):
    program: Program
    flags: list[str]
    uses_blas: bool
    built: Any  # build.Built: the shared object, whether the compile cache had it


def compiled_program(graph: Graph, plan: MemoryPlan, *, use_blas: bool | None = None,
                     flags: list[str] | None = None, kernel_hook: KernelHook | None = None,
                     fuse_rope: bool = True, profile: bool = False) -> CompiledProgram:
    """The planned program's C, emitted and compiled (through the compile cache): what a
    CRuntime loads. Needs no weight values: a parallel start's child (generation/parallel_start.py)
    compiles its program ahead of the process that loads it."""
    link = blas.link_flags() if use_blas is not False else []
    if use_blas and not link:
        raise GraphError("use_blas=True but scipy-openblas32 is not installed")
    prog = emit_program(graph, plan, blas=bool(link), kernel_hook=kernel_hook,
                        fuse_rope=fuse_rope, linked=True)
    all_flags = (list(flags) if flags is not None else list(CFLAGS)) + link + (
        [PROFILE_FLAG] if profile else [])
    return CompiledProgram(prog, all_flags, bool(link), build(prog, all_flags))


def prepared_bytes(weights: list[Any], constants: dict[str, torch.Tensor]) -> int:
    """About what Layout.prepared_weights allocates: a copy of each weight a kernel prepares
    (packed panels: the size of the constant it is made from), and of each constant read
    as is that is not contiguous; a spec's `stored` dtype where it narrows the values)."""
    total = 0
    for w in weights:
        t = constants.get(w if isinstance(w, str) else getattr(w, "name", None))
        if isinstance(t, torch.Tensor) and (not isinstance(w, str) or not t.is_contiguous()):
            stored = getattr(w, "stored", None)
            size = t.element_size() if stored is None else dtype_of(stored).itemsize
            total += t.numel() * size
    return total


def torch_op_name(node: Node) -> str:
    """What a torch step runs, for reports: its op, or a fallback's aten target."""
    return str(node.attrs["target"]) if node.op == "fallback" else node_label(node)
