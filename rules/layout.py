"""Layout identities: views, permutations and expands that compute nothing.

torch.export's decompositions leave chains of them around every matmul (expand/view before
bmm, view after it, permute of each weight); these rules merge and cancel them.
"""

from egglog import Vec, eq, f64, i64, rewrite, var

from eqsat_llm.egraph.analysis import iota, is_const, vec_gather
from eqsat_llm.egraph.language import E, Tensor, shape
from eqsat_llm.rulebook import exact, family, guarded


@family("layout")
def layout(x: Tensor, y: Tensor, s: Vec[i64], t: Vec[i64], p: Vec[i64], q: Vec[i64],
           r: Vec[i64], d: i64, e: i64):
    yield exact("view-view", rewrite(E.view(E.view(x, s), t)).to(E.view(x, t)))
    yield exact("view-noop", guarded(E.view(x, s), x, eq(shape(x)).to(s)))
    yield exact("expand-noop", guarded(E.expand(x, s), x, eq(shape(x)).to(s)))
    yield exact("clone-noop", rewrite(E.clone(x)).to(x))
    yield exact("permute-permute",
                guarded(E.permute(E.permute(x, p), q), E.permute(x, r), eq(r).to(vec_gather(p, q))))
    yield exact("permute-identity", guarded(E.permute(x, p), x, eq(p).to(iota(p.length()))))
    yield exact("transpose-as-permute",
                guarded(E.transpose(x, d, e), E.permute(x, r.set(d, e).set(e, d)),
                        eq(s).to(shape(x)), eq(r).to(iota(s.length()))))
    yield exact("unsqueeze-as-view", guarded(E.unsqueeze(x, d), E.view(x, s), eq(s).to(shape(y))))
    # keys split into heads and transposed in one permute (OpenAI-GPT's split_heads(k=True)):
    # heads-first, then the last two dims swapped, the k^T that attention's pattern reads
    yield exact("permute-as-heads-then-transpose",
                rewrite(E.permute(x, Vec[i64](0, 2, 3, 1)))
                .to(E.permute(E.permute(x, Vec[i64](0, 2, 1, 3)), Vec[i64](0, 1, 3, 2))))


@family("layout")
def layout_matmuls(x: Tensor, a: Tensor, b: Tensor, w: Tensor, s: Vec[i64],
                   sa: Vec[i64], sb: Vec[i64], ra: Vec[i64], rb: Vec[i64], rw: Vec[i64], al: f64):
    # torch.export spells a 4-D matmul as view -> bmm -> view and x @ W as view -> mm -> view
    # (ra, rb, rw: the 4-D or 3-D operands' shapes; sa, sb: the views that merge their
    # leading dims; s: the product's shape)
    bmm = E.view(E.bmm(E.view(a, sa), E.view(b, sb), al), s)
    yield exact("bmm-as-matmul",
                guarded(bmm, E.matmul(a, b, al),
                        eq(ra).to(shape(a)), eq(rb).to(shape(b)),
                        eq(ra.length()).to(i64(4)), eq(rb.length()).to(i64(4)),
                        eq(ra[0]).to(rb[0]), eq(ra[1]).to(rb[1]),
                        eq(sa).to(Vec[i64](ra[0] * ra[1], ra[2], ra[3])),
                        eq(sb).to(Vec[i64](rb[0] * rb[1], rb[2], rb[3])),
                        eq(s).to(ra.set(i64(3), rb[3]))))
    # BLOOM's ALiBi (alibi.baddbmm(q, k^T) on heads merged into the batch, viewed back to 4-D):
    # k^T of merged heads is the merged k^T of each head, and a constant bias added before
    # the view is the viewed bias, so the product is the 4-D matmul bmm-as-matmul finds
    yield exact("merged-heads-transpose",
                guarded(E.permute(E.view(a, sa), Vec[i64](0, 2, 1)),
                        E.view(E.permute(a, Vec[i64](0, 1, 3, 2)), sb),
                        eq(ra).to(shape(a)), eq(ra.length()).to(i64(4)),
                        eq(sa).to(Vec[i64](ra[0] * ra[1], ra[2], ra[3])),
                        eq(sb).to(Vec[i64](ra[0] * ra[1], ra[3], ra[2]))))
    yield exact("view-through-constant-add",
                guarded(E.view(E.add(w, x), s), E.add(E.view(E.expand(w, ra), s), E.view(x, s)),
                        is_const(w), eq(ra).to(shape(x)), eq(ra).to(shape(E.add(w, x)))))
    # BART-style eager attention (softmax on [B*H, S, T]): a softmax over the last dim is row by
    # row, and a view that keeps the last dim keeps the rows
    d = var("d", i64)
    yield exact("softmax-through-view",
                guarded(E.softmax(E.view(x, s), d), E.view(E.softmax(x, ra.length() - 1), s),
                        eq(ra).to(shape(x)), eq(d).to(s.length() - 1),
                        eq(s[s.length() - 1]).to(ra[ra.length() - 1])))
    mm = E.view(E.mm(E.view(x, sa), w, al), s)
    yield exact("mm-as-matmul",
                guarded(mm, E.matmul(x, w, al),
                        eq(ra).to(shape(x)), eq(ra.length()).to(i64(3)),
                        eq(sa).to(Vec[i64](ra[0] * ra[1], ra[2])), eq(rw).to(shape(w)),
                        eq(s).to(Vec[i64](ra[0], ra[1], rw[1]))))


@family("layout")
def layout_slices(x: Tensor, d: i64, a: i64, b: i64, c: i64, e: i64):
    yield exact("slice-slice", rewrite(E.slice(E.slice(x, d, a, b, i64(1)), d, c, e, i64(1)))
                .to(E.slice(x, d, a + c, a + e, i64(1))))
