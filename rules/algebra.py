"""Algebraic identities of elementwise ops and scalars, and scales folded into matmuls.

Rules that drop an op guard on dtype, so that a promotion (int tensor + 0.0 -> float) is
never rewritten away.
"""

from egglog import String, Vec, eq, f64, i64, ne, rewrite, rule, union

from eqsat_llm.egraph.analysis import is_float_dtype
from eqsat_llm.egraph.language import E, Tensor, dtype, shape
from eqsat_llm.rulebook import exact, family, reassociates


@family("algebra")
def algebra(x: Tensor, y: Tensor, a: Tensor, b: Tensor, c: f64, al: f64, k: String,
            s: Vec[i64], dt: String):
    one, zero = E.scalar(1.0, k), E.scalar(0.0, k)
    same_dtype = eq(dtype(y)).to(dtype(x))
    yield exact("mul-one", rule(eq(y).to(E.mul(x, one)), same_dtype).then(union(y).with_(x)))
    yield exact("one-mul", rule(eq(y).to(E.mul(one, x)), same_dtype).then(union(y).with_(x)))
    yield exact("add-zero", rule(eq(y).to(E.add(x, zero)), same_dtype).then(union(y).with_(x)))
    yield exact("zero-add", rule(eq(y).to(E.add(zero, x)), same_dtype).then(union(y).with_(x)))
    yield exact("sub-zero", rule(eq(y).to(E.sub(x, zero)), same_dtype).then(union(y).with_(x)))
    yield exact("sub-self", rule(eq(y).to(E.sub(x, x)), eq(s).to(shape(x)), eq(dt).to(dtype(x))).then(union(y).with_(E.full(s, 0.0, dt))), note="for finite x: inf - inf is nan")
    yield exact("scalar-mul-commute", rewrite(E.mul(E.scalar(c, k), x)).to(E.mul(x, E.scalar(c, k))))
    yield reassociates("div-as-mul", rule(eq(y).to(E.div(x, E.scalar(c, "float"))), ne(c).to(f64(0.0)), is_float_dtype(dtype(x))).then(union(y).with_(E.mul(x, E.scalar(f64(1.0) / c, "float")))), note="exact when c is a power of two")
    yield exact("mul-through-view", rewrite(E.mul(E.view(x, s), E.scalar(c, k))).to(E.view(E.mul(x, E.scalar(c, k)), s)))
    yield reassociates("mm-scale", rewrite(E.mul(E.mm(a, b, al), E.scalar(c, "float"))).to(E.mm(a, b, al * c)))
    yield reassociates("bmm-scale", rewrite(E.mul(E.bmm(a, b, al), E.scalar(c, "float"))).to(E.bmm(a, b, al * c)))


@family("algebra")
def algebra_casts_and_masks(x: Tensor, y: Tensor, m: Tensor, a: Tensor, b: Tensor, c: f64,
                            al: f64, k: String, dt: String):
    yield exact("to-dtype-noop", rule(eq(y).to(E.to_dtype(x, dt)), eq(dtype(x)).to(dt)).then(union(y).with_(x)))
    yield exact("div-by-0d-tensor", rule(eq(y).to(E.div(x, E.full(Vec[i64].empty(), c, dt))), eq(dtype(x)).to(dt), is_float_dtype(dt)).then(union(y).with_(E.div(x, E.scalar(c, "float")))))
    yield exact("where-0d-as-scalar", rule(eq(y).to(E.where(m, E.full(Vec[i64].empty(), c, dt), x)), eq(dtype(x)).to(dt), is_float_dtype(dt)).then(union(y).with_(E.where(m, E.scalar(c, "float"), x))))
    neg_inf = E.scalar(f64(float("-inf")), k)
    yield exact("masked-fill-as-bias", rule(eq(y).to(E.where(m, neg_inf, x)), is_float_dtype(dtype(x)), eq(dtype(y)).to(dtype(x))).then(union(y).with_(E.add(x, E.where(m, neg_inf, E.scalar(0.0, "float"))))), note="for x never +inf or nan (x + -inf = -inf); makes a mask an additive bias")
    yield reassociates("matmul-scale", rewrite(E.mul(E.matmul(a, b, al), E.scalar(c, "float"))).to(E.matmul(a, b, al * c)))
