"""The physical cost model: a roofline per kernel (docs/cost-model.md).

    seconds = max(compute time, memory_time(bytes read + written)) + call overhead

Compute time is matmul flops at the GEMM rate for the kernel's shape (an efficiency curve
from the skinny/GEMV rate to the large-GEMM rate) plus vector flops at the vector rate.
Bytes are what the kernel reads and writes from its *external* inputs and outputs, so a
fused kernel is charged only for those. The working set (bytes read + written) sets the
bandwidth: its first L2-sized part streams at L2 speed, the next at L3 speed, the rest at
DRAM speed. Views compute nothing and cost nothing; leaves cost nothing.

The machine's numbers (`machine.Machine`) come from `calibrate` (measured and cached
per machine) or the documented `machine.DEFAULT`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CostError, EqsatError
from ..formats.quant_formats import DYNAMIC, DYNAMIC4
from ..formats.sparse_formats import FORMATS as SPARSE_FORMATS
from ..ir import TensorType, dtype_of
from ..ops import (
    ACTIVATIONS,
    EXP_FLOPS,
    REGISTRY,
    WEAK_DTYPES,
    GemmDescriptor,
    operands_of,
    ops_where,
)
from .machine import Machine, machine_of_this_host


@dataclass(frozen=True)
class KernelCost:
    flops: float
    bytes_read: float
    bytes_written: float
    seconds: float
    bound: str = "free"  # "compute", "memory", "overhead" (nothing to move) or "free"

    @property
    def micros(self) -> float:
        """Seconds in microseconds: the unit to hand to extraction (its tolerances are
        absolute, ~1e-6, so costs in seconds would all look equal)."""
        return self.seconds * 1e6


FREE = KernelCost(0.0, 0.0, 0.0, 0.0, "free")

# (An op's vector work per element is its registry entry's `flops`, in adds: ops/.)
# Per attention score in a fused kernel: scale, bias, running max, exp, sum, rescale.
ATTENTION_SCORE_FLOPS = EXP_FLOPS + 6

# A copy that moves the innermost dimension (a transpose of the last two dims) reads or
# writes with a stride: measured 3-5x slower per byte than a contiguous copy.
TRANSPOSE_PENALTY = 4.0

# A fallback runs arbitrary torch code the model knows nothing about: charged its inputs and
# outputs moved once plus this fixed pessimistic time (every equivalent program contains
# the same fallbacks, so the figure only shifts totals).
FALLBACK_SECONDS = 1e-3

# The frontend's spellings of attention (sdpa, sdpa_masked): no backend generates them, torch's
# own kernel runs them, reading K/V repeated for every query head; the rules turn them into
# `attention`. Charged like a fallback so that a tie never keeps them.
FRONTEND_FORMS = ops_where("frontend_form")  # (ops/registry.py: OpDef.frontend_form)

# Sub-byte dtypes are counted packed (torch reports 1 byte for them).
_PACKED_BITS = {f"{s}int{b}": b for s in ("", "u") for b in range(1, 8)}


def element_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name; Python numbers ("py_float", ...) move nothing."""
    if dtype in WEAK_DTYPES:
        return 0.0
    if dtype in _PACKED_BITS:
        return _PACKED_BITS[dtype] / 8
    try:
        return float(dtype_of(dtype).itemsize)
    except EqsatError:
        raise CostError(f"unknown dtype {dtype!r}: no element size") from None


def nbytes(t: TensorType | tuple[TensorType, ...]) -> float:
    if isinstance(t, tuple):
        return sum(nbytes(x) for x in t)
    return t.numel * element_bytes(t.dtype)


BACKENDS = ("fused", "reference")


class CostModel:
    """Per-kernel roofline cost on `machine` (default: the calibrated one, else DEFAULT).

    backend "fused" (the default, for extraction): a fused op (rms_norm, swiglu, attention)
    is one kernel that moves only its external inputs and outputs, as a code generator emits
    it. backend "reference": each op costs what its reference semantics runs in torch, so a
    fused op costs its decomposition (kernel by kernel, intermediates included)."""

    def __init__(self, machine: Machine | None = None, backend: str = "fused"):
        if machine is None:
            machine = machine_of_this_host()
        if backend not in BACKENDS:
            raise CostError(f"unknown cost-model backend {backend!r}; one of {BACKENDS}")
        self.machine = machine
        self.backend = backend
        self._cache: dict[Any, KernelCost] = {}

    def kernel(self, op: str, attrs: dict[str, Any], inputs: Sequence[TensorType],
               output: TensorType | tuple[TensorType, ...]) -> KernelCost:
        """Cost of one kernel: `op` applied to inputs of these types, giving `output`."""
        key = (op, tuple(inputs), output, _attr_key(attrs))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._kernel(op, attrs, list(inputs), output)
        return hit

    def seconds(self, op: str, attrs: dict[str, Any], inputs: Sequence[TensorType],
                output: TensorType | tuple[TensorType, ...]) -> float:
        return self.kernel(op, attrs, inputs, output).seconds

    def micros(self, op: str, attrs: dict[str, Any], inputs: Sequence[TensorType],
               output: TensorType | tuple[TensorType, ...]) -> float:
        """The kernel's time in microseconds: the unit to give extraction."""
        return self.kernel(op, attrs, inputs, output).micros

    def _kernel(self, op: str, attrs: dict[str, Any], ins: list[TensorType],
                out: TensorType | tuple[TensorType, ...]) -> KernelCost:
        if op not in REGISTRY:
            raise CostError(f"cannot cost unknown op {op!r}: it is not in the op registry")
        opdef = REGISTRY[op]
        kind = opdef.cost
        if kind in ("leaf", "view"):
            return FREE
        if kind == "fold":
            return self._roofline(0.0, 0.0, 0.0, 0.0, extra=FALLBACK_SECONDS)
        if self.backend == "reference" and opdef.parts and isinstance(out, TensorType):
            parts = [self.kernel(*p) for p in opdef.parts(attrs, ins, out)]
            worst = max(parts, key=lambda c: c.seconds)
            return KernelCost(sum(c.flops for c in parts), sum(c.bytes_read for c in parts),
                              sum(c.bytes_written for c in parts),
                              sum(c.seconds for c in parts), worst.bound)
        read = sum(nbytes(t) for t in ins)
        written = nbytes(out)
        if kind == "fallback":
            return self._roofline(0.0, 0.0, read, written, extra=FALLBACK_SECONDS)
        if not isinstance(out, TensorType):
            raise CostError(f"{op}: expected one output tensor type, got {out}")
        if kind == "generate":
            return self._roofline(0.0, 0.0, 0.0, written)
        if kind == "copy":
            slow = TRANSPOSE_PENALTY if _moves_innermost(op, attrs, ins) else 1.0
            return self._roofline(0.0, 0.0, read, written, slowdown=slow)
        if kind == "vector":
            n = max([out.numel] + [t.numel for t in ins])
            return self._roofline(0.0, opdef.flops * n, read, written)
        if kind == "gather":  # rows gathered from the table; indices read whole
            return self._roofline(0.0, 0.0, written + sum(nbytes(t) for t in ins[1:]), written)
        if kind == "matmul":
            if op == "expert_mm":  # only the chosen experts' weights are read
                read = expert_bytes_read(attrs, ins)
            mm_flops, m_eff, epilogue = _matmul_shape(op, attrs, ins, out)
            overlap = GEMV_OVERLAP if _format_gemv(op, attrs, out) else 0.0
            return self._roofline(mm_flops, epilogue, read, written, m_eff, gemm=True,
                                  overlap=overlap)
        mm_flops, m_eff, vec = _attention_shape(op, ins, out)
        extra = FALLBACK_SECONDS if op in FRONTEND_FORMS else 0.0
        return self._roofline(mm_flops, vec, read, written, m_eff, gemm=True, extra=extra)

    def overhead(self, gemm: bool) -> float:
        """Seconds charged per call: a matmul/attention's, else a generated kernel's (fused
        backend) or a torch op's (reference backend)."""
        mc = self.machine
        if gemm:
            return mc.gemm_overhead
        return mc.kernel_overhead if self.backend == "fused" else mc.call_overhead

    def _roofline(self, mm_flops: float, vec_flops: float, read: float, written: float,
                  m_eff: int = 1, extra: float = 0.0, slowdown: float = 1.0,
                  gemm: bool = False, overlap: float = 0.0) -> KernelCost:
        mc = self.machine
        compute = vec_flops / mc.vector_flops
        if mm_flops:
            compute += mm_flops / mc.gemm_rate(m_eff)
        moved = read + written
        memory = slowdown * mc.memory_time(moved)
        if compute == 0.0 and memory == 0.0:
            bound = "overhead"
        else:
            bound = "compute" if compute >= memory else "memory"
        seconds = max(compute, memory) + overlap * min(compute, memory) + \
            self.overhead(gemm) + extra
        return KernelCost(mm_flops + vec_flops, read, written, seconds, bound)


def _attr_key(attrs: dict[str, Any]) -> tuple[Any, ...]:
    """The hashable part of an attribute dict (lists as tuples; a fallback's template and
    other unhashable values are left out: they do not change its cost)."""
    items = []
    for k, v in attrs.items():
        v = tuple(v) if isinstance(v, list) else v
        try:
            hash(v)
        except TypeError:
            continue
        items.append((k, v))
    return tuple(sorted(items, key=lambda kv: kv[0]))


def _moves_innermost(op: str, attrs: dict[str, Any], ins: list[TensorType]) -> bool:
    rank = len(ins[0].shape) if ins else 0
    if rank < 2:
        return False
    need = {"permute": ("dims",), "transpose": ("dim0", "dim1")}.get(op, ())
    missing = [a for a in need if a not in attrs]
    if missing:
        raise CostError(f"{op}: attrs lack {missing}; pass the e-node's attributes")
    if op == "permute":
        return attrs["dims"][-1] % rank != rank - 1
    if op == "transpose":
        moved = {attrs["dim0"] % rank, attrs["dim1"] % rank}
        return rank - 1 in moved and len(moved) == 2
    return False


def expert_count(attrs: dict[str, Any], ins: list[TensorType]) -> int:
    """E of an expert_mm: w [E, K, N] float, or its experts side by side (N each) stored."""
    w = operands_of("expert_mm", ins).w
    return w.shape[0] if attrs["weight"] == "float" else w.shape[1] // max(attrs["n"], 1)


def expert_bytes_read(attrs: dict[str, Any], ins: list[TensorType]) -> float:
    """An expert GEMM's bytes: its rows, their ids, and the weights (in their format, scales
    included) of at most S of the E experts (each expert used is read once:
    codegen/c/kernels/experts.c)."""
    g = operands_of("expert_mm", ins)
    experts = expert_count(attrs, ins)
    used = min(g.x.shape[0], experts) / max(experts, 1)
    return nbytes(g.x) + nbytes(g.ids) + used * (nbytes(g.w) + nbytes(g.w_scale))


def _matmul_shape(op: str, attrs: dict[str, Any], ins: list[TensorType],
                  out: TensorType) -> tuple[float, int, float]:
    """(matmul flops, smallest GEMM dimension, epilogue flops) of a matmul-family op.
    Flops = 2 * numel(out) * K: one multiply-add per output element per contracted index."""
    if op == "gemm":
        return _gemm_shape(attrs, ins, out)
    if op == "expert_mm":  # x [S, K] @ W[ids[s]] (W [E, K, N]): an expert's rows share it
        (S, K), N, E = ins[0].shape, attrs["n"], expert_count(attrs, ins)
        g, rows = operands_of(op, ins), max(1, S // E)
        flops = 2.0 * S * K * N * _weight_format_factor(attrs["weight"], g.w, g.w_scale,
                                                        rows, K * N * E)
        return flops, min(rows, N, K), 0.0
    a = ins[1] if op == "addmm" else ins[0]
    b = ins[1] if op in ("linear", "linear_bias") else ins[-1]
    if not a.shape:
        raise CostError(f"{op}: a 0-d operand {a} is not a matrix")
    k = a.shape[-1]
    if op in ("linear", "linear_bias"):
        n = b.shape[0] if len(b.shape) == 2 else 1
    else:
        n = b.shape[-1] if len(b.shape) >= 2 else 1
    if len(b.shape) <= 2:  # one shared matrix: every leading dim of `a` is a row
        rows = out.numel // max(n, 1)
    else:
        rows = a.shape[-2] if len(a.shape) >= 2 else 1
    epilogue = 0.0
    if op == "addmm":
        epilogue = 2.0 * out.numel
    elif op == "linear_bias" or attrs.get("alpha", 1.0) != 1.0:
        epilogue = float(out.numel)
    return 2.0 * out.numel * k, min(rows, n, k), epilogue


# rows up to which a quantized GEMM streams its weight (quant_gemm.py's EQ_QGEMV_M: 8 with
# AVX-512, 24 with AVX2; the smaller is taken: pricing the GEMV a little too long is harmless)
QUANT_GEMV_ROWS = 8
QUANT_TIE_BREAK = 0.01


# At more rows than the GEMV's, a sparse weight's kernel rate per stored multiply-add against
# the dense GEMM's per multiply-add: stored fraction / (time / dense time), measured at 128
# rows (codegen/c/sparse_gemm.py): bsr16 at half its blocks 0.52-0.56x dense's time; sparse24
# expands panels to dense, 1.07-1.11x (so dense is kept there).
SPARSE_GEMM_EFFICIENCY = {"sparse24": 0.45, "bsr16": 0.9}


# int8_dynamic's integer product (codegen/c/w8a8_gemm.py) against the float GEMM at more rows
# than the GEMV's: measured at M = 128 on the TinyLlama shapes 2.6-2.7x the packed fp32
# kernel's rate (2 threads, AVX2: vpmaddubsw; benchmarks/w8a8_kernels.py). At the GEMV's rows
# it is a policy, not a measurement: priced at DYNAMIC_GEMV_PENALTY times the int8 GEMV so
# that decode keeps the weight-only GEMV, the more accurate one, which at one row is as fast
# (measured K x N = 2048 x 5632 and 5632 x 2048: 0.36 / 0.35 ms against w8a8's 0.35 / 0.33).
# At 8 rows w8a8 took half the GEMV's time (1.07 / 0.95 ms against 2.08 / 2.25): a batched
# decode is priced too high here.
DYNAMIC_GEMM_FACTOR = 0.42
DYNAMIC_GEMV_PENALTY = 2.0
# int4_dynamic's byte product at more rows than the GEMV's (AVX-512: codegen/c/quant_gemm.py's
# eq_q4panel, vpdpbusd) against the float GEMM: measured at M = 64 on the TinyLlama shapes
# 0.51-0.61x the packed fp32 kernel's time (benchmarks/quant_kernels.py). Without AVX-512 the
# kernel decodes the codes and runs int4's float tiles: the float GEMM's price.
DYNAMIC4_GEMM_FACTOR = 0.55


def _byte_gemm() -> bool:
    """Whether int4_dynamic's prefill multiplies bytes (the C build has AVX-512BW)."""
    from ..codegen.c.build import builds_with  # (lazy: the backend imports the cost model)
    return builds_with("__AVX512BW__")


# A GEMV's work per stored byte against float32's, where it differs (benchmarks/quant_kernels.py
# --warm, the weight in cache, 2 threads, AVX-512: fp32 56.5 GB/s, int8 55.8, int4_g32 35.8,
# int4_dynamic 56.0 at 1 x 5632 x 2048): int4_g32 widens each nibble to float, int4_dynamic
# multiplies bytes.
GEMV_WORK_PER_BYTE = {"int4_g32": 1.6, "int4_g64": 1.6, "int4_g128": 1.6}
# A format GEMV's compute overlaps the weight's stream imperfectly: it is priced at the larger
# of the two plus this share of the smaller. (In the TinyLlama int4_g32 decode program the
# GEMVs read 80% of the streaming rate while their in-cache rate is 1.25x it: time ~ memory +
# 0.35 compute.) It breaks the tie between formats that stream the same bytes.
GEMV_OVERLAP = 0.35


def _format_gemv(op: str, attrs: dict[str, Any], out: TensorType) -> bool:
    """Whether a kernel is a GEMV streaming a weight stored in a format (GEMV_OVERLAP)."""
    if op not in ("gemm", "expert_mm") or attrs.get("weight", "float") == "float" or \
            not out.shape:
        return False
    return out.numel // max(out.shape[-1], 1) <= QUANT_GEMV_ROWS


def _weight_format_factor(fmt: str, w: TensorType, aux: TensorType, rows: int,
                          weights: int) -> float:
    """The gemm's time against the float GEMM's for a weight in format `fmt`, stored as w and
    aux (scales or positions), standing for `weights` (K x N) float32 weights. At few rows
    (QUANT_GEMV_ROWS) the kernel streams the stored bytes (quantized: the integers, the
    scales a rounding error; half: two bytes a value; sparse: the values and their
    positions); at more, quantized and half weights run the float tiles (less a tie-break),
    int8_dynamic multiplies integers and sparse weights skip what is not stored."""
    if fmt == "float":
        return 1.0
    sparse = fmt in SPARSE_FORMATS
    if rows <= QUANT_GEMV_ROWS:
        stored = w.numel * element_bytes(w.dtype)
        if sparse:
            stored += aux.numel * element_bytes(aux.dtype)
        return stored / (4.0 * weights) * (DYNAMIC_GEMV_PENALTY if fmt == DYNAMIC else
                                           GEMV_WORK_PER_BYTE.get(fmt, 1.0))
    if fmt == DYNAMIC:
        return DYNAMIC_GEMM_FACTOR
    if fmt == DYNAMIC4:
        return DYNAMIC4_GEMM_FACTOR if _byte_gemm() else 1.0
    if sparse:
        return w.numel / weights / SPARSE_GEMM_EFFICIENCY[fmt]
    return 1.0 - QUANT_TIE_BREAK


def _gemm_shape(a: dict[str, Any], ins: list[TensorType],
                out: TensorType) -> tuple[float, int, float]:
    """The gemm op's (matmul flops, smallest dimension, epilogue flops): one rule for every
    descriptor. The weight's bytes (its format's) are counted with the inputs, as for every
    kernel. A quantized weight is dequantized in registers: at few rows (QUANT_GEMV_ROWS) the
    GEMV rate is the rate of streaming the weight through the cores (calibrated on float32:
    4 bytes per multiply-add), so its flops count in proportion to the weight's bytes; at
    more rows the kernel dequantizes a panel once and runs the float tiles: the float GEMM's
    time, less QUANT_TIE_BREAK, so that a tie goes to the weight with fewer bytes."""
    g = operands_of("gemm", ins)
    x = g.x
    if not x.shape:
        raise CostError(f"gemm: a 0-d operand {x} is not a matrix")
    k, n = x.shape[-1], out.shape[-1]
    d = GemmDescriptor.of({"n": n, **a})
    rows = out.numel // max(n, 1)
    scaled = 0.0 if d.alpha == 1.0 else 1.0
    epilogue = {"none": scaled, "add": 1.0 + scaled, "bias": 2.0, "swiglu": 0.0}[d.epilogue]
    epilogue *= out.numel
    if d.act != "none":  # on the tile: the product never moved
        epilogue += REGISTRY[ACTIVATIONS[d.act].op].flops * out.numel
    if d.normed:  # the row statistics (square, sum) on x; the norm weight is folded into
        # the weight and the row scale multiplies each tile in L1 as stored
        epilogue += 2.0 * x.numel
    flops = (4.0 if d.swiglu else 2.0) * out.numel * k
    flops *= _weight_format_factor(d.weight, g.w, g.w_scale, rows, k * d.columns)
    if d.swiglu:  # two products per output, joined on the tile as it is
        # stored: priced as its two multiplies only (docs/cost-model.md: in the whole block it
        # is as fast as merged GEMM + SwiGLU, 0.95-1.01x in benchmarks/fusions.py, and never
        # stores the [M, 2N] product; priced with the SwiGLU's vector work the two tied and the
        # unfused one was kept)
        return flops, min(rows, n, k), 2.0 * out.numel + epilogue
    return flops, min(rows, n, k), epilogue


def _attention_shape(op: str, ins: list[TensorType], out: TensorType) -> tuple[float, int, float]:
    """softmax(q k^T * scale + bias) v over q (..., M, D), k (..., N, D), v (..., N, Dv):
    matmul flops 2*B*M*N*(D + Dv) and vector flops (scale, bias, softmax) per score."""
    x = operands_of(op, ins)  # (sdpa, sdpa_masked, attention: q, k, v first)
    q, k, v = x.q, x.k, x.v
    if min(len(q.shape), len(k.shape), len(v.shape)) < 2:
        raise CostError(f"{op}: q, k, v must have rank >= 2, got {q}, {k}, {v}")
    m, d = q.shape[-2], q.shape[-1]
    n, dv = k.shape[-2], v.shape[-1]
    batch = out.numel // max(m * dv, 1)
    scores = float(batch * m * n)
    return 2.0 * scores * (d + dv), min(m, n, d), scores * ATTENTION_SCORE_FLOPS
