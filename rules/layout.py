"""Layout identities: views, permutations and expands that compute nothing.

torch.export's decompositions leave chains of them around every matmul (expand/view before
bmm, view after it, permute of each weight); these rules merge and cancel them.
"""

from egglog import Vec, eq, i64, rewrite, rule, union

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
