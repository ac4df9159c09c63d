"""optimize(quantize=...): which format, which weights, and how far the answer moved.

Weight-only quantization is a rule family per format (rules/quantize.py) that optimize adds to
the rules; the encoder marks the weights it may touch (`keep_float` leaves some out, e.g. the
LM head). The error is measured, not assumed: the compiled program and the float model run
on the example inputs, and the report gives each output's largest absolute and relative error
and, for logits-like outputs, how often the top-1 class agrees."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from typing import Any

import torch

from ..errors import EqsatError
from .quant_formats import DYNAMIC_STORED, FORMATS

ALIASES = {"int4": "int4_g32", "fp8": "fp8_e4m3"}  # group 32, as the common int4 formats;
# e4m3, as FP8 weights are usually stored


def resolve_format(quantize: str) -> str:
    fmt = ALIASES.get(quantize, quantize)
    if fmt not in (*FORMATS, *DYNAMIC_STORED):
        raise EqsatError(f"unknown quantize format {quantize!r}; one of "
                         f"{sorted([*ALIASES, *FORMATS, *DYNAMIC_STORED])}")
    return fmt


def rule_families(fmt: str) -> list[str]:
    """The rule families of a quantize= format: a dynamic format's integer product competes
    with the weight-only GEMM of its stored format (int8_dynamic: decode keeps the int8 GEMV;
    int4_dynamic: prefill keeps int4's float tiles)."""
    if fmt in DYNAMIC_STORED:
        return [f"quantize-{DYNAMIC_STORED[fmt]}", f"quantize-{fmt}"]
    return [f"quantize-{fmt}"]


def keep_float_matcher(patterns: Iterable[str]) -> Callable[[str], bool] | None:
    """Whether a weight (by its parameter name) stays float: a pattern names a module
    ("lm_head": its weights) or is a glob over parameter names ("model.layers.0.*")."""
    pats = list(patterns)
    if not pats:
        return None
    return lambda name: any(fnmatchcase(name, p) or name.startswith(p + ".") for p in pats)


def check_keep_float(patterns: Iterable[str], weight_names: list[str]) -> None:
    """Refuse a keep_float pattern that names no weight of the model: it would leave the
    weights it meant quantized, silently. The message shows the names that end like it."""
    for pat in patterns:
        matches = keep_float_matcher([pat])
        if matches is not None and not any(matches(n) for n in weight_names):
            like = [n for n in weight_names if f".{pat}." in f".{n}"][:3] or weight_names[:3]
            raise EqsatError(f"keep_float pattern {pat!r} names no weight of the model; its "
                             f"weights are named like {like} (a module path or a glob over "
                             "these names)")


@dataclass
class OutputError:
    max_abs: float  # largest |compiled - float eager|
    max_rel: float  # max_abs / largest |float eager|
    top1_agreement: float | None  # argmax over the last dim agrees (outputs of rank >= 2)


@dataclass
class QuantizationReport:
    format: str
    quantized_weights: int  # gemms reading integer weights in the program
    kept_float: list[str]  # the keep_float patterns
    outputs: list[OutputError]
    # expert GEMMs (mixtures of experts) whose weights stay float32 (K not whole groups, say)
    float_experts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        errs = ", ".join(f"max abs {o.max_abs:.3g} (rel {o.max_rel:.3g})"
                         + (f", top-1 agrees {o.top1_agreement:.1%}"
                            if o.top1_agreement is not None else "") for o in self.outputs)
        kept = f"; kept float: {', '.join(self.kept_float)}" if self.kept_float else ""
        if self.float_experts:
            kept += f"; {self.float_experts} expert GEMMs kept float32 (docs/moe.md)"
        return (f"weights quantized to {self.format}: {self.quantized_weights} GEMMs{kept}; "
                f"against the float model on the example inputs: {errs or 'not measured'}")


def output_errors(want: Any, got: Any) -> list[OutputError]:
    """Per floating output (in flattening order), the compiled program's error."""
    import torch.utils._pytree as pytree

    out = []
    for w, g in zip(pytree.tree_leaves(want), pytree.tree_leaves(got)):
        if not (isinstance(w, torch.Tensor) and w.is_floating_point()):
            continue
        w, g = w.detach().double(), g.detach().double()
        max_abs = float((w - g).abs().max()) if w.numel() else 0.0
        scale = float(w.abs().max()) if w.numel() else 0.0
        top1 = None
        if w.dim() >= 2 and w.shape[-1] > 1:
            top1 = float((w.argmax(-1) == g.argmax(-1)).double().mean())
        out.append(OutputError(max_abs, max_abs / scale if scale else max_abs, top1))
    return out
