"""One C translation unit per program: a kernel per node (specialised to its static shapes and
strides; kernels equal but for their arena offsets and slots share one function, called with
its own: shared_kernels.py) and `eq_forward`, which calls them in the plan's order.

    void eq_forward(char* A, void* const* IN, void* const* W, void* const* OUT);

A node the backend does not generate (an op outside SUPPORTED_OPS, a `fallback`, a dtype or
shape its emitter declines, a torch temporary) is a torch step instead: the kernels are then
split into segments at those steps, and the program exports

    void eq_segment(int k, char* A, void* const* IN, void* const* W, void* const* OUT);

(no `eq_forward`): CRuntime calls segment 0, the torch steps of `Program.torch_phases[0]`
(codegen/planned.py's ArenaSteps, on the same arena), segment 1, and so on.

A: the arena (64-byte aligned, `eq_arena_bytes()` long); IN: the inputs by index (contiguous);
W: the prepared constants (contiguous, in `Layout.weights` order; weights packed for the
GEMMs among them); OUT: the per-call output
buffers (in `Program.outputs` order, with the plan's strides; outputs that view the arena are
copied out contiguously). Nothing is allocated by the generated code."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise

import torch

from ...ir import VALUE_LEAVES, Graph, Node, contiguous_strides, node_label
from ...ops import MATMUL_OPS
from ...plan import ARENA, COPY_OUT, LEAF, OUTPUT, SCALAR, TEMP, VIEW_OPS, MemoryPlan
from .emit_attention import emit_attention
from .emit_elementwise import (
    ELEMENTWISE_OPS,
    emit_cat,
    emit_copy,
    emit_elementwise,
    emit_reshape_copy,
    emit_rope,
)
from .emit_format_gemm import prepared_operands
from .emit_gather import GATHER_OPS, emit_gather, emit_row_write
from .emit_gemm import emit_gemm
from .emit_matmul import emit_matmul
from .emit_norm import emit_layer_norm, emit_rms_norm, emit_softmax
from .emit_reduce import REDUCE_OPS, emit_reduce
from .emit_routing import (
    EXPERTS,
    QUANT_EXPERTS,
    TOPK,
    emit_arg_extreme,
    emit_expert_mm,
    emit_scatter_value,
    emit_topk,
)
from .errors import UnsupportedByBackend
from .fuse_elementwise import emit_fused, fusion_groups, overlaps
from .fuse_rope import RopeEpilogue, rope_epilogues
from .half_table import HalfTable, holds_bfloat16
from .packed_gemm import PACKED_GEMM
from .prelude import PRELUDE
from .quant_gemm import FORMAT_LIBRARIES, QUANT_GEMM
from .shared_kernels import function, parameterized, places_table
from .sparse_gemm import SPARSE_GEMM
from .static_c import included
from .values import Layout, Ref, build_layout
from .w8a8_gemm import W8A8_GEMM


@dataclass(frozen=True)
class Site:
    """What an emitter is given: the node, the places of its value (`out`) and of its inputs
    (`ins`), whether they may be declared restrict (no overlap), whether GEMMs may call BLAS,
    the program's layout and constants, and the ropes a GEMM may compute in its epilogue."""
    node: Node
    out: Ref
    ins: list[Ref]
    restrict: bool
    blas: bool
    layout: Layout
    constants: dict[str, torch.Tensor]
    ropes: tuple[RopeEpilogue, ...] = ()


# An emitter returns the kernel's body, or None where it declines this dtype or shape (the node
# is then a torch step).
Emitter = Callable[[Site], "str | None"]


def _view_copy(s: Site) -> str | None:
    # a layout op torch does not return as a view: copy its view
    from .values import view_of
    return emit_copy(s.out, view_of(s.ins[0], s.node.op, s.node.attrs, s.out.shape))


def _full(s: Site) -> str | None:
    fill = Ref("scalar", 0, 0, (), (), "float64", float(s.node.attrs["value"]))
    return emit_elementwise(Node(s.node.id, "clone", (), {}, s.node.type), s.out, [fill], True)


# The C kernel of each op it generates, by op: one line each.
# the static C libraries, in the order a program includes them (each after those it builds on)
STATIC_LIBRARIES = (PACKED_GEMM, *FORMAT_LIBRARIES, QUANT_GEMM, SPARSE_GEMM, W8A8_GEMM, EXPERTS,
                    QUANT_EXPERTS, TOPK)

EMITTERS: dict[str, Emitter] = {
    **dict.fromkeys(ELEMENTWISE_OPS, lambda s: emit_elementwise(s.node, s.out, s.ins,
                                                                  s.restrict)),
    "gemm": lambda s: emit_gemm(s.node, s.out, s.ins, s.blas, s.layout, s.ropes),
    **dict.fromkeys(MATMUL_OPS, lambda s: emit_matmul(s.node, s.out, s.ins, s.blas, s.layout,
                                                      s.ropes)),
    "rope": lambda s: emit_rope(s.out, s.ins, s.restrict),
    "attention": lambda s: emit_attention(s.node, s.out, s.ins, s.blas,
                                          s.layout.constant(s.ins[3], s.constants)),
    "rms_norm": lambda s: emit_rms_norm(s.node, s.out, s.ins),
    "layer_norm": lambda s: emit_layer_norm(s.node, s.out, s.ins),
    "softmax": lambda s: emit_softmax(s.node, s.out, s.ins, False),
    "log_softmax": lambda s: emit_softmax(s.node, s.out, s.ins, True),
    "cat": lambda s: emit_cat(s.out, s.ins, s.node.attrs["dim"]),
    **dict.fromkeys(VIEW_OPS, _view_copy),
    "view": lambda s: emit_reshape_copy(s.out, s.ins[0]) if s.out.dtype == s.ins[0].dtype
    else None,
    "embedding": lambda s: _embedding(s.out, s.ins, s.layout, s.constants),
    **dict.fromkeys(REDUCE_OPS, lambda s: emit_reduce(s.node, s.out, s.ins)),
    **dict.fromkeys(GATHER_OPS, lambda s: emit_gather(s.node, s.out, s.ins)),
    "full": _full,
    **dict.fromkeys(("topk_values", "topk_indices"), lambda s: emit_topk(s.node, s.out, s.ins)),
    "expert_mm": lambda s: emit_expert_mm(s.node, s.out, s.ins, s.layout),
    **dict.fromkeys(("argmax", "argmin"), lambda s: emit_arg_extreme(s.node, s.out, s.ins)),
    "scatter_value": lambda s: emit_scatter_value(s.node, s.out, s.ins),
}
SUPPORTED_OPS = frozenset(EMITTERS) | VALUE_LEAVES
# Registry ops C runs as torch steps by design (tests/test_registry.py: every op is generated
# or listed here): a captured call outside the registry; a tuple's element; torch's sdpa,
# which the fusion rules turn into `attention` wherever its mask and shapes allow.
TORCH_STEP_OPS = frozenset({"fallback", "getitem", "sdpa", "sdpa_masked"})

KernelHook = Callable[[str, str], str]


@dataclass
class Kernel:
    name: str
    node: int
    op: str  # the node's label (ir.node_label: a gemm with its descriptor)
    first_line: int = 0
    last_line: int = 0
    fused: tuple[int, ...] = ()  # an elementwise group's nodes (fuse_elementwise.py), root last
    epilogue: tuple[int, ...] = ()  # ropes computed in this GEMM's epilogue (fuse_rope.py)
    # the C function it calls: its own, or an earlier kernel's of the same code but for its
    # places (shared_kernels.py; first_line/last_line are that function's)
    function: str = ""


@dataclass
class Program:
    source: str
    kernels: list[Kernel]
    layout: Layout
    out_refs: list[Ref]  # the OUT slots' own layouts
    # kernel indices of each C segment; empty when there is no torch step (eq_forward)
    segments: list[tuple[int, ...]] = field(default_factory=list)
    # node ids run in torch after segment k, in plan order (len(segments) - 1 of them)
    torch_phases: list[tuple[int, ...]] = field(default_factory=list)
    linked: bool = False  # built against the shared kernel library (emit_program)

    @property
    def torch_nodes(self) -> list[int]:
        return [nid for phase in self.torch_phases for nid in phase]

    def kernel_at(self, line: int) -> Kernel | None:
        for k in self.kernels:
            if k.first_line <= line <= k.last_line:
                return k
        return None


def _embedding(out: Ref, ins: list[Ref], layout: Layout | None = None,
               constants: Mapping[str, torch.Tensor] | None = None) -> str | None:
    w, idx = ins
    if len(w.shape) != 2 or idx.ctype not in ("int64_t", "int32_t") or out.dtype != w.dtype:
        return None
    d = w.shape[1]
    flat = out.with_view(idx.shape + (d,), out.strides, out.offset)
    from .loops import loop_nest
    table, value = f"const {w.ctype}* w = {w.ptr()};", f"w[r * {w.strides[0]} + c * {w.strides[1]}]"
    half = _half_table(w, layout, constants)
    if half is not None:  # bf16 bits, widened as copied (half_table.py)
        table = f"const uint16_t* w = (const uint16_t*){half.ptr()};"
        value = (f"({{ uint32_t b = (uint32_t)w[r * {d} + c] << 16; float f; "
                 f"memcpy(&f, &b, 4); f; }})")
    return (f"{out.ctype}* o = {out.ptr(const=False)};\n{table}\n"
            f"const {idx.ctype}* ix = {idx.ptr()};\n"
            + loop_nest(idx.shape, [flat.strides[:-1], idx.strides],
                        lambda o: f"    const int64_t r = (int64_t)ix[{o[1]}];\n"
                        f"    if ((uint64_t)r >= {w.shape[0]}ULL) EQ_INDEX_ERROR();\n"
                        f"    else for (int64_t c = 0; c < {d}; c++) "
                        f"o[{o[0]} + c * {flat.strides[-1]}] = {value};",
                        simd=False))


def _half_table(w: Ref, layout: Layout | None, constants: Mapping[str, torch.Tensor] | None
                ) -> Ref | None:
    """The W slot of the table `w` in bfloat16 when it is a whole contiguous float32 constant
    whose values all are bfloat16 ones; else None."""
    name = layout.constant_name(w) if layout is not None and constants is not None else None
    if name is None or w.dtype != "float32" or w.offset != 0 or \
            w.strides != (w.shape[1], 1) or tuple(constants[name].shape) != w.shape or \
            not holds_bfloat16(constants[name]):
        return None
    return layout.prepared(HalfTable(name, *w.shape), w.shape, "int16")


def emit_program(graph: Graph, plan: MemoryPlan, *, blas: bool = False,
                 kernel_hook: KernelHook | None = None, fuse: bool = True,
                 fuse_rope: bool = True, linked: bool = False) -> Program:
    """The program's C source. `fuse`: elementwise chains as one kernel; `fuse_rope`: ropes in
    the epilogue of the GEMM they read (off: each its own kernel, for A/B measurement);
    `linked`: the static libraries' headers only, the program built against the shared kernel
    library (kernel_library.py), else their whole text. Nodes no kernel is generated for
    become torch steps (`Program.torch_phases`)."""
    lay = build_layout(graph, plan)
    refs = lay.refs
    out_refs = [refs[nid] if plan.kinds[nid] == OUTPUT else
                Ref("OUT", k, 0, refs[nid].shape, contiguous_strides(refs[nid].shape),
                    refs[nid].dtype, root=nid)
                for k, nid in enumerate(lay.outputs)]
    parts: list[tuple[Kernel, str]] = []
    torch_at: list[tuple[int, int]] = []  # (kernels emitted before it, node) per torch step
    group_list = fusion_groups(graph, plan, refs) if fuse else []
    groups = {g.root: g for g in group_list}
    inner = {m for g in groups.values() for m in g.members[:-1]}
    ropes = rope_epilogues(graph, plan, refs, group_list) if fuse_rope else {}
    in_epilogue: set[int] = set()  # ropes a GEMM kernel took
    for nid in plan.order:
        node = graph.node(nid)
        kind = plan.kinds[nid]
        label = node_label(node)
        name = f"k{nid}_" + re.sub(r"\W+", "_", label).strip("_")
        if nid in inner or nid in in_epilogue:  # computed inside another kernel
            continue
        if nid in groups:
            g, out = groups[nid], refs[nid]
            ext = [refs[i] for i in g.inputs]
            buf = plan.buffers.get(nid)
            restrict = (buf is None or buf.inplace_of is None) and all(
                r.root != out.root and not overlaps(r, out) for r in ext)
            body = emit_fused(graph, g, refs, restrict)
            assert body is not None  # fusion_groups checked every member
            parts.append((Kernel(name, nid, node.op, fused=g.members), body))
        elif "rows_at" in node.attrs and all(refs[i].in_c for i in node.inputs) and (
                body := emit_row_write(node.attrs["rows_at"], [refs[i] for i in node.inputs])):
            parts.append((Kernel(name, nid, label), body))  # a state's rows written in place
        elif kind == TEMP or (kind in (ARENA, OUTPUT) and not _in_c(node, refs)) or \
                node.attrs.get("inplace"):  # (a state write in place: torch's own op)
            torch_at.append((len(parts), nid))
        elif kind in (ARENA, OUTPUT):
            out = refs[nid]
            ins = [refs[i] for i in node.inputs]
            buf = plan.buffers.get(nid)
            restrict = (buf is None or buf.inplace_of is None) and all(
                r.root != out.root for r in ins)
            eps = ropes.get(nid, ())
            site = Site(node, out, ins, restrict, blas, lay, graph.constants)
            emitter = EMITTERS[node.op]
            body = emitter(replace(site, ropes=eps)) if eps else None
            if body is not None:
                in_epilogue.update(e.node for e in eps)
            else:
                eps = ()
                body = emitter(site)
            if body is None:  # this dtype/shape combination is not generated: torch
                torch_at.append((len(parts), nid))
                continue
            parts.append((Kernel(name, nid, label, epilogue=tuple(e.node for e in eps)), body))
        elif kind == COPY_OUT and not refs[nid].in_c:
            torch_at.append((len(parts), nid))
        elif kind == COPY_OUT:
            slot = lay.outputs.index(nid)
            parts.append((Kernel(name + "_out", nid, "copy_out"),
                          emit_copy(out_refs[slot], refs[nid])))
        elif kind not in (LEAF, SCALAR) and nid not in refs:
            raise UnsupportedByBackend([node.op], f"storage kind {kind}")
    segments, phases = _segments(len(parts), torch_at)
    lay.read = {r.slot for nid in graph.outputs if (r := refs.get(nid)) and r.space == "W"}
    for _, code in parts:
        lay.note_reads(code)
    lines = [f"/* generated by eqsat_llm.codegen.c: {len(parts)} kernels */",
             "#define EQ_BLAS_BUILD " + ("1" if blas else "0")]
    lines += PRELUDE.strip("\n").split("\n")
    libraries = included((code for _, code in parts), STATIC_LIBRARIES)
    linked = linked and bool(libraries)  # (a program calling none has its own error flag)
    for lib in libraries:
        lines += (lib.header if linked else lib.source).strip("\n").split("\n")
    kernels, places = [], []
    functions: dict[str, Kernel] = {}  # a parameterized body -> the kernel emitted for it
    for k, code in parts:  # kernels equal but for their places share one (shared_kernels.py)
        p = parameterized(code)
        first = functions.setdefault(p.body, k)
        if first is k:
            text = function(k.name, p.body)
            if kernel_hook is not None:
                text = kernel_hook(k.name, text)
            k.first_line = len(lines) + 1
            lines += [f"/* kernel {k.name} */"] + text.split("\n")
            k.last_line = len(lines)
        k.function, k.first_line, k.last_line = first.name, first.first_line, first.last_line
        kernels.append(k)
        places.append(p.places)
    lines += [places_table(f"eq_p{i}", p) for i, p in enumerate(places)]
    lines.append(f"long long eq_arena_bytes(void) {{ return {plan.arena_bytes}LL; }}")
    n = max(len(kernels), 1)
    lines += ["#ifdef EQ_PROFILE", f"double eq_profile[{n}];",
              "#define EQ_T0 double eq_t = omp_get_wtime();",
              "#define EQ_T1(k) eq_profile[k] += omp_get_wtime() - eq_t;",
              "#else", "#define EQ_T0", "#define EQ_T1(k)", "#endif"]

    def calls(idx: Iterable[int], indent: str) -> list[str]:
        return [f"{indent}{{ EQ_T0 {kernels[i].function}(A, IN, W, OUT, eq_p{i}); EQ_T1({i}) }}"
                for i in idx]

    if not phases:
        lines.append("void eq_forward(char* A, void* const* IN, void* const* W, "
                     "void* const* OUT) {")
        lines += calls(range(len(kernels)), "    ")
        lines.append("}")
    else:  # one entry for all segments: a ctypes call each, torch steps in between
        lines.append("void eq_segment(int k, char* A, void* const* IN, void* const* W, "
                     "void* const* OUT) {")
        lines.append("    switch (k) {")
        for s, seg in enumerate(segments):
            lines += [f"    case {s}:", *calls(seg, "        "), "        break;"]
        lines += ["    default: break;", "    }", "}"]
    return Program("\n".join(lines) + "\n", kernels, lay, out_refs, segments, phases, linked)


def _in_c(node: Node, refs: dict[int, Ref]) -> bool:
    """Whether a kernel may be generated for the node: a supported op whose value and inputs
    all have C places (not torch temporaries, not dtypes without a C type; but for the
    constants its kernel reads as prepared copies, such as half-precision weights)."""
    prepared = prepared_operands(node)
    return node.op in SUPPORTED_OPS and node.id in refs and refs[node.id].in_c and all(
        i in refs and (refs[i].in_c or k in prepared) for k, i in enumerate(node.inputs))


def _segments(n_kernels: int, torch_at: list[tuple[int, int]]
              ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Split the kernels 0..n-1 at the torch steps (each after the kernels emitted before
    it): the C segments and, between each two, the torch steps run there (none: no split)."""
    if not torch_at:
        return [], []
    cuts = sorted({k for k, _ in torch_at})
    bounds = [0, *cuts, n_kernels]
    segments = [tuple(range(a, b)) for a, b in pairwise(bounds)]
    phases = [tuple(nid for k, nid in torch_at if k == c) for c in cuts]
    return segments, phases
