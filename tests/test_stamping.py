"""Repeated layers traced once (eqsat_llm/capture/stamping.py): the IR is the full trace's, node for
node, for plain layers, keyword calls and transformers' layers over the Generator's KV cache;
layers that may differ, read their index or write their own state are traced in full."""

import pytest
import torch
from torch import nn

from eqsat_llm import optimize
from eqsat_llm.capture import capture, stamping
from eqsat_llm.capture.converter import capture_plain
from eqsat_llm.models.workloads import LlamaBlock, stacked_llama_blocks

SMALL = {"d_model": 64, "n_heads": 2, "ffn": 128}
DEPTH = stamping.MIN_LAYERS


def canonical(graph):
    """The live nodes in order, inputs as positions: equal for equal programs."""
    live, index, out = graph.live_ids(), {}, []
    for n in graph.nodes:
        if n.id in live:
            index[n.id] = len(index)
            attrs = sorted((k, repr(v)) for k, v in n.attrs.items() if k not in ("key", "fn"))
            out.append((n.op, tuple(index[i] for i in n.inputs), attrs, str(n.type)))
    return out, [index[o] for o in graph.outputs]


@pytest.mark.parametrize("block", [SMALL, {**SMALL, "n_kv_heads": 1},
                                   {**SMALL, "device": "meta"}], ids=["mha", "gqa", "meta"])
def test_stamped_ir_is_the_full_trace(block):
    model = stacked_llama_blocks(DEPTH, **block)
    x = torch.randn(1, 8, 64, device=block.get("device", "cpu"))
    stamped = capture(model, (x,))
    assert (stamped.stamped_calls, stamped.stamping_fallback) == (DEPTH - 1, None)
    full = capture_plain(model, (x,))
    assert canonical(stamped.graph) == canonical(full.graph)
    assert stamped.aten_op_counts == full.aten_op_counts
    assert stamped.graph.constants.keys() == full.graph.constants.keys()
    assert "forward" not in vars(model.blocks[1])  # the layers' own forward is back


def test_stamped_model_runs_like_eager():
    model, x = stacked_llama_blocks(DEPTH, **SMALL), torch.randn(1, 8, 64)
    compiled = optimize(model, (x,), backend="reference", measure_eager=False)
    assert compiled.captured.stamped_calls == DEPTH - 1
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=0)


def test_same_function_reads_classes_weights_attributes_and_hooks():
    a, b = LlamaBlock(**SMALL, seed=0).eval(), LlamaBlock(**SMALL, seed=1).eval()
    assert stamping.same_function(a, b)  # other weights, same function
    assert not stamping.same_function(a, LlamaBlock(**SMALL, eps=1e-5).eval())
    assert not stamping.same_function(a, LlamaBlock(**{**SMALL, "ffn": 96}).eval())
    b.register_forward_hook(lambda *args: None)
    assert not stamping.same_function(a, b)
    assert not stamping.same_function(a, LlamaBlock(**SMALL).train())
    few = stacked_llama_blocks(DEPTH - 1, **SMALL)
    assert stamping.repeated_layers(few) == []  # a template would cost more than it saves


class ByKeyword(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh())
                                    for _ in range(DEPTH))

    def forward(self, x):
        for layer in self.layers:
            x = layer(input=x)
        return x


class WithNone(nn.Module):
    """A layer returning (output, None), as transformers' layers do without attention weights."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x, scale=1.0):
        return torch.tanh(self.proj(x)) * scale, None


class CallsWithNone(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(WithNone() for _ in range(DEPTH))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, scale=0.5)[0]
        return x


@pytest.mark.parametrize("stack", [ByKeyword, CallsWithNone], ids=["keyword", "result-none"])
def test_keyword_calls_and_results_holding_none_are_stamped(stack):
    torch.manual_seed(0)
    model, x = stack().eval(), torch.randn(2, 16)
    compiled = optimize(model, (x,), backend="reference", measure_eager=False)
    assert compiled.captured.stamped_calls == DEPTH - 1
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=0)


def tiny_llama(layers=DEPTH + 1):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2)).eval()


@pytest.mark.parametrize("tokens", [1, 5], ids=["decode", "prefill"])
def test_transformers_layers_over_the_kv_cache_are_stamped(tokens):
    """Keyword calls, a `layer_idx` per layer, and cache writes inside the layer: the spliced
    calls write their own layer's cache, and the IR is the full trace's."""
    from eqsat_llm.generation.generator import example_inputs
    from eqsat_llm.generation.kv_cache import CachedStep

    model = tiny_llama()
    step, example = CachedStep(model, 1, 16), example_inputs(tokens, 1, 16, False)
    stamped = capture(step, example)
    assert (stamped.stamped_calls, stamped.stamping_fallback) == (DEPTH, None)
    full = capture_plain(step, example)
    assert canonical(stamped.graph) == canonical(full.graph)
    assert stamped.mutations == full.mutations == [("state", n) for n in step.cache_names()]
    assert stamped.aten_op_counts == full.aten_op_counts
    assert all(type(vars(m).get("layer_idx", 0)) is int for m in model.modules())


class IndexedLayer(nn.Module):
    """Layers that differ only in `layer_idx`: one of them reads it as data."""

    def __init__(self, index, branch):
        super().__init__()
        self.proj, self.layer_idx, self.branch = nn.Linear(16, 16), index, branch

    def forward(self, x):
        if self.branch and self.layer_idx % 2:
            return torch.tanh(self.proj(x))
        return torch.relu(self.proj(x))


@pytest.mark.parametrize("branch", [False, True], ids=["index-unread", "index-read"])
def test_a_layer_that_reads_its_index_is_traced_in_full(branch):
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(IndexedLayer(i, branch)) for i in range(DEPTH))).eval()
    x = torch.randn(2, 16)
    compiled = optimize(model, (x,), backend="reference", measure_eager=False)
    if branch:
        assert compiled.captured.stamped_calls == 0
        assert "depends on its index" in compiled.captured.stamping_fallback
    else:
        assert (compiled.captured.stamped_calls, compiled.captured.stamping_fallback) == \
            (DEPTH - 1, None)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=0)


def test_the_layer_index_marker_refuses_every_use():
    index = stamping._INDEX
    for use in (lambda: index % 2, lambda: index == 0, lambda: bool(index), lambda: [1][index],
                lambda: f"{index}", lambda: {index: 0}, lambda: index + 1, lambda: 0 < index):
        with pytest.raises(stamping._LayerIndexUsed):
            use()


class Counting(nn.Module):
    """A layer that writes its own buffer in place: not a pure function of its inputs."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.proj(x))


def test_a_layer_that_writes_state_is_traced_in_full():
    torch.manual_seed(0)
    model = nn.Sequential(*(Counting() for _ in range(DEPTH))).eval()
    x = torch.randn(2, 16)
    compiled = optimize(model, (x,), backend="reference", measure_eager=False)
    assert "writes state" in compiled.captured.stamping_fallback
    with torch.no_grad():
        want = model(x)  # eager writes the buffers once, the program once more
        torch.testing.assert_close(compiled(x), want, atol=1e-5, rtol=0)
    assert all(layer.calls.item() == 2 for layer in model)


class Spectral(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return torch.tanh(self.proj(x)) + torch.fft.rfft(x, dim=-1).abs().mean(-1, keepdim=True)


def test_an_op_in_torch_inside_a_stamped_layer():
    torch.manual_seed(0)
    model, x = nn.Sequential(*(Spectral() for _ in range(DEPTH))).eval(), torch.randn(2, 16)
    with pytest.warns(UserWarning, match="_fft_r2c"):
        compiled = optimize(model, (x,), backend="reference", measure_eager=False)
    assert compiled.captured.stamped_calls == DEPTH - 1
    assert compiled.graph.op_counts()["fallback"] == DEPTH
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=0)
