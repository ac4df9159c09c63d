"""Planted wrong rules for the rule checker's tests (tests/test_rulecheck.py).

Load this file only with `eqsat_llm.rulecheck.load_rules_from(path)`, which keeps its family out
of the library's registry: importing it as a module would register these rules under "all".
"""

from egglog import String, Vec, eq, f64, i64, rewrite

from eqsat_llm.egraph.analysis import is_const, two_four
from eqsat_llm.egraph.language import E, Tensor, shape
from eqsat_llm.rulebook import exact, family, guarded
from eqsat_llm.rules.fusion import NONE
from eqsat_llm.rules.sparsity import pruned


@family("wrong")
def wrong(x: Tensor, a: Tensor, b: Tensor, al: f64, s: Vec[i64], k: String):
    t = Vec[i64](1, 0)
    # (AB)^T = A^T B^T: ill-typed unless A and B are square, wrong when they are
    yield exact("bad-transpose", rewrite(E.permute(E.mm(a, b, al), t))
                .to(E.mm(E.permute(a, t), E.permute(b, t), al)))
    # the sides disagree in shape: keepdim dropped
    yield exact("bad-keepdim", rewrite(E.sum(x, s, i64(1))).to(E.sum(x, s, i64(0))))
    # numerically wrong: 2x = 3x
    yield exact("bad-triple", rewrite(E.mul(x, E.scalar(2.0, k))).to(E.add(E.add(x, x), x)))
    # numerically wrong union: exp(x) = x
    yield exact("bad-union", guarded(E.exp(x), x))
    # no instance type-checks: a permutation with a repeated dim
    yield exact("uninstantiable", rewrite(E.permute(x, Vec[i64](0, 0))).to(x))
    # instances type-check but the condition never holds: no dim is 7
    yield exact("never-fires", guarded(E.view(x, s), x, eq(s).to(Vec[i64](7, 7))))


def _stored(x: Tensor, w: Tensor, aux: Tensor, al: f64, n: i64, fmt: str) -> Tensor:
    """A plain GEMM x @ w on a weight stored as `fmt` (w, aux)."""
    none = String("none")
    return E.gemm(x, w, aux, NONE, NONE, n, al, 1.0, 0.0, none, String(fmt), none, none)


@family("wrong")
def wrong_sparsity(x: Tensor, w: Tensor, al: f64, sw: Vec[i64]):
    # 2:4 read along the wrong dim (N instead of K): the packing meets groups of K with more
    # than two non-zeros
    vals, index = E.sparse_values(w, "sparse24", i64(0)), E.sparse_index(w, "sparse24", i64(0))
    sparse = _stored(x, vals, index, al, sw[1], "sparse24")
    yield exact("bad-sparse-dim",
                guarded(E.matmul(x, w, al), sparse, is_const(w), eq(sw).to(shape(w)),
                        eq(sw.length()).to(i64(2)), two_four(w, i64(1))),
                check_dims=(16, 32), check_weights=pruned)


@family("wrong")
def wrong_half(x: Tensor, w: Tensor, al: f64, sw: Vec[i64]):
    # a float32 weight stored as float16 without knowing its values fit: rounded, not exact
    half = _stored(x, E.to_dtype(w, "float16"), NONE, al, sw[1], "fp16")
    yield exact("bad-half", guarded(E.matmul(x, w, al), half, is_const(w), eq(sw).to(shape(w)),
                                    eq(sw.length()).to(i64(2))))
