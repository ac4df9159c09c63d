"""Weight-only quantization, as rewrites: a GEMM on a constant float weight W is
equal, within the format's error, to the same GEMM on the integers and scales of W
(formats/quant_formats.py), which constant folding computes once at compile time. The C kernels
dequantize in registers (codegen/c/quant_gemm.py); the cost model prices the weight's bytes in
its format, so extraction takes the quantized GEMM where reading the weight is what costs.

One family per format ("quantize-int8", "quantize-int4_g32", ...), not in "all":
optimize(quantize=...) adds it. "quantize-int8_dynamic" rewrites to the int8_dynamic gemm
(int8 weights, activations coded per row in 7 bits: an integer product); optimize(quantize=
"int8_dynamic") adds it beside "quantize-int8", and the cost model takes the integer product
where it pays (prefill) and the int8 GEMV where reading the weight is what costs (decode).
"quantize-int4_dynamic" likewise rewrites to the int4_dynamic gemm (int4_g32 weights,
activations coded per block of 32 in 8 bits): the cost model takes its byte product at decode,
where the weight-only int4 GEMV is bound by its dequantization, and the weight-only gemm at
prefill.
Approximate rules: their tolerance, relative to the largest output, is what `rules check`
verifies on random instances."""

from egglog import Vec, eq, i64

from eqsat_llm.egraph.analysis import is_const, is_float_dtype, quantizable
from eqsat_llm.egraph.language import E, Tensor, dtype, shape
from eqsat_llm.formats.quant_formats import DYNAMIC, DYNAMIC4, DYNAMIC_STORED, FORMATS, format_group
from eqsat_llm.rulebook import approximate, family

from .fusion import stored_experts_rule, stored_weight_rules

# The worst error seen by `eqsat-llm rules check` over random instances, with a margin: each
# weight is off by at most half a step (int8: max|w| / 254 per column; fp8_e4m3: 2^-4 of
# itself, fp8_e5m2: 2^-3; int4: max|w| / 14 per group), summed over K products; int8_dynamic
# adds each activation's (half a step of its row's range / 127); int4_dynamic each
# activation's half step of its block's max / 127, small beside int4's own.
TOLERANCE = {"int8": 0.05, "fp8_e4m3": 0.1, "fp8_e5m2": 0.2, "fp8_e4m3_g128": 0.1,
             "int4_g32": 0.5, "int4_g64": 0.5, "int4_g128": 0.5, DYNAMIC: 0.1, DYNAMIC4: 0.5}


def _family(fmt: str):
    """The rules storing a GEMM's weight as `fmt` (its integers in the format quant_formats
    names: int8's for int8_dynamic)."""
    stored = DYNAMIC_STORED.get(fmt, fmt)
    group = format_group(stored)

    def rules(x: Tensor, w: Tensor, sw: Vec[i64]):
        # W: a constant float32 matrix the encoder let be quantized, whole groups of rows
        weight = [is_const(w), quantizable(w), eq(sw).to(shape(w)), eq(sw.length()).to(i64(2)),
                  is_float_dtype(dtype(w))]
        if group:
            weight.append(eq(sw[0] % group).to(i64(0)))
        q, s = E.quantize_weight(w, stored), E.weight_scales(w, stored)
        tol, note = TOLERANCE[fmt], f"W stored as {stored}: each weight within half a step" + (
            "; x coded per row in 7 bits" if fmt == DYNAMIC else
            "; x coded per block of 32 in 8 bits" if fmt == DYNAMIC4 else "")
        dims = (group, 2 * group) if group else ()  # (rules check: whole groups of rows)
        matmul, gemm = stored_weight_rules(fmt, q, s, weight, x, w, sw)
        yield approximate(f"quantize-matmul-{fmt}", matmul, tol, note, dims)
        yield approximate(f"quantize-gemm-{fmt}", gemm, tol, note, dims)
        # a mixture's experts, each expert's output channels their own scales; weight-only
        whole = [eq(sw[1] % group).to(i64(0))] if group else []
        experts = stored_experts_rule(
            stored, lambda m: (E.quantize_weight(m, stored), E.weight_scales(m, stored)),
            quantizable, x, w, sw, *whole)
        yield approximate(f"quantize-experts-{fmt}", experts, TOLERANCE[stored],
                          f"each expert stored as {stored}: within half a step", dims)

    rules.__name__ = f"quantize_{fmt}"
    return family(f"quantize-{fmt}")(rules)


FAMILIES = {fmt: _family(fmt) for fmt in (*FORMATS, *DYNAMIC_STORED)}
RULES = [r for rules in FAMILIES.values() for r in rules]  # (a rule module's lists of Rule)
