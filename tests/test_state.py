"""Models that mutate their state: buffers written in place (a static KV cache, a step counter,
slice assignment, copy_) and user inputs written in place. The compiled program returns the
model's output, writes the new state into the module's own buffer (or the caller's tensor)
and reads the buffer at run time on every call, so the state carries across calls as in eager."""

import copy
import functools
import warnings

import pytest
import torch
from torch import nn

from eqsat_llm import EqsatError, optimize

BACKENDS = ["c", "reference"]


class IndexCopyCache(nn.Module):
    """The static KV cache pattern: new rows written at `pos`, then the whole cache read."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(6, 4))

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, self.proj(x))
        return torch.softmax(x @ self.cache.t(), dim=-1) @ self.cache * 2.0


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count += 1
        return x * self.count + 1.0


class SliceAssign(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.ones(5, 3))

    def forward(self, x):
        self.buf[1:3] = self.buf[1:3] * 0.5 + x
        return self.buf.sum(0) - x.mean(0)


class CopyInto(nn.Module):
    """An exponential moving average kept in a non-persistent buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("avg", torch.zeros(2, 3), persistent=False)

    def forward(self, x):
        self.avg.copy_(self.avg * 0.9 + x * 0.1)
        return x - self.avg


class ReturnsOldState(nn.Module):
    """The output is the state before the mutation: it must not see the write-back."""

    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(2, 3))

    def forward(self, x):
        old = self.buf.clone()
        self.buf.add_(x)
        return old


class ParameterUpdate(nn.Module):
    """A parameter written in place (an online statistic kept as a frozen parameter)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, x):
        self.scale.mul_(0.5).add_(x[0])
        return x * self.scale


class InputMutation(nn.Module):
    def forward(self, x, acc):
        acc.add_(x * 2.0)
        return acc * x + 1.0


def _inputs(name: str, step: int):
    g = torch.Generator().manual_seed(step)
    if name == "index_copy":
        return torch.randn(1, 4, generator=g), torch.tensor([step])
    return (torch.randn(2, 3, generator=g),)


MODELS = {"index_copy": IndexCopyCache, "counter": Counter, "slice": SliceAssign,
          "copy": CopyInto, "return_old": ReturnsOldState, "parameter": ParameterUpdate}
# the C backend generates these whole (the others have ops it lacks: the reference runs them)
RUN_IN_C = {"counter", "copy", "return_old"}


def _attr(model, name):
    return functools.reduce(getattr, name.split("."), model)


def _optimize(model, inputs, backend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a C backend fallback to the reference is fine here
        return optimize(model, inputs, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MODELS))
def test_buffer_mutation_carries_state_like_eager(name, backend):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    eager = copy.deepcopy(model)
    state = dict(model.named_buffers()) | dict(model.named_parameters())
    compiled = _optimize(model, _inputs(name, 0), backend)
    if name in RUN_IN_C:
        assert compiled.report.backend == backend
    before = dict(eager.named_buffers()) | dict(eager.named_parameters())
    for k, v in state.items():  # optimizing does not run the mutation
        assert _attr(model, k) is v and torch.equal(v, before[k])
    with torch.no_grad():
        for step in range(3):
            inputs = _inputs(name, step)
            got, expected = compiled(*inputs), eager(*inputs)
            assert got.shape == expected.shape
            assert (got - expected).abs().max().item() <= 1e-5, (name, step)
            for k, v in before.items():
                mine = _attr(model, k)
                assert mine is state[k]  # written into the module's own tensor
                assert (mine - v).abs().max().item() <= 1e-5, (name, k, step)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_mutated_buffer_is_read_at_run_time(backend):
    """Reset between calls (as a generation loop does for a new prompt): the program sees it."""
    model = Counter().eval()
    compiled = _optimize(model, (torch.randn(2, 3),), backend)
    assert compiled.report.backend == backend
    x = torch.randn(2, 3)
    with torch.no_grad():
        compiled(x)
        model.count.fill_(10.0)
        assert torch.allclose(compiled(x), x * 11.0 + 1.0)
        assert model.count.item() == 11.0
    assert not any(n.op == "const" and "count" in n.attrs["name"]
                   for n in compiled.graph.nodes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_input_mutation_writes_into_the_callers_tensor(backend):
    model = InputMutation()
    compiled = _optimize(model, (torch.randn(2, 3), torch.zeros(2, 3)), backend)
    assert compiled.report.backend == backend
    mine, theirs = torch.zeros(2, 3), torch.zeros(2, 3)
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(2, 3, generator=torch.Generator().manual_seed(step))
            got, expected = compiled(x, mine), model(x, theirs)
            assert (got - expected).abs().max().item() <= 1e-5
            assert (mine - theirs).abs().max().item() <= 1e-5
    assert mine.abs().sum() > 0


def test_an_unhandled_output_kind_is_refused_at_optimize_time():
    from torch.export.graph_signature import OutputKind

    ep = torch.export.export(Counter(), (torch.randn(2, 3),))
    specs = ep.graph_signature.output_specs
    specs[0].kind = OutputKind.LOSS_OUTPUT
    with pytest.raises(EqsatError, match="LOSS_OUTPUT"):
        optimize(ep, (torch.randn(2, 3),), measure_eager=False)


class StaticKVCache(nn.Module):
    """A decode step's K cache: the new key written at `pos` (index_copy_), attention over it."""

    def __init__(self, slots: int = 512, d: int = 64):
        super().__init__()
        self.k = nn.Linear(d, d, bias=False)
        self.register_buffer("cache", torch.zeros(slots, d))

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, self.k(x))
        return torch.softmax(x @ self.cache.t(), dim=-1) @ self.cache


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kv_cache_write_runs_in_place_without_copying_the_cache(backend):
    """The write lands in the module's buffer itself (no new cache built, none copied back):
    no allocation of the cache's size during a call, and the state matches eager's."""
    from eqsat_llm.codegen.planned import memory_events

    torch.manual_seed(0)
    model = StaticKVCache()
    ref = copy.deepcopy(model)
    x = torch.randn(1, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = optimize(model, (x, torch.tensor([0])), backend=backend)
    assert compiled.report.state_in_place == 1
    buffer = model.cache
    cache_bytes = buffer.numel() * buffer.element_size()
    with torch.no_grad():
        for step in range(4):
            x, pos = torch.randn(1, 64), torch.tensor([step * 7])
            got = []
            events = memory_events(functools.partial(
                lambda out, *a: out.append(compiled(*a)), got, x, pos))
            assert not [b for _, b, _ in events if b >= cache_bytes], "the cache was copied"
            torch.testing.assert_close(got[0], ref(x, pos), atol=1e-5, rtol=1e-5)
            assert model.cache is buffer
            torch.testing.assert_close(model.cache, ref.cache)


class RowWrites(nn.Module):
    """A cache's rows written at run-time positions along dim 2, as index_copy_ or as
    `buf[:, :, pos] = x` (index_put_), then read."""

    def __init__(self, form):
        super().__init__()
        self.form = form
        self.register_buffer("cache", torch.zeros(1, 2, 8, 4))

    def forward(self, x, pos):
        if self.form == "index_copy":
            self.cache.index_copy_(2, pos, x)
        else:
            self.cache[:, :, pos] = x
        return self.cache.sum(-1) * 2.0


@pytest.mark.parametrize("form", ["index_copy", "index_put"])
def test_cache_rows_are_written_in_c_with_positions_checked(form):
    """The in-place row write runs in the C program (no torch step); negative positions count
    from the end as in torch; one out of range raises instead of writing elsewhere."""
    from eqsat_llm.codegen.c.errors import KernelIndexError

    model, ref = RowWrites(form), RowWrites(form)
    x = torch.randn(1, 2, 3, 4)
    compiled = optimize(model, (x, torch.tensor([0, 1, 2])), backend="c", measure_eager=False)
    assert compiled.report.state_in_place == 1 and compiled.report.torch_ops == {}
    with torch.no_grad():
        for pos in ([5, 6, 7], [-1, 0, -8] if form == "index_put" else [3, 0, 1]):
            x = torch.randn(1, 2, 3, 4)
            pos = torch.tensor(pos)
            torch.testing.assert_close(compiled(x, pos), ref(x, pos))
            torch.testing.assert_close(model.cache, ref.cache)
        with pytest.raises(KernelIndexError):
            compiled(x, torch.tensor([0, 8, 1]))
