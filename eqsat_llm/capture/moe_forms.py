"""The expert GEMMs transformers emits, recognised in the exported graph and rewritten as the
registry's `expert_mm` (a torch.fx pass: graph in, graph out, run before conversion).

transformers' default MoE experts (`grouped_mm`, transformers.integrations.moe) sort the
token-expert pairs by expert so that each expert's rows are contiguous:

    ids = top_k_index.view(-1); ids_g, perm = sort(ids)        # S = tokens x top_k pairs
    x_g = hidden[perm // top_k]; w_g = top_k_weights.view(-1)[perm]
    offs = cumsum(histc(ids_g.float(), E, 0, E - 1))
    h = gate(grouped_mm(x_g, W1, offs))   ...   y = grouped_mm(h, W2, offs) * w_g[:, None]
    out = y[inverse(perm)].view(T, top_k, H).sum(1)

`grouped_mm(x_g, W, offs)` with offsets from the sorted ids is `expert_mm(x_g, W, ids_g)`,
exactly. Everything between the sort and the inverse permutation then works row by row (row s
depends on row s of its operands only), and a row-wise function commutes with a permutation:
F(P rows) taken back through P's inverse is F(rows). So the permutation is dropped: `perm`
becomes the identity, `ids_g` the unsorted ids, `hidden[perm // top_k]` each token's row
repeated top_k times, and the inverse permutation's gather disappears with the sort, the histc
and the cumsum (nothing of them is left to run in torch).

The rewrite is made only when every node between the sort and the inverse permutation is of a
kind known to work row by row (`_row_wise`: `_ELEMENTWISE` ops whose operands from outside the
region broadcast along the rows, `_DIM_OPS` along dims other than the rows), and when the
offsets count the sorted ids per expert of the grouped GEMM's weight; a block that does
anything else is left as captured, and its sort, histc and grouped GEMMs run in torch as
before (named by the FallbackWarning): never a wrong answer. The `batched_mm` form (each row
times `W[ids[s]]` gathered whole) is rewritten too.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterable, Iterator

import torch
from torch.fx import Graph, Node

aten = torch.ops.aten


@torch.library.custom_op("eqsat_llm::expert_mm", mutates_args=())
def expert_mm(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """out[s] = x[s] @ w[ids[s]] (x [S, K], w [E, K, N], ids [S]): the op the rewritten
    graph calls (the frontend converts it to the registry's `expert_mm`)."""
    from ..ops.experts import expert_mm as reference

    return reference(x, w, ids)


@expert_mm.register_fake
def _(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[2])


@contextlib.contextmanager
def experts_for_capture(model: object = None) -> Iterator[None]:
    """transformers' experts as the frontend can capture them, around torch.export and the
    cache-shape probe:

    - **on meta weights** (a model planned on its meta twin): transformers' dispatcher picks
      torch's grouped_mm wherever torch has one, and torch's meta kernel takes bf16 only, so
      a float32 model on the meta device fails. A meta weight takes transformers' own
      fallback instead (a custom op with a shape function; recognised here as grouped_mm is);
      every other call is dispatched as before.
    - **the eager loop** (`config._experts_implementation == "eager"`: a Python loop over the
      experts hit, which torch.export cannot follow): each of `model`'s experts modules set
      so runs transformers' own grouped_mm implementation of the same module (its switch,
      read per call), the same products row by row, which the frontend rewrites to
      expert_mm. Families that write their own loops (DBRX, JetMoE) are not touched."""
    try:
        from transformers.integrations import moe
    except ImportError:
        moe = None
    chooses = getattr(moe, "_can_use_grouped_mm", None)
    if chooses is not None:
        moe._can_use_grouped_mm = lambda x, w, offs: w.device.type != "meta" and \
            chooses(x, w, offs)
    looping = [m.config for m in (model.modules() if isinstance(model, torch.nn.Module)
                                  else ())
               if hasattr(m, "_is_expert_parallel")  # (use_experts_implementation's mark)
               and getattr(getattr(m, "config", None), "_experts_implementation", None) ==
               "eager"]
    for config in looping:
        config._experts_implementation = "grouped_mm"
    try:
        yield
    finally:
        for config in looping:
            config._experts_implementation = "eager"
        if chooses is not None:
            moe._can_use_grouped_mm = chooses


def _grouped_mm() -> frozenset:
    """The grouped GEMMs of transformers' experts: its own fallback, torch's kernel (looked up
    when a graph is read: transformers defines its op when it is imported)."""
    packets = (getattr(getattr(torch.ops, "transformers", None), "grouped_mm_fallback", None),
               getattr(aten, "_grouped_mm", None))
    return frozenset(p.default for p in packets if p is not None)


# ops that work row by row along dim 0 when every operand from outside the region broadcasts
# along it (elementwise), or when they leave dim 0 alone (dims > 0)
_ELEMENTWISE = {aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor,
                aten.sigmoid.default, aten.silu.default, aten.gelu.default, aten.relu.default,
                aten.tanh.default, aten.neg.default, aten.exp.default, aten.clamp.default,
                aten.minimum.default, aten.maximum.default, aten.pow.Tensor_Scalar,
                aten.rsqrt.default, aten._to_copy.default, aten.where.self,
                aten.mul.Scalar, aten.add.Scalar, aten.clone.default}
_DIM_OPS = {aten.split_with_sizes.default: 2, aten.split.Tensor: 2, aten.slice.Tensor: 1,
            aten.unsqueeze.default: 1, aten.sum.dim_IntList: 1, aten.mean.dim: 1,
            aten.amax.default: 1}
_IGNORED = {aten._assert_tensor_metadata.default}


def _val(n: object) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _is(n: object, *targets: object) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and n.target in targets


def recognise_experts(graph: Graph) -> int:
    """Rewrite every recognised MoE experts block of the graph in place; the number rewritten."""
    done = 0
    for sort in [n for n in graph.nodes if _is(n, aten.sort.default)]:
        if _rewrite_sorted_block(graph, sort):
            done += 1
    for gather in [n for n in graph.nodes if _is(n, aten.index.Tensor)]:
        if _rewrite_batched(graph, gather):
            done += 1
    if done:
        graph.eliminate_dead_code()
        graph.lint()
    return done


def _getitems(n: Node) -> dict[int, Node]:
    return {u.args[1]: u for u in n.users if u.target is operator.getitem}


def _rewrite_sorted_block(graph: Graph, sort: Node) -> bool:
    """The grouped_mm form around one sort, rewritten without the sort; False (the graph
    untouched) where any part is not the form."""
    if len(sort.args) != 1 or sort.kwargs:  # sort(ids): ascending, along the last dim
        return False
    ids = sort.args[0]
    items = _getitems(sort)
    if set(items) != {0, 1} or len(sort.users) != 2 or _val(ids) is None or _val(ids).dim() != 1:
        return False
    ids_g, perm = items[0], items[1]
    S = _val(ids).shape[0]
    plan = _Plan(ids, ids_g, perm, S)
    if not plan.read(graph):
        return False
    plan.apply(graph)
    return True


class _Plan:
    """What the rewrite of one sorted block replaces: found by `read`, done by `apply`."""

    def __init__(self, ids: Node, ids_g: Node, perm: Node, rows: int):
        self.ids, self.ids_g, self.perm, self.rows = ids, ids_g, perm, rows
        self.repeats: list[tuple[Node, Node, int]] = []  # (hidden[perm // k], hidden, k)
        self.gathers: list[Node] = []  # v[perm]: v
        self.gemms: list[Node] = []  # grouped_mm(x, W, offs): expert_mm(x, W, ids)
        self.unsorts: list[Node] = []  # y[inverse(perm)]: y
        self.offsets: set[Node] = set()  # the histc / cumsum chain the grouped GEMMs read

    def read(self, graph: Graph) -> bool:
        for u in self.ids_g.users:  # the offsets first: the grouped GEMMs read them
            if _is(u, aten._to_copy.default) and not self._offsets(u):
                return False
        region: set[Node] = {self.ids_g, self.perm}
        stack = [self.ids_g, self.perm]
        pending: dict[Node, Node] = {}  # users that may read a region node not yet reached
        while stack:
            n = stack.pop()
            for u in list(n.users):
                if u in region or u.target in _IGNORED or u in self.unsorts or \
                        u in self.offsets:
                    continue
                entered = self._classify(u, n, region)
                if entered is None:
                    pending[u] = n
                    continue
                pending.pop(u, None)
                region.update(entered)
                stack.extend(entered)
            if not stack:  # retried once the region has grown
                for u, n in list(pending.items()):
                    if u not in region and (entered := self._classify(u, n, region)):
                        del pending[u]
                        region.update(entered)
                        stack.extend(entered)
        if any(u not in region for u in pending):
            return False
        # what is gathered back into the pairs' order was computed in the sorted one; the
        # offsets feed the grouped GEMMs only
        return bool(self.gemms) and bool(self.unsorts) and \
            all(g.args[0] in region for g in self.unsorts) and all(
                all(u in self.offsets or u in self.gemms or u.target in _IGNORED
                    for u in o.users) for o in self.offsets)

    def _classify(self, u: Node, n: Node, region: set[Node]) -> list[Node] | None:
        """The user `u` of region node `n`: the nodes it brings into the region (results
        in the sorted order, computed row by row), [] for a form this rewrite replaces whose
        result leaves it, or None (not the form: no rewrite)."""
        if n is self.perm:
            if _is(u, aten.div.Tensor_mode) and u.kwargs.get("rounding_mode") == "floor" and \
                    isinstance(u.args[1], int) and u.args[1] > 0 and self.rows % u.args[1] == 0:
                k, rows = u.args[1], list(u.users)
                for g in rows:  # hidden[perm // k]: each token's row, k times
                    hidden = g.args[0] if _is(g, aten.index.Tensor) else None
                    if hidden is None or list(g.args[1]) != [u] or hidden in region or \
                            _val(hidden) is None or _val(hidden).shape[0] * k != self.rows:
                        return None
                    self.repeats.append((g, hidden, k))
                return rows
            if _is(u, aten.index.Tensor) and list(u.args[1]) == [n] and \
                    u.args[0] not in region and _val(u.args[0]) is not None and \
                    _val(u.args[0]).shape[0] == self.rows:  # v[perm]: v in the sorted order
                self.gathers.append(u)
                return [u]
            if _is(u, aten.index_put.default) and list(u.args[1]) == [n] and \
                    _counts_up(u.args[2], self.rows):
                for g in u.users:  # y[inverse(perm)]: back in the order of the pairs
                    if not (_is(g, aten.index.Tensor) and list(g.args[1]) == [u]) or \
                            g.args[0] is u:
                        return None
                    self.unsorts.append(g)
                return []
            return None
        if _is(u, *_grouped_mm()):
            x, w, offs = u.args
            if x is not n or offs not in self.offsets or not self._counts_experts(w):
                return None
            self.gemms.append(u)
            return [u]
        if _is(u, aten.index.Tensor) and n is self.ids_g and list(u.args[1]) == [n] and \
                u.args[0] not in region:  # a per-expert bias gathered per row
            return [u]
        return [u] if _row_wise(u, region) else None

    def _offsets(self, to_float: Node) -> bool:
        hist = list(to_float.users)
        if len(hist) != 1 or not _is(hist[0], aten.histc.default):
            return False
        sums = list(hist[0].users)
        if len(sums) != 1 or not _is(sums[0], aten.cumsum.default):
            return False
        self.offsets |= {to_float, hist[0], sums[0]}
        return True

    def _counts_experts(self, w: Node) -> bool:
        """Whether the offsets count the sorted ids per expert of `w` [E, ...]: histc with E
        bins over [0, E - 1], summed up along its one dim."""
        wv = _val(w)
        hist = next((o for o in self.offsets if _is(o, aten.histc.default)), None)
        total = next((o for o in self.offsets if _is(o, aten.cumsum.default)), None)
        if wv is None or hist is None or total is None:
            return False
        experts = wv.shape[0]
        bins = (list(hist.args[1:4]) + [None] * 3)[:3]
        return bins == [experts, 0, experts - 1] and total.args[1] in (0, -1)

    def apply(self, graph: Graph) -> None:
        for g, hidden, k in self.repeats:
            with graph.inserting_before(g):
                rows = _repeat_rows(graph, hidden, k)
            g.replace_all_uses_with(rows)
        for g in self.gathers:
            g.replace_all_uses_with(g.args[0])
        for g in self.unsorts:
            g.replace_all_uses_with(g.args[0])
        for mm in self.gemms:
            x, w, _ = mm.args
            with graph.inserting_before(mm):
                new = graph.call_function(torch.ops.eqsat_llm.expert_mm.default,
                                          (x, w, self.ids))
            new.meta["val"] = mm.meta["val"]
            mm.replace_all_uses_with(new)
        self.ids_g.replace_all_uses_with(self.ids)


def _counts_up(n: object, rows: int) -> bool:
    """Whether `n` is 0, 1, ..., rows - 1: an arange of them, maybe reshaped (one pair: a
    0-d view of arange(1))."""
    while _is(n, aten.view.default, aten.reshape.default, aten._unsafe_view.default):
        n = n.args[0]
    if _is(n, aten.arange.default):
        return len(n.args) == 1 and n.args[0] == rows
    return _is(n, aten.arange.start_step) and list(n.args[:2]) == [0, rows] and \
        (len(n.args) < 3 or n.args[2] == 1)


def _row_wise(u: Node, region: set[Node]) -> bool:
    """Whether `u` computes row s of its result from row s of its region operands alone."""
    out = _val(u)
    if u.target is operator.getitem:
        return True  # a piece of a split along dims > 0 (checked at the split)
    if u.target in _DIM_OPS:
        dims = u.args[_DIM_OPS[u.target]] if len(u.args) > _DIM_OPS[u.target] else 0
        rank = _val(u.args[0]).dim() if _val(u.args[0]) is not None else 0
        dims = dims if isinstance(dims, (list, tuple)) else [dims]
        if u.target is aten.unsqueeze.default:
            rank += 1
        return rank > 0 and all(d % rank != 0 for d in dims) and all(
            a not in region for a in _tensor_args(u.args[1:]))
    if u.target in _ELEMENTWISE:
        if out is None or out.dim() == 0:
            return False
        for a in _tensor_args(u.args):
            v = _val(a)
            if a in region:
                if v is None or v.dim() != out.dim() or v.shape[0] != out.shape[0]:
                    return False
            elif v is not None and v.dim() == out.dim() and v.shape[0] != 1:
                return False  # an outside operand with rows of its own: not row-wise
        return True
    return False


def _tensor_args(args: Iterable[object]) -> list[Node]:
    found: list[Node] = []
    for a in args:
        if isinstance(a, Node):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found += _tensor_args(a)
    return found


def _repeat_rows(graph: Graph, hidden: Node, k: int) -> Node:
    """hidden [T, ...] with each row repeated k times ([T * k, ...]), as view ops."""
    v = _val(hidden)
    assert v is not None
    shape = list(v.shape)
    meta = [torch.empty(s, dtype=v.dtype, device="meta") for s in (
        [shape[0], 1, *shape[1:]], [shape[0], k, *shape[1:]], [shape[0] * k, *shape[1:]])]
    steps = [(aten.unsqueeze.default, (1,)), (aten.expand.default, ([shape[0], k, *shape[1:]],)),
             (aten.clone.default, ()), (aten.view.default, ([shape[0] * k, *shape[1:]],))]
    node = hidden
    for (target, rest), m in zip(steps, [meta[0], meta[1], meta[1], meta[2]]):
        node = graph.call_function(target, (node, *rest))
        node.meta["val"] = m
    return node


def _rewrite_batched(graph: Graph, gather: Node) -> bool:
    """The batched_mm form: bmm(W[ids], x.unsqueeze(-1)).squeeze(-1), W [E, N, K] a weight
    (not transposed), as expert_mm(x, W^T, ids). False where it is not that form."""
    if len(gather.args[1]) != 1 or not isinstance(gather.args[0], Node) or \
            gather.args[0].op != "placeholder":
        return False
    w, ids = gather.args[0], gather.args[1][0]
    wv, iv = _val(w), _val(ids)
    if wv is None or iv is None or wv.dim() != 3 or iv.dim() != 1 or len(gather.users) != 1:
        return False
    bmm = next(iter(gather.users))
    if not _is(bmm, aten.bmm.default) or bmm.args[0] is not gather or \
            not _is(bmm.args[1], aten.unsqueeze.default) or bmm.args[1].args[1] not in (-1, 2):
        return False
    x = bmm.args[1].args[0]
    squeezes = list(bmm.users)
    shaped = (aten.squeeze.dim, aten.squeeze.dims, aten.view.default)
    if not all(_is(s, *shaped) for s in squeezes) or \
            any(list(_val(s).shape) != [iv.shape[0], wv.shape[1]] for s in squeezes):
        return False
    with graph.inserting_before(bmm):
        wt = graph.call_function(aten.permute.default, (w, [0, 2, 1]))
        wt.meta["val"] = torch.empty(wv.shape[0], wv.shape[2], wv.shape[1], dtype=wv.dtype,
                                     device="meta")
        new = graph.call_function(torch.ops.eqsat_llm.expert_mm.default, (x, wt, ids))
        new.meta["val"] = torch.empty(iv.shape[0], wv.shape[1], dtype=wv.dtype, device="meta")
    for s in squeezes:
        s.replace_all_uses_with(new)
    return True
