"""Layout identities: views, permutations and expands that compute nothing.

torch.export's decompositions leave chains of them around every matmul (expand/view before
bmm, view after it, permute of each weight); these rules merge and cancel them.
"""

from egglog import Vec, eq, f64, i64, rewrite, rule, union

from eqsat_llm.egraph.analysis import gather, iota
from eqsat_llm.egraph.language import E, Tensor, shape
from eqsat_llm.rulebook import exact, family


@family("layout")
def layout(x: Tensor, y: Tensor, s: Vec[i64], t: Vec[i64], p: Vec[i64], q: Vec[i64],
           r: Vec[i64], d: i64, e: i64):
    yield exact("view-view", rewrite(E.view(E.view(x, s), t)).to(E.view(x, t)))
    yield exact("view-noop", rule(eq(y).to(E.view(x, s)), eq(shape(x)).to(s)).then(union(y).with_(x)))
    yield exact("expand-noop", rule(eq(y).to(E.expand(x, s)), eq(shape(x)).to(s)).then(union(y).with_(x)))
    yield exact("clone-noop", rewrite(E.clone(x)).to(x))
    yield exact("permute-permute", rule(eq(y).to(E.permute(E.permute(x, p), q)), eq(r).to(gather(p, q))).then(union(y).with_(E.permute(x, r))))
    yield exact("permute-identity", rule(eq(y).to(E.permute(x, p)), eq(p).to(iota(p.length()))).then(union(y).with_(x)))
    yield exact("transpose-as-permute", rule(eq(y).to(E.transpose(x, d, e)), eq(s).to(shape(x)), eq(r).to(iota(s.length()))).then(union(y).with_(E.permute(x, r.set(d, e).set(e, d)))))
    yield exact("unsqueeze-as-view", rule(eq(y).to(E.unsqueeze(x, d)), eq(s).to(shape(y))).then(union(y).with_(E.view(x, s))))


@family("layout")
def layout_matmuls(x: Tensor, y: Tensor, a: Tensor, b: Tensor, w: Tensor, s: Vec[i64],
                   sa: Vec[i64], sb: Vec[i64], ra: Vec[i64], rb: Vec[i64], rw: Vec[i64], al: f64):
    # torch.export spells a 4-D matmul as view -> bmm -> view and x @ W as view -> mm -> view
    yield exact("bmm-as-matmul", rule(eq(y).to(E.view(E.bmm(E.view(a, sa), E.view(b, sb), al), s)), eq(ra).to(shape(a)), eq(rb).to(shape(b)), eq(ra.length()).to(i64(4)), eq(rb.length()).to(i64(4)), eq(ra[0]).to(rb[0]), eq(ra[1]).to(rb[1]), eq(sa).to(Vec[i64](ra[0] * ra[1], ra[2], ra[3])), eq(sb).to(Vec[i64](rb[0] * rb[1], rb[2], rb[3])), eq(s).to(ra.set(i64(3), rb[3]))).then(union(y).with_(E.matmul(a, b, al))))
    yield exact("mm-as-matmul", rule(eq(y).to(E.view(E.mm(E.view(x, sa), w, al), s)), eq(ra).to(shape(x)), eq(ra.length()).to(i64(3)), eq(sa).to(Vec[i64](ra[0] * ra[1], ra[2])), eq(rw).to(shape(w)), eq(s).to(Vec[i64](ra[0], ra[1], rw[1]))).then(union(y).with_(E.matmul(x, w, al))))


@family("layout")
def layout_slices(x: Tensor, d: i64, a: i64, b: i64, c: i64, e: i64):
    yield exact("slice-slice", rewrite(E.slice(E.slice(x, d, a, b, i64(1)), d, c, e, i64(1))).to(E.slice(x, d, a + c, a + e, i64(1))))
