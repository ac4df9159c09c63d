"""Text generation: tokens/s of transformers, ONNX Runtime and eqsat-llm, greedy, in one run.

    .venv/bin/python benchmarks/generate.py [--models small,tinyllama|mixtral_large] [--batch 1,4]
        [--prompt 128] [--new 128] [--layers N] [--rounds 3] [--systems ...] [--quick] [--write]

Per model and batch size, one group: every system generates `new` tokens after a `prompt`-token
random prompt (greedy, no eos), its tokens are compared with eager's, then the systems are timed
in interleaved rounds (order rotated each round). Systems:

- eager: `model.generate(ids, max_new_tokens=K, do_sample=False, attention_mask=ones)`, the
  default dynamic cache;
- static + compile: transformers' documented recipe, `model.forward = torch.compile(
  model.forward, fullgraph=True)` (default mode: reduce-overhead is CUDA graphs) and
  `generate(..., cache_implementation="static")`; warm-up (the compiles) timed apart;
- ONNX Runtime: one step exported with the dynamo exporter, the KV cache as inputs and outputs
  (dynamic batch, step and past lengths; present = past + new, as transformers' DynamicCache and
  optimum's decoder-with-past export), prefill = that graph with an empty past, then a greedy
  loop in Python; export and session time apart;
- eqsat-llm: `eqsat_llm.Generator(model, max_seq_len=prompt + new, batch_size=B)` then
  `gen.generate(ids, max_new_tokens=K)`; compile time apart.

Models: the LLaMA-style "small" config of eqsat_llm.models.model_matrix and the
TinyLlama-1.1B-shaped LLaMA (model_matrix.tinyllama, as benchmarks/models.py: 4 of 22 layers unless
--layers), random weights, fp32; `--models mixtral_large` (a run and a RESULTS section of its
own, as `--models mixtral`, the model matrix's medium Mixtral): model_matrix.MIXTRAL_LARGE, a
Mixtral whose experts dominate its bytes. For TinyLlama and
that Mixtral the decode bound is the weight bytes one step reads (models.weight_work: for the
Mixtral at batch 1, top-k of its experts) over the read bandwidth (models.measure_rates, at the
start and the end, the faster kept). BLAS and thread pools loaded: compare_cpu.blas_info
(threadpoolctl).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import io
import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the network

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_cpu import (
    SETTLE_S,
    add_write_options,
    blas_info,
    busy_cpu_s,
    ort_runner,
    others_cpu,
    settle,
    short,
    wait_for_load,
)
from models import (
    Rates,
    batched_experts,
    batched_refusal,
    best_rates,
    measure_rates,
    root_cause,
    weight_work,
)
from optimize_time import write_section

import eqsat_llm
from eqsat_llm.models import model_matrix

SECTION = "## Text generation (benchmarks/generate.py)"
SYSTEMS = ("eager", "static", "ort", "ort-int8", "eqsat", "eqsat-int8", "eqsat-int4")
DEFAULT_SYSTEMS = ("eager", "static", "ort", "eqsat")  # --systems all: the quantized ones too
LABEL = {"eager": "transformers eager", "static": "transformers static + compile",
         "ort": "ONNX Runtime", "ort-int8": "ONNX Runtime int8 (quantize_dynamic)",
         "eqsat": "eqsat-llm", "eqsat-int8": "eqsat-llm int8", "eqsat-int4": "eqsat-llm int4"}
MODELS = ("small", "tinyllama", "mixtral", "mixtral_large")
MOE_MODELS = ("mixtral", "mixtral_large")  # a run of their own: its own RESULTS section
QUICK = {"prompt": 16, "new": 8}
ROUND_S = 0.5  # short generate calls are repeated within a round up to about this long
LONG_CALL_S = 1.0  # above this, a sleep settles the previous system's threads, not a call
SMALL_TARGET = 3.0  # eqsat-llm tokens/s over eager's, small model
BOUND_TARGET = 1.10  # eqsat-llm decode step over the weight-bytes bound, TinyLlama
# models whose decode step is bounded by its weight bytes (the MoE one: its chosen experts')
BOUNDED = ("tinyllama", "mixtral_large")


# ---------------------------------------------------------------- models and prompts

@dataclass
class Model:
    name: str
    lm: nn.Module  # the transformers causal LM
    ids: torch.Tensor  # prompts of the largest batch (rows sliced per group)


def build_model(name: str, args: argparse.Namespace) -> Model:
    """The causal LM with its cache switched on (the builders switch it off for export), eos
    switched off in its generation_config, which every system follows (random weights would
    stop rows early): every system makes exactly `new` tokens per row."""
    matrix = {"small": ("llama", "small"), "mixtral": ("mixtral", "medium")}  # (4 experts)
    if name in matrix:
        family, size = matrix[name]
        wrapped, (ids,) = model_matrix.build(family, seq=args.prompt, size=size,
                                             batch=max(args.batch))
        lm = wrapped.model
    else:
        # benchmarks/models.py's models: the large Mixtral, or TinyLlama with --layers of 22
        lm = model_matrix.mixtral_large() if name == "mixtral_large" else \
            model_matrix.tinyllama(args.layers, quick=args.quick)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(3, lm.config.vocab_size - 1, (max(args.batch), args.prompt),
                            generator=gen)
        if name == "tinyllama":
            name = (f"tinyllama ({lm.config.num_hidden_layers} layers"
                    f"{', quick: scaled down' if args.quick else ''})")
    lm.eval()
    lm.config.use_cache = lm.generation_config.use_cache = True
    lm.generation_config.eos_token_id = None
    lm.generation_config.pad_token_id = 0  # unused without eos; silences generate's warning
    return Model(name, lm, ids)


# ---------------------------------------------------------------- systems

@dataclass
class Sample:
    tokens: torch.Tensor  # [B, prompt + new]
    prefill_s: float  # until the first new token exists
    total_s: float  # the whole generate call


@dataclass
class System:
    name: str
    run: Callable[[], Sample] | None = None
    setup_s: float | None = None  # compile / export (eager: none)
    warmup_compiles: bool = False  # the warm-up call compiles: it is the setup time
    setup_note: str = ""
    error: str | None = None
    note: str = ""
    match: bool | None = None
    match_text: str = "-"
    samples: list[Sample] = field(default_factory=list)

    def median(self, key: Callable[[Sample], float]) -> float:
        return statistics.median(key(s) for s in self.samples)


def timed(fn: Callable[[], tuple[torch.Tensor, float]]) -> Sample:
    """Runs fn (which returns the tokens and the time its first token appeared) and times it."""
    t0 = time.perf_counter()
    tokens, first = fn()
    return Sample(tokens, first - t0, time.perf_counter() - t0)


def _first_token_clock():
    from transformers import StoppingCriteria

    class FirstTokenClock(StoppingCriteria):
        """Notes when generate first asks whether to stop: right after the first new token
        (prefill forward, argmax). Never stops."""

        def __init__(self) -> None:
            self.at = 0.0

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kw: Any) -> torch.Tensor:
            if not self.at:
                self.at = time.perf_counter()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    return FirstTokenClock()


def hf_generate(lm: nn.Module, ids: torch.Tensor, new: int, **kw: Any
                ) -> tuple[torch.Tensor, float]:
    from transformers import StoppingCriteriaList

    clock = _first_token_clock()
    with torch.no_grad():
        out = lm.generate(ids, max_new_tokens=new, do_sample=False,
                          attention_mask=torch.ones_like(ids),
                          stopping_criteria=StoppingCriteriaList([clock]), **kw)
    return out, clock.at


def make_eager(lm: nn.Module, ids: torch.Tensor, new: int) -> System:
    return System("eager", lambda: timed(lambda: hf_generate(lm, ids, new)))


def make_static(lm: nn.Module, ids: torch.Tensor, new: int) -> System:
    """The compiled forward is installed on the model only during its own calls, so the other
    systems keep running the model eagerly."""
    s = System("static", warmup_compiles=True)
    torch._dynamo.reset()  # a fresh compile per group: static shapes, compile time counted
    compiled = torch.compile(lm.forward, fullgraph=True)

    def call() -> tuple[torch.Tensor, float]:
        lm.forward = compiled
        try:
            return hf_generate(lm, ids, new, cache_implementation="static")
        finally:
            del lm.forward  # back to the class's forward

    s.run = lambda: timed(call)
    return s


def make_eqsat(lm: nn.Module, ids: torch.Tensor, new: int, quantize: str | None = None
               ) -> System:
    s = System("eqsat" + (f"-{quantize}" if quantize else ""))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gen = eqsat_llm.Generator(lm, max_seq_len=ids.shape[1] + new, batch_size=ids.shape[0],
                                  quantize=quantize)
    s.setup_s = gen.report.compile_seconds
    # the background move of its prepared weights onto 2 MiB pages (C runtime: quantized and
    # half ones) finished before timing, as benchmarks/llamacpp.py does: decode is measured
    # as it runs from then on; the move's seconds are reported apart
    t0 = time.perf_counter()
    for program in (gen.prefill_program, gen.decode_program):
        if getattr(program._runtime, "huge_pages", None) is not None:
            program._runtime.huge_pages.join()
    moved = time.perf_counter() - t0
    s.note = "; ".join(dict.fromkeys(" ".join(str(w.message).split())[:140] for w in caught
                                     if "Fallback" in w.category.__name__))
    if moved > 0.05:
        waited = f"weights moved onto 2 MiB pages in {moved:.1f} s before timing"
        s.note = "; ".join(filter(None, [s.note, waited]))
    print("\n".join(gen.report.summary().splitlines()[:5]), flush=True)

    def call() -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        out = gen.generate(ids, max_new_tokens=new)
        return out, t0 + gen.report.last_run["prefill_s"]

    s.run = lambda: timed(call)
    return s


class KVStep(nn.Module):
    """One step of the causal LM with the KV cache as plain tensors: (ids [B, T], mask
    [B, past + T], positions [B, T], past keys/values per layer [B, kv heads, past, dim]) ->
    (logits of the last position [B, vocab], present keys/values [B, kv, past + T, dim])."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(config=self.lm.config)
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids, cache=cache, use_cache=True, logits_to_keep=1)
        present = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        return (out.logits[:, -1], *present)


def kv_shape(lm: nn.Module) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a LLaMA-style config."""
    c = lm.config
    return (c.num_hidden_layers, c.num_key_value_heads,
            getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)


def export_kv_step(lm: nn.Module, path: Path) -> None:
    """Export KVStep with every batch and length dimension dynamic (example sizes > 1: the
    exporter specialises dimensions of size 0 and 1)."""
    layers, heads, dim = kv_shape(lm)
    b, t, p = 2, 5, 7
    past = tuple(torch.randn(b, heads, p, dim) for _ in range(2 * layers))
    inputs = (torch.randint(3, 100, (b, t)), torch.ones(b, p + t, dtype=torch.long),
              (torch.arange(t) + p).expand(b, t).contiguous(), *past)
    d = torch.export.Dim.DYNAMIC
    shapes = ({0: d, 1: d}, {0: d, 1: d}, {0: d, 1: d}, tuple({0: d, 2: d} for _ in past))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(KVStep(lm).eval(), inputs, str(path), dynamo=True,
                          dynamic_shapes=shapes)


def ort_session(model: Model, tmp: Path, cache: dict[str, Any], int8: bool = False
                ) -> tuple[Callable, float]:
    """The ONNX Runtime session of the model's KV step (ort_runner: ORT_ENABLE_ALL, 2 intra-op
    threads, sequential), exported once per model and shared by its batch sizes. `int8`: the
    export through onnxruntime's quantize_dynamic with its defaults (int8 weights, activations
    quantized per call), as users run it."""
    key = model.name + (" int8" if int8 else "")
    if key not in cache:
        t = time.perf_counter()
        path = tmp / f"{model.name.split()[0]}.onnx"
        try:
            if not path.exists():
                export_moe_aware(model.lm, path, model.ids.numel())
            if int8:
                from onnxruntime.quantization import quantize_dynamic

                qpath = path.with_suffix(".int8.onnx")
                quantize_dynamic(str(path), str(qpath))
                path = qpath
            run = ort_runner(path, 3 + 2 * kv_shape(model.lm)[0], sequential=True)
            cache[key] = (run, time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - the next batch size fails alike, not again
            cache[key] = exc
    if isinstance(cache[key], Exception):
        raise cache[key]
    return cache[key]


def export_moe_aware(lm: nn.Module, path: Path, tokens: int) -> None:
    """export_kv_step; a mixture of experts whose default experts code torch.onnx cannot
    translate is exported with them as batched_mm (models.batched_experts), unless that would
    gather more than models.BATCHED_GATHER_LIMIT a layer at the prompt's tokens."""
    try:
        export_kv_step(lm, path)
    except Exception as exc:
        inner = getattr(lm, "model", lm)
        if not getattr(inner, "_can_set_experts_implementation", lambda: False)():
            raise
        refusal = batched_refusal(lm, tokens)
        if refusal:
            raise RuntimeError(f"{short(exc)}; {refusal}") from exc
        with batched_experts(lm):
            export_kv_step(lm, path)


def ort_greedy(run: Callable, lm: nn.Module, ids: torch.Tensor, new: int
               ) -> tuple[torch.Tensor, float]:
    """Prefill (the step graph over the prompt, empty past), then one step per new token, the
    present cache fed back as the next past."""
    layers, heads, dim = kv_shape(lm)
    b, p = ids.shape
    mask = torch.ones(b, p + new, dtype=torch.long)
    past = [torch.zeros(b, heads, 0, dim)] * (2 * layers)
    positions = torch.arange(p).expand(b, p).contiguous()
    logits, *past = run((ids, mask[:, :p].contiguous(), positions, *past))
    tok = logits.argmax(-1, keepdim=True)
    first = time.perf_counter()
    out = [ids, tok]
    for pos in range(p, p + new - 1):
        logits, *past = run((tok, mask[:, :pos + 1].contiguous(),
                             torch.full((b, 1), pos, dtype=torch.long), *past))
        tok = logits.argmax(-1, keepdim=True)
        out.append(tok)
    return torch.cat(out, 1), first


def make_ort(model: Model, ids: torch.Tensor, new: int, tmp: Path,
             cache: dict[str, Any], int8: bool = False) -> System:
    s = System("ort-int8" if int8 else "ort")
    shared = model.name + (" int8" if int8 else "") in cache
    run, s.setup_s = ort_session(model, tmp, cache, int8)
    s.setup_note = " (shared)" if shared else ""
    s.run = lambda: timed(lambda: ort_greedy(run, model.lm, ids, new))
    return s


# ---------------------------------------------------------------- one group

@dataclass
class Group:
    model: str
    batch: int
    prompt: int
    new: int
    systems: dict[str, System]
    weight_bytes: float = 0.0  # read per decode step (TinyLlama only: the bound)
    others_cpu: float = float("nan")
    recompiles: int = 0  # graphs the static system compiled while it was timed


def agreement(got: torch.Tensor, want: torch.Tensor, prompt: int) -> tuple[bool, str]:
    if got.shape != want.shape:
        return False, f"no: shape {list(got.shape)} vs {list(want.shape)}"
    differ = (got[:, prompt:] != want[:, prompt:]).any(0).nonzero()
    if not len(differ):
        return True, "yes"
    return False, f"first divergence at new token {int(differ[0])} of {want.shape[1] - prompt}"


def build_system(name: str, make: Callable[[], System]) -> System:
    """Builds a system and runs it once (the warm-up: for static + compile the compiles,
    counted in its setup time); a failure becomes the system's row."""
    t = time.perf_counter()
    try:
        s = make()
        if s.run is not None:
            s.samples.append(s.run())  # warm-up; kept apart from the timed samples below
    except Exception as exc:  # noqa: BLE001 - reported in the table
        traceback.print_exc(limit=3)
        return System(name, error=root_cause(exc))
    if s.warmup_compiles:
        s.setup_s = time.perf_counter() - t
    return s


def run_group(model: Model, batch: int, args: argparse.Namespace, tmp: Path,
              ort_cache: dict[str, Any]) -> Group:
    ids = model.ids[:batch].contiguous()
    lm, new = model.lm, args.new
    makers = {"eager": lambda: make_eager(lm, ids, new),
              "eqsat": lambda: make_eqsat(lm, ids, new),
              "eqsat-int8": lambda: make_eqsat(lm, ids, new, "int8"),
              "eqsat-int4": lambda: make_eqsat(lm, ids, new, "int4"),
              "ort": lambda: make_ort(model, ids, new, tmp, ort_cache),
              "ort-int8": lambda: make_ort(model, ids, new, tmp, ort_cache, int8=True),
              "static": lambda: make_static(lm, ids, new)}  # dynamo last, as compare_cpu
    built = {k: build_system(k, makers[k]) for k in makers if k in args.systems}
    group = Group(model.name, batch, args.prompt, new,
                  {k: built[k] for k in SYSTEMS if k in built})
    if model.name.startswith(BOUNDED):
        group.weight_bytes = weight_work(lm, batch).weight_bytes
    eager = built["eager"]
    for s in group.systems.values():
        if s.samples and eager.samples:
            s.match, s.match_text = agreement(s.samples[0].tokens, eager.samples[0].tokens,
                                              args.prompt)
    for s in group.systems.values():
        s.samples.clear()  # the warm-up is not timed
    graphs0 = _graphs()
    busy0, mine0, wall0 = busy_cpu_s(), time.process_time(), time.perf_counter()
    time_rounds([s for s in group.systems.values() if s.run is not None], args.rounds)
    group.others_cpu = others_cpu(busy0, mine0, wall0)
    group.recompiles = _graphs() - graphs0
    for s in group.systems.values():  # the closures hold the programs, sessions, caches
        s.run = None
    return group


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def time_rounds(systems: list[System], rounds: int) -> None:
    """`rounds` rounds, the order rotated each round; per round each system makes as many
    calls as fit in about ROUND_S (at least one). compare_cpu.interleaved_medians makes at
    least 5 calls per round and settles with whole calls, too long for seconds-long generate
    calls; settle() is used where a call is short, a sleep otherwise."""
    if not systems:
        return
    one = {s.name: s.run().total_s for s in systems}  # a probe call each, untimed
    calls = {name: max(1, round(ROUND_S / sec)) for name, sec in one.items()}
    for r in range(rounds):
        k = r % len(systems)
        for s in systems[k:] + systems[:k]:
            if one[s.name] < LONG_CALL_S:
                settle(s.run)
            else:  # the previous system's spinning threads go idle meanwhile
                time.sleep(SETTLE_S)
            s.samples += [s.run() for _ in range(calls[s.name])]


# ---------------------------------------------------------------- reporting

@dataclass
class Figures:
    prefill_ms: float
    decode_ms: float  # per step: one new token for each of the batch's sequences
    tokens_s: float  # new tokens x batch / whole generate call
    decode_tokens_s: float  # (new - 1) x batch / decode time


def figures(s: System, g: Group) -> Figures | None:
    if not s.samples:
        return None
    prefill = s.median(lambda x: x.prefill_s)
    total = s.median(lambda x: x.total_s)
    decode = s.median(lambda x: x.total_s - x.prefill_s)
    steps = max(g.new - 1, 1)
    return Figures(prefill * 1e3, decode / steps * 1e3, g.new * g.batch / total,
                   steps * g.batch / decode)


# the bytes a system's stored weights take per float32 weight byte: int8 one byte a weight
# (its per-column scales under 0.1% at K >= 1024), int4_g32 half a byte and a float16 scale
# per 32 (quant_formats; ort-int8's quantize_dynamic stores int8 too)
STORED_FRACTION = {"int8": 0.25, "int4": (0.5 + 2 / 32) / 4}


def stored_bytes(g: Group, system: str) -> float:
    """A decode step's weight bytes in the system's stored format."""
    return g.weight_bytes * STORED_FRACTION.get(system.rsplit("-", 1)[-1], 1.0)


def bound_ms(g: Group, rates: Rates, system: str = "eqsat") -> float | None:
    """A decode step's weight bytes (in the system's stored format) over the measured read
    bandwidth, in ms."""
    return stored_bytes(g, system) / rates.read_bw * 1e3 if g.weight_bytes else None


def table(groups: list[Group], rates: Rates | None) -> str:
    head = ("| model | system | batch | prompt/new | prefill ms | decode ms per step | "
            "tokens/s | decode tokens/s | vs eager | decode / bound | compile s | "
            "tokens match eager |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for g in groups:
        eager = figures(g.systems["eager"], g) if "eager" in g.systems else None
        for s in g.systems.values():
            lines.append(row(g, s, figures(s, g), eager,
                             bound_ms(g, rates, s.name) if rates else None))
    return "\n".join(lines)


def row(g: Group, s: System, f: Figures | None, eager: Figures | None,
        bound: float | None) -> str:
    lead = f"| {g.model} | {LABEL[s.name]} | {g.batch} | {g.prompt}/{g.new} |"
    if s.error:
        return lead + f" failed: {s.error[:160].replace('|', '/')} |" + " |" * 7
    ratio = f"{f.tokens_s / eager.tokens_s:.2f}" if f and eager else "n/a"
    over = f"{f.decode_ms / bound:.2f}" if f and bound else "-"
    setup = "-" if s.setup_s is None else f"{s.setup_s:.1f}{s.setup_note}"
    if f is None:
        return lead + " - | - | - | - |" + f" {ratio} | {over} | {setup} | {s.match_text} |"
    return (lead + f" {f.prefill_ms:.1f} | {f.decode_ms:.2f} | {f.tokens_s:.1f} | "
            f"{f.decode_tokens_s:.1f} | {ratio} | {over} | {setup} | {s.match_text} |")


def targets(groups: list[Group], rates: Rates | None) -> list[str]:
    """The two targets, per group they apply to: met or not, with the figures."""
    out = []
    for g in groups:
        q, e = g.systems.get("eqsat"), g.systems.get("eager")
        fq = figures(q, g) if q else None
        fe = figures(e, g) if e else None
        if g.model == "small" and fq and fe:
            r = fq.tokens_s / fe.tokens_s
            out.append(f"- small, batch {g.batch}: eqsat-llm {r:.2f}x eager tokens/s (target >= "
                       f"{SMALL_TARGET:g}x: {'met' if r >= SMALL_TARGET else 'NOT met'})")
        for name, system in g.systems.items():
            fs = figures(system, g) if name.startswith("eqsat") else None
            bound = bound_ms(g, rates, name) if rates else None
            if not (bound and fs):
                continue
            r = fs.decode_ms / bound
            out.append(f"- {g.model}, batch {g.batch}, {LABEL[name]}: bound "
                       f"{stored_bytes(g, name) / 1e6:.0f} MB of "
                       f"weights per decode step / {rates.read_bw / 1e9:.1f} GB/s = "
                       f"{bound:.2f} ms per step, {g.batch * 1e3 / bound:.1f} tokens/s; "
                       f"decode {fs.decode_ms:.2f} ms per step = {r:.2f}x the bound "
                       f"(target <= {BOUND_TARGET:g}x: "
                       f"{'met' if r <= BOUND_TARGET else 'NOT met'})")
    return out


def notes(groups: list[Group], ort_missing: str | None) -> list[str]:
    out = []
    if ort_missing:
        out.append(f"- ONNX Runtime row absent: {ort_missing}")
    for g in groups:
        bits = []
        for s in g.systems.values():
            if s.error and len(s.error) > 160:
                bits.append(f"{LABEL[s.name]} failed: {s.error}")
            if s.note:
                bits.append(f"{LABEL[s.name]}: {s.note}")
        counts = [f"{LABEL[s.name]} {len(s.samples)}" for s in g.systems.values() if s.samples]
        if counts:
            bits.append("timed calls: " + ", ".join(counts))
        if g.recompiles:
            bits.append(f"torch.compile compiled {g.recompiles} graph(s) while timed")
        if not g.others_cpu < 0.1:
            bits.append(f"other processes used {g.others_cpu:.2f} cores while timed")
        if bits:
            out.append(f"- {g.model}, batch {g.batch}: " + "; ".join(bits))
    return out


def method(args: argparse.Namespace, rates: Rates | None) -> str:
    text = (f"Method: greedy generation of {args.new} new tokens after a {args.prompt}-token "
            "random prompt (random weights, fp32, eos off so every row makes all its tokens); "
            "per model and batch, each system built and run once (compile/export and that "
            "warm-up apart: the compile s column; ORT's export is shared by the batch sizes), "
            "its tokens compared with eager's, then "
            f"{args.rounds} interleaved rounds (order rotated; settle() or a {SETTLE_S * 1e3:.0f}"
            f" ms sleep before each system; calls repeated up to about {ROUND_S:g} s per round);"
            " figures = medians over the timed calls. prefill ms: until the first new token "
            "exists; decode ms per step: the rest over new - 1 steps (a step makes one token "
            "per sequence); tokens/s = new x batch / whole generate call; decode tokens/s = "
            "(new - 1) x batch / decode time; vs eager = tokens/s over eager's. "
            "static + compile: `model.forward = torch.compile(model.forward, fullgraph=True)`, "
            "`generate(..., cache_implementation=\"static\")` (its compile s includes the "
            "warm-up generate that compiles). ONNX Runtime: one step exported (dynamo) with the "
            "KV cache as inputs/outputs, prefill = that step with an empty past, greedy loop in "
            "Python (ORT_ENABLE_ALL, intra_op 2, inter_op 1, sequential). eqsat-llm: "
            "`eqsat_llm.Generator(model, max_seq_len=prompt + new, batch_size=B)`. Compile s "
            "is lower when a previous run left inductor's and eqsat-llm's on-disk caches warm.")
    if rates:
        text += (" decode / bound (TinyLlama): decode ms per step over the weight bytes one "
                 "step reads (every linear weight and the LM head; embedding rows) / read "
                 f"bandwidth ({rates.bw_text}; the faster of the start and the end).")
    return text


def report(groups: list[Group], args: argparse.Namespace, argv: list[str], rates: Rates | None,
           total_s: float, load: tuple[tuple[float, ...], tuple[float, ...]], load_ok: bool,
           ort_missing: str | None) -> str:
    cmd = ".venv/bin/python benchmarks/generate.py" + (" " + shlex.join(argv) if argv else "")
    date = f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    import transformers

    try:
        import onnxruntime as ort
        ort_v = f"onnxruntime {ort.__version__}"
    except ImportError:
        ort_v = "no onnxruntime"
    la = " at the start, ".join("/".join(f"{x:.2f}" for x in v) for v in load) + " at the end"
    if args.write and not load_ok:
        la += f" **(the 1-minute load did not fall below {args.max_load}: figures noisy)**"
    head = (f"{section(args)}\n\nCommand: `{cmd}` ({date}, {platform.machine()}, {os.cpu_count()} "
            f"cores, {platform.processor() or platform.platform()}, torch {torch.__version__} "
            f"with {torch.get_num_threads()} threads, transformers {transformers.__version__}, "
            f"{ort_v}, Python {platform.python_version()}; run took {total_s:.0f} s; load "
            f"average (1/5/15 min) {la}).\n\n{method(args, rates)}\n\n"
            "BLAS and thread pools loaded (threadpoolctl, after all systems ran):\n\n"
            + "\n".join(f"- {ln}" for ln in blas_info()))
    tg = targets(groups, rates)
    nts = notes(groups, ort_missing)
    return (head + "\n\n" + table(groups, rates)
            + ("\n\nTargets:\n\n" + "\n".join(tg) if tg else "")
            + ("\n\nNotes:\n\n" + "\n".join(nts) if nts else ""))


# ---------------------------------------------------------------- main

def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="small,tinyllama",
                   help="small, tinyllama; or mixtral, mixtral_large (a run of their own)")
    p.add_argument("--batch", default="1,4", help="comma-separated batch sizes")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 128)")
    p.add_argument("--new", type=int, default=None, help="new tokens (default 128)")
    p.add_argument("--layers", type=int, default=4,
                   help="TinyLlama decoder layers, of its 22 (default 4, as benchmarks/models.py;"
                   " --quick's scaled-down model has 1)")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help=f"of {', '.join(SYSTEMS)}, or all (eager always runs: the reference)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help=f"prompt {QUICK['prompt']}, {QUICK['new']} new tokens, scaled-down "
                   "TinyLlama, 1 round: a smoke run, not a measurement")
    add_write_options(p)
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.batch = [int(b) for b in args.batch.split(",") if b]
    if args.systems == "all":
        args.systems = ",".join(SYSTEMS)
    args.systems = ["eager", *[s for s in args.systems.split(",") if s and s != "eager"]]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; known: {', '.join(MODELS)}")
    for s in args.systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}; known: {', '.join(SYSTEMS)}")
    args.prompt = args.prompt or (QUICK["prompt"] if args.quick else 128)
    args.new = args.new or (QUICK["new"] if args.quick else 128)
    if args.new < 2 or not args.batch or min(args.batch) < 1 or args.layers < 1:
        p.error("--new must be >= 2, batch sizes and --layers >= 1")
    if args.quick:
        args.rounds = 1
    return args


def main(argv: list[str] | None = None) -> list[Group]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(2)
    load_ok = wait_for_load(args.max_load, args.wait_load) if args.write else True
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    bound_wanted = any(m.startswith(BOUNDED) for m in args.models)
    rates = measure_rates(args.quick) if bound_wanted else None
    if rates:
        print(f"measured: {rates.bw_text}", flush=True)
    ort_missing = _ort_missing() if "ort" in args.systems else None
    if ort_missing:
        args.systems.remove("ort")
    groups: list[Group] = []
    with tempfile.TemporaryDirectory(prefix="bench_generate_") as tmp:
        for name in args.models:
            model = build_model(name, args)
            ort_cache: dict[str, Any] = {}
            for b in args.batch:
                t = time.perf_counter()
                groups.append(run_group(model, b, args, Path(tmp), ort_cache))
                gc.collect()
                print(f"[{time.perf_counter() - t:.0f} s]\n" + "\n".join(
                    table(groups[-1:], rates).splitlines()[2:]), flush=True)
            del model, ort_cache
            gc.collect()
    if rates:  # again at the end, the faster kept: load only ever lowers a measured rate
        rates = best_rates(rates, measure_rates(args.quick))
    text = report(groups, args, argv, rates, time.perf_counter() - t0,
                  (load_start, os.getloadavg()), load_ok, ort_missing)
    print(text)
    if args.write:
        write_section(text, section(args))
        print(f"\nwrote the section {section(args)!r} of benchmarks/RESULTS.md")
    return groups


def section(args: argparse.Namespace) -> str:
    """The RESULTS.md section: the default run's, or one of its own for another depth of the
    TinyLlama shape (all 22 layers: a run of its own, for memory)."""
    quantized = any(s.endswith(("int8", "int4")) for s in args.systems)
    name = SECTION + (", quantized weights" if quantized else "")
    if set(args.models) <= set(MOE_MODELS):
        return f"{name}, mixture of experts"
    if args.layers == 4 or args.quick:
        return name
    return f"{name}, TinyLlama shape with {args.layers} layers"


def _ort_missing() -> str | None:
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401 - the dynamo exporter needs it
    except ImportError as exc:
        return f"{short(exc)} (pip install -e '.[bench]')"
    return None


if __name__ == "__main__":
    main()
