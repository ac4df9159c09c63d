"""Algebraic identities of elementwise ops and scalars, and scales folded into matmuls.

Rules that drop an op guard on dtype, so that a promotion (int tensor + 0.0 -> float) is
never rewritten away.
"""

from egglog import String, Vec, eq, f64, i64, ne, rewrite, rule, union, var

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
    yield exact("scalar-mul-commute", rewrite(E.mul(E.scalar(c, k), x)).to(E.mul(x, E.scalar(c, k))))
    yield reassociates("div-as-mul", rule(eq(y).to(E.div(x, E.scalar(c, "float"))), ne(c).to(f64(0.0)), is_float_dtype(dtype(x))).then(union(y).with_(E.mul(x, E.scalar(f64(1.0) / c, "float")))), note="exact when c is a power of two")
    yield exact("mul-through-view", rewrite(E.mul(E.view(x, s), E.scalar(c, k))).to(E.view(E.mul(x, E.scalar(c, k)), s)))
    # (the scale folds into a float product only: an integer product times 0.5 is a float,
    # which no integer matmul kernel writes)
    float_product = is_float_dtype(dtype(a))
    yield reassociates("mm-scale", rule(eq(y).to(E.mul(E.mm(a, b, al), E.scalar(c, "float"))), float_product).then(union(y).with_(E.mm(a, b, al * c))))
    yield reassociates("bmm-scale", rule(eq(y).to(E.mul(E.bmm(a, b, al), E.scalar(c, "float"))), float_product).then(union(y).with_(E.bmm(a, b, al * c))))


@family("algebra")
def algebra_casts_and_masks(x: Tensor, y: Tensor, m: Tensor, a: Tensor, b: Tensor, c: f64,
                            al: f64, k: String, dt: String):
    yield exact("to-dtype-noop", rule(eq(y).to(E.to_dtype(x, dt)), eq(dtype(x)).to(dt)).then(union(y).with_(x)))
    yield exact("div-by-0d-tensor", rule(eq(y).to(E.div(x, E.full(Vec[i64].empty(), c, dt))), eq(dtype(x)).to(dt), is_float_dtype(dt)).then(union(y).with_(E.div(x, E.scalar(c, "float")))))
    yield exact("where-0d-as-scalar", rule(eq(y).to(E.where(m, E.full(Vec[i64].empty(), c, dt), x)), eq(dtype(x)).to(dt), is_float_dtype(dt)).then(union(y).with_(E.where(m, E.scalar(c, "float"), x))))
    neg_inf = E.scalar(f64(float("-inf")), k)
    yield exact("masked-fill-as-bias", rule(eq(y).to(E.where(m, neg_inf, x)), eq(dt).to(dtype(x)), is_float_dtype(dt), eq(dtype(y)).to(dt)).then(union(y).with_(E.add(x, E.where(m, neg_inf, E.full(Vec[i64].empty(), 0.0, dt))))), note="for x never +inf or nan (x + -inf = -inf); makes a mask an additive bias")
    yield reassociates("matmul-scale", rule(eq(y).to(E.mul(E.matmul(a, b, al), E.scalar(c, "float"))), is_float_dtype(dtype(a))).then(union(y).with_(E.matmul(a, b, al * c))))


@family("algebra")
def algebra_normal_forms(x: Tensor, y: Tensor, a: Tensor, b: Tensor, c: f64, al: f64,
                         k: String, d: i64):
    swap = Vec[i64](1, 0)
    yield exact("neg-neg", rewrite(E.neg(E.neg(x))).to(x))
    yield exact("mul-minus-one", rule(eq(y).to(E.mul(x, E.scalar(-1.0, k))), eq(dtype(y)).to(dtype(x)), is_float_dtype(dtype(x))).then(union(y).with_(E.neg(x))))
    yield exact("sub-as-add-neg", rule(eq(y).to(E.sub(a, b)), is_float_dtype(dtype(b))).then(union(y).with_(E.add(a, E.neg(b)))), note="a - b == a + (-b) in IEEE arithmetic (b a float tensor)")
    yield exact("neg-through-view", rewrite(E.neg(E.view(x, var("s", Vec[i64])))).to(E.view(E.neg(x), var("s", Vec[i64]))))
    # (a float product of float operands only: the mul may be what made `a` float)
    float_a = is_float_dtype(dtype(a))
    yield reassociates("scale-left-through-mm", rule(eq(y).to(E.mm(E.mul(a, E.scalar(c, "float")), b, al)), float_a).then(union(y).with_(E.mm(a, b, al * c))))
    yield reassociates("scale-left-through-matmul", rule(eq(y).to(E.matmul(E.mul(a, E.scalar(c, "float")), b, al)), float_a).then(union(y).with_(E.matmul(a, b, al * c))))
    yield reassociates("mm-transpose", rewrite(E.permute(E.mm(a, b, al), swap)).to(E.mm(E.permute(b, swap), E.permute(a, swap), al)), note="(A @ B)^T = B^T @ A^T")
    yield reassociates("softmax-shift", rewrite(E.softmax(E.add(x, E.scalar(c, "float")), d)).to(E.softmax(x, d)), note="softmax is invariant to adding a constant")


@family("algebra-finite")
def algebra_finite(x: Tensor, y: Tensor, s: Vec[i64], dt: String):
    """Identities that hold for finite values only (opt-in: a NaN or inf input would be
    answered wrongly, and nothing in the e-graph proves a value finite)."""
    yield exact("sub-self", rule(eq(y).to(E.sub(x, x)), eq(s).to(shape(x)), eq(dt).to(dtype(x))).then(union(y).with_(E.full(s, 0.0, dt))), note="for finite x: inf - inf is nan")


@family("algebra-ac")
def algebra_ac(a: Tensor, b: Tensor, c: Tensor, al: f64):
    # Opt-in ("all" leaves them out): they grow the e-graph until a saturation limit stops it.
    yield exact("add-commute", rewrite(E.add(a, b)).to(E.add(b, a)))
    yield exact("mul-commute", rewrite(E.mul(a, b)).to(E.mul(b, a)))
    yield reassociates("add-assoc", rewrite(E.add(E.add(a, b), c)).to(E.add(a, E.add(b, c))))
    yield reassociates("mul-assoc", rewrite(E.mul(E.mul(a, b), c)).to(E.mul(a, E.mul(b, c))))
    yield reassociates("mul-distribute", rewrite(E.mul(E.add(a, b), c)).to(E.add(E.mul(a, c), E.mul(b, c))))
    yield reassociates("mm-reassociate", rewrite(E.mm(E.mm(a, b, 1.0), c, 1.0)).to(E.mm(a, E.mm(b, c, 1.0), 1.0)), note="which order is cheaper depends on the shapes: the cost model decides")
