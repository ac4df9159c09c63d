"""What the optimizer did, for people (`summary()`) and for tools (`to_dict()`).

`to_dict()` keys are stable: capture, e-graph, rules, extraction, op counts, timings and
fallbacks; see docs/report.md for their meaning.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from .units import fmt_bytes, fmt_seconds, fmt_signed_us, fmt_us


def memory_summary(plan: Any, copy_in_ops: Any) -> dict[str, Any]:
    """The report's memory entry from a MemoryPlan (eqsat_llm.plan)."""
    return {"arena_bytes": plan.arena_bytes, "lower_bound_bytes": plan.lower_bound_bytes,
            "naive_bytes": plan.naive_bytes, "inplace": plan.inplace_count,
            "views": plan.alias_count, "schedule": plan.schedule,
            "copy_in_ops": sorted(copy_in_ops)}


@dataclass
class RuleStat:
    name: str
    family: str
    soundness: str
    matches: int
    used: bool = False  # it built an e-node of the extracted program (egraph/provenance.py)
    # it built an e-node of an e-class of the program: a result a later rule matched (or an
    # alternative not chosen)
    in_classes: bool = False


@dataclass
class Report:
    op_counts_before: Counter[str] = field(default_factory=Counter)
    op_counts_after: Counter[str] = field(default_factory=Counter)
    aten_op_counts: dict[str, int] = field(default_factory=dict)
    fallback_ops: list[str] = field(default_factory=list)
    # layer calls spliced from one traced layer at capture, or why every layer was traced
    stamped_calls: int = 0
    stamping_fallback: str | None = None
    iterations: int = 0
    stop_reason: str = ""
    egraph_size_per_iteration: list[int] = field(default_factory=list)
    eclasses: int = 0
    enodes: int = 0
    rules: list[RuleStat] = field(default_factory=list)
    extraction_method: str = ""
    cost_before: float = 0.0
    cost_after: float = 0.0
    lower_bound: float | None = None  # of the extracted program's cost (ILP's dual bound)
    # e-nodes the cost model could not price (an input type the analysis did not derive),
    # by op: priced pessimistically, so extraction avoids them; should be empty
    unpriced_enodes: dict[str, int] = field(default_factory=dict)
    folded_constants: int = 0
    folded_bytes: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    # "hit": the program came from the on-disk cache (generation/program_cache.py: a meta-device
    # model), "miss": optimized and stored there, "off": not cached (a model with weights)
    program_cache: str = "off"
    backend: str = "reference"
    memory: dict[str, Any] = field(default_factory=dict)
    # nodes the C backend ran in torch between its compiled segments, by op (a fallback by
    # its aten target); empty when everything ran as generated C
    torch_ops: dict[str, int] = field(default_factory=dict)
    # state writes (a KV cache's index_copy_) run in place on the module's buffer (capture/state.py)
    state_in_place: int = 0
    # optimize(quantize=...): the format, the GEMMs it reached and the measured error
    # (quantization.QuantizationReport)
    quantization: Any = None
    # a bf16/fp16 model computed in float32 on the C backend (formats/half.py)
    computed_in_float32: bool = False
    # the GEMMs whose weight is stored in another format than float32, by format: quantized
    # (optimize(quantize=...)), sparse (sparsity="auto"), half precision (fp16, bf16)
    weight_formats: dict[str, int] = field(default_factory=dict)
    # constants on the meta device (a model built there: planned only, not runnable;
    # weights/meta.py)
    meta_weights: int = 0
    # one entry per kernel of the extracted program: what it is, its predicted (and, when
    # profiled, measured) cost, the rules that built it, the alternatives it beat
    # (decisions.py; docs/report.md gives the keys)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    # predicted against measured time per backend kernel, when profiled (profile.py)
    profile: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["op_counts_before"] = dict(self.op_counts_before)
        d["op_counts_after"] = dict(self.op_counts_after)
        d["gap"] = None if self.lower_bound is None else self.cost_after - self.lower_bound
        d["nodes_before"] = sum(self.op_counts_before.values())
        d["nodes_after"] = sum(self.op_counts_after.values())
        d["quantization"] = self.quantization and self.quantization.to_dict()
        return d

    def explain(self, kernel: int | str) -> str:
        """Why the program has this kernel (an id such as 12 or "%12", a label such as
        "gemm[rms_norm]", or an op such as "attention"): its cost, the rules that built it, the
        alternatives it beat and by how much (explain.py)."""
        from .explain import explain

        return explain(self.to_dict(), kernel)

    def summary(self) -> str:
        lines = ["eqsat-llm report", "================"]
        before, after = sum(self.op_counts_before.values()), sum(self.op_counts_after.values())
        bound = ("" if self.lower_bound is None else
                 f", lower bound {self.lower_bound:g}, gap {self.cost_after - self.lower_bound:g}")
        lines.append(f"ops: {before} -> {after}    predicted time: {fmt_us(self.cost_before)} -> "
                     f"{fmt_us(self.cost_after)} ({self.extraction_method} extraction{bound})")
        if self.profile:
            lines.append(_profile_line(self.profile))
        lines.append(f"e-graph: {self.eclasses} classes, {self.enodes} nodes after "
                     f"{self.iterations} iterations; stopped: {self.stop_reason}")
        if self.folded_constants:
            lines.append(f"constants folded at compile time: {self.folded_constants} values, "
                         f"{self.folded_bytes / 2**20:.2f} MiB prepared")
        if self.stamped_calls:
            lines.append(f"capture: {self.stamped_calls} repeated layer calls spliced from "
                         "layers traced once")
        elif self.stamping_fallback:
            lines.append(f"capture: every layer traced ({self.stamping_fallback})")
        if self.fallback_ops:
            lines.append("fallback to torch: " + ", ".join(self.fallback_ops))
        lines.append(f"backend {self.backend}" + ("; ran in torch: " + ", ".join(
            f"{op} x{n}" for op, n in sorted(self.torch_ops.items())) if self.torch_ops else ""))
        if self.meta_weights:
            lines.append(f"weights on the meta device ({self.meta_weights} tensors): optimized "
                         "and planned only, no code generated; calling raises EqsatError")
        if self.state_in_place:
            lines.append(f"state writes run in place on the module's buffers: "
                         f"{self.state_in_place}")
        if self.quantization is not None:
            lines.append(self.quantization.summary())
        if self.weight_formats:
            lines.append("GEMM weights stored as: " + ", ".join(
                f"{n} {fmt}" for fmt, n in sorted(self.weight_formats.items())))
        if self.computed_in_float32:
            lines.append("half-precision model computed in float32 (GEMM weights held in half "
                         "precision where listed above, others widened at compile time; inputs "
                         "and outputs in the model's dtype)")
        lines.append("")
        width = max([16, *(len(o) + 2 for o in self.op_counts_after)])
        lines.append(f"{'op':<{width}}{'before':>8}{'after':>8}")
        for op in sorted(set(self.op_counts_before) | set(self.op_counts_after),
                         key=lambda o: (-self.op_counts_before.get(o, 0), o)):
            b, a = self.op_counts_before.get(op, 0), self.op_counts_after.get(op, 0)
            lines.append(f"{op:<{width}}{b:>8}{a:>8}")
        if self.memory:
            m = self.memory
            eager = m.get("eager_peak_bytes")
            lines.append("")
            lines.append(f"memory: arena {fmt_bytes(m['arena_bytes'])} (liveness lower bound "
                         f"{fmt_bytes(m['lower_bound_bytes'])}, naive sum "
                         f"{fmt_bytes(m['naive_bytes'])}"
                         + (f", eager peak {fmt_bytes(eager)}" if eager is not None else "")
                         + f"); {m['inplace']} in place, {m['views']} views")
        lines += _decision_lines(self.kernels)
        fired = [r for r in self.rules if r.matches]
        lines.append("")
        lines.append(f"rules fired ({len(fired)} of {len(self.rules)}; "
                     f"{sum(r.used for r in fired)} used by the extracted program):")
        name_w = max([24, *(len(r.name) + 2 for r in fired)])  # (long format names)
        family_w = max([10, *(len(r.family) + 2 for r in fired)])
        for r in sorted(fired, key=lambda r: (not r.used, not r.in_classes, -r.matches)):
            used = "used" if r.used else "in the program's classes" if r.in_classes \
                else "not used"
            lines.append(f"  {r.name:<{name_w}}{r.family:<{family_w}}{r.soundness:<14}"
                         f"{r.matches:>6} matches  {used}")
        lines.append("")
        lines.append("time per phase: " + ", ".join(f"{k} {fmt_seconds(v)}"
                                                   for k, v in self.timings.items()))
        return "\n".join(lines)


def _profile_line(p: dict[str, Any]) -> str:
    if p["median_ratio"] is None:  # nothing timed (Triton's interpreter)
        return f"measured ({p['backend']}): nothing timed: {p.get('reason') or 'no kernel'}"
    priced = [k for k in p["kernels"] if k["ratio"] is not None]
    return (f"measured ({p['backend']}, {p['statistic']} of {p['repeats']} calls): "
            f"{fmt_us(p['total_measured_us'])}; cost model off by median "
            f"{p['median_ratio']:.2f}x, worst {p['worst_ratio']:.2f}x ({p['worst_kernel']}); "
            f"{p['flagged']} of {len(priced)} kernels off by more than 1.5x")


DECISIONS_SHOWN = 8


def _decision_lines(kernels: list[dict[str, Any]]) -> list[str]:
    """The costliest kernels that had alternatives: the margin each choice won by."""
    chosen = sorted((k for k in kernels if k["alternatives"] or k.get("sharing")),
                    key=lambda k: -(k["predicted_us"] or 0.0))
    if not chosen:
        return []
    lines = ["", ("decisions (margin: what the best alternative would add to the program; "
             "report.explain(kernel) tells more):")]
    for k in chosen[:DECISIONS_SHOWN]:
        deltas = [a["delta_us"] for a in k["alternatives"] if a["delta_us"] is not None]
        margin = f"margin {fmt_signed_us(min(deltas))}" if deltas else "no acyclic alternative"
        share = k.get("sharing")
        if share:
            margin += (f"; shared by {len(share['consumers'])}, not sharing "
                       f"{fmt_signed_us(share['unshared_delta_us'])}")
        lines.append(f"  %{k['id']:<5}{k['label']:<20}{fmt_us(k['predicted_us']):>9}  "
                     f"{k['alternatives_total']} alternatives, {margin}")
    if len(chosen) > DECISIONS_SHOWN:
        lines.append(f"  ... and {len(chosen) - DECISIONS_SHOWN} more kernels with alternatives")
    return lines

