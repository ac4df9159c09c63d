"""Algebraic identities of elementwise ops and scalars, and scales folded into matmuls.

Rules that drop an op guard on dtype, so that a promotion (int tensor + 0.0 -> float) is
never rewritten away.
"""

import torch
from egglog import String, Vec, eq, f64, i64, ne, rewrite, var

from eqsat_llm.egraph.analysis import is_float_dtype, keep_mask
from eqsat_llm.egraph.language import E, Tensor, dtype, shape
from eqsat_llm.rulebook import exact, family, guarded, reassociates


@family("algebra")
def algebra(x: Tensor, y: Tensor, a: Tensor, b: Tensor, c: f64, al: f64, k: String,
            s: Vec[i64], dt: String):
    one, zero, ck = E.scalar(1.0, k), E.scalar(0.0, k), E.scalar(c, k)
    same_dtype = eq(dtype(y)).to(dtype(x))
    yield exact("mul-one", guarded(E.mul(x, one), x, same_dtype))
    yield exact("one-mul", guarded(E.mul(one, x), x, same_dtype))
    yield exact("add-zero", guarded(E.add(x, zero), x, same_dtype))
    yield exact("zero-add", guarded(E.add(zero, x), x, same_dtype))
    yield exact("sub-zero", guarded(E.sub(x, zero), x, same_dtype))
    yield exact("scalar-mul-commute", rewrite(E.mul(ck, x)).to(E.mul(x, ck)))
    c_, inverse = E.scalar(c, "float"), E.scalar(f64(1.0) / c, "float")
    float_x = is_float_dtype(dtype(x))
    yield reassociates("div-as-mul",
                       guarded(E.div(x, c_), E.mul(x, inverse), ne(c).to(f64(0.0)), float_x),
                       note="exact when c is a power of two")
    yield exact("mul-through-view", rewrite(E.mul(E.view(x, s), ck)).to(E.view(E.mul(x, ck), s)))
    # (the scale folds into a float product only: an integer product times 0.5 is a float,
    # which no integer matmul kernel writes)
    float_product = is_float_dtype(dtype(a))
    yield reassociates("mm-scale",
                       guarded(E.mul(E.mm(a, b, al), c_), E.mm(a, b, al * c), float_product))
    yield reassociates("bmm-scale",
                       guarded(E.mul(E.bmm(a, b, al), c_), E.bmm(a, b, al * c), float_product))


@family("algebra")
def algebra_casts_and_masks(x: Tensor, y: Tensor, m: Tensor, a: Tensor, b: Tensor, c: f64,
                            al: f64, k: String, dt: String):
    full_0d, c_ = E.full(Vec[i64].empty(), c, dt), E.scalar(c, "float")
    float_dt, float_a = is_float_dtype(dt), is_float_dtype(dtype(a))
    yield exact("to-dtype-noop", guarded(E.to_dtype(x, dt), x, eq(dtype(x)).to(dt)))
    yield exact("div-by-0d-tensor",
                guarded(E.div(x, full_0d), E.div(x, c_), eq(dtype(x)).to(dt), float_dt))
    yield exact("where-0d-as-scalar",
                guarded(E.where(m, full_0d, x), E.where(m, c_, x), eq(dtype(x)).to(dt), float_dt))
    neg_inf = E.scalar(f64(float("-inf")), k)
    bias = E.where(m, neg_inf, E.full(Vec[i64].empty(), 0.0, dt))
    yield exact("masked-fill-as-bias",
                guarded(E.where(m, neg_inf, x), E.add(x, bias),
                        eq(dt).to(dtype(x)), float_dt, eq(dtype(y)).to(dt)),
                note="for x never +inf or nan (x + -inf = -inf); makes a mask an additive bias")
    # masked_fill(mask, torch.finfo(torch.float32).min), as MPT's eager attention masks
    lowest = E.scalar(f64(-3.4028234663852886e+38), k)
    yield exact("masked-fill-lowest-as-bias",
                guarded(E.where(m, lowest, x),
                        E.add(x, E.where(m, lowest, E.full(Vec[i64].empty(), 0.0, dt))),
                        eq(dt).to(dtype(x)), float_dt, eq(dtype(y)).to(dt)),
                note="x + c rounds to c in float32 for |x| < 2^102 (c's half ulp): a row that "
                     "sees no key stays as the model computes it")
    yield exact("where-lowest-as-bias",  # where(keep, x, finfo.min) (GPT-Neo)
                guarded(E.where(m, x, lowest),
                        E.add(x, E.where(m, E.full(Vec[i64].empty(), 0.0, dt), lowest)),
                        eq(dt).to(dtype(x)), float_dt, eq(dtype(y)).to(dt)),
                note="as masked-fill-lowest-as-bias, the mask's sense the other way")
    yield reassociates("matmul-scale",
                       guarded(E.mul(E.matmul(a, b, al), c_), E.matmul(a, b, al * c), float_a))


@family("algebra")
def algebra_normal_forms(x: Tensor, y: Tensor, a: Tensor, b: Tensor, c: f64, al: f64,
                         k: String, d: i64):
    swap, s = Vec[i64](1, 0), var("s", Vec[i64])
    float_b = is_float_dtype(dtype(b))
    yield exact("neg-neg", rewrite(E.neg(E.neg(x))).to(x))
    yield exact("mul-minus-one", guarded(E.mul(x, E.scalar(-1.0, k)), E.neg(x),
                                         eq(dtype(y)).to(dtype(x)), is_float_dtype(dtype(x))))
    yield exact("sub-as-add-neg", guarded(E.sub(a, b), E.add(a, E.neg(b)), float_b),
                note="a - b == a + (-b) in IEEE arithmetic (b a float tensor)")
    yield exact("neg-through-view", rewrite(E.neg(E.view(x, s))).to(E.view(E.neg(x), s)))
    # (a float product of float operands only: the mul may be what made `a` float)
    float_a, a_c = is_float_dtype(dtype(a)), E.mul(a, E.scalar(c, "float"))
    yield reassociates("scale-left-through-mm",
                       guarded(E.mm(a_c, b, al), E.mm(a, b, al * c), float_a))
    yield reassociates("scale-left-through-matmul",
                       guarded(E.matmul(a_c, b, al), E.matmul(a, b, al * c), float_a))
    yield reassociates("mm-transpose", rewrite(E.permute(E.mm(a, b, al), swap))
                       .to(E.mm(E.permute(b, swap), E.permute(a, swap), al)),
                       note="(A @ B)^T = B^T @ A^T")
    yield reassociates("softmax-shift", rewrite(E.softmax(E.add(x, E.scalar(c, "float")), d))
                       .to(E.softmax(x, d)), note="softmax is invariant to adding a constant")
    yield exact("softmax-less-row-max",
                guarded(E.softmax(E.sub(x, E.amax(x, s, i64(1))), d), E.softmax(x, d),
                        eq(s).to(Vec[i64](d))),
                note="softmax subtracts the row max itself: x - max(x) is what it exponentiates")
    lowest = E.full(Vec[i64].empty(), f64(-3.4028234663852886e+38), "float32")
    yield exact("softmax-floor-lowest",  # maximum(scores + mask, finfo.min) (XGLM)
                guarded(E.softmax(E.maximum(x, lowest), d), E.softmax(x, d),
                        is_float_dtype(dtype(x))),
                note="max(x, finfo.min) is x but where x is below it, and such an entry beside "
                     "one above finfo.min + 104 is 0 after the softmax either way: rows differ "
                     "only where none is (a row that sees no key); in a half dtype finfo.min "
                     "(float32's) rounds to -inf")


def keep_masks_drawn(value: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`rules check`'s weights for keep-mask rules: random 0s and 1s, every row's first a 1."""
    if value.dim() == 0:
        return value
    mask = (torch.rand(value.shape, generator=gen) < 0.5).to(value.dtype)
    mask[..., 0] = 1
    return mask


@family("algebra")
def algebra_keep_masks(x: Tensor, m: Tensor, d: i64, k1: String, k2: String):
    # scores * m + -1e4 * (1 - m), m a constant of 0s and 1s keeping each row's first key
    # (OpenAI-GPT's causal buffer): as an additive bias, which attention fuses
    bias = E.mul(E.sub(E.scalar(1.0, k1), m), E.scalar(f64(-1e4), k2))
    kept = E.add(E.mul(x, m), bias)
    yield exact("softmax-keep-mask-as-bias",
                guarded(E.softmax(kept, d), E.softmax(E.add(x, bias), d), keep_mask(m),
                        eq(d).to(shape(kept).length() - 1),
                        is_float_dtype(dtype(x))),
                note="a kept entry is x either way; a dropped one is -1e4 or x - 1e4, and for "
                     "|x| < 4948 both are below the row's max (a kept key: every row has "
                     "one) by more than 104, where exp gives 0 in float32",
                check_weights=keep_masks_drawn)


@family("algebra-finite")
def algebra_finite(x: Tensor, s: Vec[i64], dt: String):
    """Identities that hold for finite values only (opt-in: a NaN or inf input would be
    answered wrongly, and nothing in the e-graph proves a value finite)."""
    yield exact("sub-self",
                guarded(E.sub(x, x), E.full(s, 0.0, dt), eq(s).to(shape(x)), eq(dt).to(dtype(x))),
                note="for finite x: inf - inf is nan")


@family("algebra-ac")
def algebra_ac(a: Tensor, b: Tensor, c: Tensor, al: f64):
    # Opt-in ("all" leaves them out): they grow the e-graph until a saturation limit stops it.
    yield exact("add-commute", rewrite(E.add(a, b)).to(E.add(b, a)))
    yield exact("mul-commute", rewrite(E.mul(a, b)).to(E.mul(b, a)))
    yield reassociates("add-assoc", rewrite(E.add(E.add(a, b), c)).to(E.add(a, E.add(b, c))))
    yield reassociates("mul-assoc", rewrite(E.mul(E.mul(a, b), c)).to(E.mul(a, E.mul(b, c))))
    yield reassociates("mul-distribute", rewrite(E.mul(E.add(a, b), c))
                       .to(E.add(E.mul(a, c), E.mul(b, c))))
    yield reassociates("mm-reassociate", rewrite(E.mm(E.mm(a, b, 1.0), c, 1.0))
                       .to(E.mm(a, E.mm(b, c, 1.0), 1.0)),
                       note="which order is cheaper depends on the shapes: the cost model decides")
