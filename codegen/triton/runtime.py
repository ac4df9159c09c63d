"""TritonRuntime: a planned program run as Triton kernels (same interface as CRuntime).

    rt = TritonRuntime(graph)            # or TritonRuntime(graph, plan)
    outs = rt.run(inputs)                # inputs on rt.device

One arena (a byte tensor on the device, the plan's size) holds every intermediate at its
planned offset; the constants are copied to the device once; a call launches the kernels in
the plan's order and runs the nodes no kernel is generated for as torch steps on the same
arena (`torch_steps`). On CUDA a call is captured as a CUDA graph and replayed (`cuda_graph`,
by default when the only torch steps are state writes in place): one launch per call instead
of one per kernel, what a decode step's time is made of. Not reentrant: one call at a time
(they share the arena)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from ...errors import GraphError
from ...ir import Graph, TensorType, dtype_of
from ...memcheck import check_fits, output_bytes
from ...plan import COPY_OUT, OUTPUT, MemoryPlan, plan_memory
from .. import poison
from ..c.errors import KernelIndexError
from ..c.runtime import torch_op_name
from ..planned import ArenaSteps, aligned_bytes
from .launch import device as backend_device
from .program import plan_program


class TritonRuntime:
    def __init__(self, graph: Graph, plan: MemoryPlan | None = None, *,
                 cuda_graph: bool | None = None):
        self.device = backend_device()
        self.plan = plan = plan if plan is not None else plan_memory(graph)
        self.graph = graph
        self.program = prog = plan_program(graph, plan)
        # refused before the constants and the arena are put on the device (memcheck.py)
        check_fits({"constants": sum(v.numel() * v.element_size() for v in
                                     graph.constants.values() if isinstance(v, torch.Tensor)),
                    "arena": plan.arena_bytes, "outputs per call": output_bytes(graph)},
                   "run this program on the Triton backend", self.device)
        on_device = dataclasses.replace(graph, constants={
            k: v.detach().to(self.device).contiguous() for k, v in graph.constants.items()})
        self.arena = aligned_bytes(plan.arena_bytes, self.device)
        self._steps = ArenaSteps(on_device, plan, self.arena)
        self.copy_in_ops = self._steps.copy_in_ops
        self.torch_steps = [(nid, torch_op_name(graph.node(nid))) for nid in prog.torch_nodes]
        inner = prog.inner
        # what a call does, step by step: launch a node's kernels, or run its torch step
        self._actions: list[tuple[int, Any]] = []
        for p, (node, *_rest) in enumerate(self._steps.steps):
            if node.id in inner:
                continue
            self._actions.append((p, prog.launches.get(node.id)))
        self._outputs = {nid for nid in prog.launches if plan.kinds[nid] == OUTPUT}
        self.n_inputs = 1 + max((n.attrs["index"] for n in graph.nodes if n.op == "input"),
                                default=-1)
        self._in_types = {n.attrs["index"]: n.type for n in graph.nodes if n.op == "input"}
        self.kernel_count = sum(len(v) for v in prog.launches.values())
        self._index_flags = [ln.index_error for ls in prog.launches.values() for ln in ls
                             if ln.index_error is not None]
        # CUDA graph: by default on CUDA when every torch step is a state write in place (an
        # index_copy_ into a KV cache); another torch op might synchronise or allocate
        capturable = all(graph.node(n).attrs.get("inplace") for n in prog.torch_nodes)
        self.cuda_graph = self.device.type == "cuda" and (
            capturable if cuda_graph is None else cuda_graph)
        # inputs the program writes in place (a KV cache): the graph keeps their addresses
        self._written_inputs = {graph.node(n.inputs[0]).attrs["index"] for n in graph.nodes
                                if n.attrs.get("inplace") and graph.node(n.inputs[0]).op
                                == "input"}
        self._graph: Any = None
        self._graph_in: list[torch.Tensor] = []
        self._graph_out: list[Any] = []

    @property
    def source(self) -> str:
        """The generated kernels and the launch listing."""
        return self.program.module_text + "\n\n" + "\n".join(
            "# " + line if not line.startswith("#") else line
            for line in self.program.listing(self.graph, self.plan.order).split("\n")) + "\n"

    def run(self, inputs: list[torch.Tensor]) -> list[Any]:
        if poison.enabled():
            return poison.checked_run(self.arena, inputs, lambda: self._run(inputs),
                                      "Triton program")
        return self._run(inputs)

    def _run(self, inputs: list[torch.Tensor]) -> list[Any]:
        if len(inputs) < self.n_inputs:
            raise GraphError(f"the program reads {self.n_inputs} inputs, got {len(inputs)}")
        ins = list(inputs)
        for k, t in self._in_types.items():
            x = ins[k]
            assert isinstance(t, TensorType)
            if tuple(x.shape) != t.shape or x.dtype != dtype_of(t.dtype):
                raise GraphError(f"input {k}: expected {t}, got {x.dtype}{list(x.shape)}")
            if x.device != self.device:
                raise GraphError(f"input {k} is on {x.device}; the Triton program runs on "
                                 f"{self.device}")
            if not x.is_contiguous():
                ins[k] = x.contiguous()
        with torch.no_grad():
            outs = self._replay(ins) if self.cuda_graph else self._call(ins)
        if self._index_flags and any(bool(f.item()) for f in self._index_flags):
            for f in self._index_flags:
                f.zero_()
            raise KernelIndexError("an index is out of range (an embedding id): torch raises "
                                   "here too")
        return outs

    def _replay(self, ins: list[torch.Tensor]) -> list[Any]:
        """The call as a CUDA graph: captured on the first call (inputs copied into buffers the
        graph owns, but those written in place, whose addresses it keeps), replayed after;
        outputs are copied out of the graph's buffers. A call whose written-in-place inputs are
        other tensors than at capture runs without the graph."""
        if self._graph is None:
            self._graph_in = [x if k in self._written_inputs else x.clone()
                              for k, x in enumerate(ins)]
            self._call(self._graph_in)  # warm-up: every kernel compiled before capture
            torch.cuda.synchronize()
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._graph_out = self._call(self._graph_in)
        for k, (x, held) in enumerate(zip(ins, self._graph_in)):
            if k in self._written_inputs:
                if x.data_ptr() != held.data_ptr():
                    return self._call(ins)
            else:
                held.copy_(x)
        self._graph.replay()
        return [v.clone() if isinstance(v, torch.Tensor) else v for v in self._graph_out]

    def _call(self, ins: list[torch.Tensor],
              timer: Callable[[int], AbstractContextManager[Any]] | None = None) -> list[Any]:
        """One call, launch by launch; `timer(node id)` (profile.py) wraps each node's
        launches or torch step."""
        steps = self._steps
        values = list(steps.static)
        copies: dict[int, torch.Tensor] = {}
        for nid in self._outputs:  # outputs a kernel writes: this call's tensors
            t = self.graph.node(nid).type
            values[nid] = torch.empty_strided(t.shape, self.plan.strides[nid],
                                              dtype=dtype_of(t.dtype), device=self.device)
        for p, launches in self._actions:
            with timer(steps.steps[p][0].id) if timer else nullcontext():
                if launches is None:
                    steps.run(values, ins, copies, p, p + 1)
                    continue
                for launch in launches:
                    launch(values)
            for i in steps.free_after[p]:
                values[i] = None
        return [copies[i] if self.plan.kinds.get(i) == COPY_OUT and i in copies else values[i]
                for i in self.graph.outputs]
