"""Text generation on compiled programs: `Generator` and `generate`.

    gen = eqsat_llm.Generator(model, max_seq_len=256, batch_size=1)
    tokens = gen.generate(input_ids, max_new_tokens=32)      # greedy, as model.generate
    print(gen.report.summary())

Two programs are compiled once per Generator from one `CachedStep` (kv_cache.py), sharing its
cache buffers: the decode step (one token per sequence) and the prefill chunk (`prefill_chunk`
tokens). Both take the cache position as a run-time input, so any prompt length up to
`max_seq_len` runs without another compile: the prompt goes through the chunk program chunk by
chunk; a prompt shorter than a chunk is padded at its end (the padding's cache entries sit past
the prompt, unseen, and the decode steps overwrite them), and the last chunk of a longer prompt
is moved back to end at the prompt's end (it rewrites entries already written, with the same
values). docs/generation.md gives the measurements behind the chunk size."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import EqsatError
from ..memcheck import release_freed_memory
from ..rulebook import resolve
from ..weights.lazy_weights import WeightSource, source_names
from ..weights.meta import ParameterSource, exact_half_of, meta_twin, plans_on_meta
from .kv_cache import CachedStep
from .parallel_start import layers_in, start_workers, wait_budget

DEFAULT_CHUNK = 64


@dataclass
class Sampling:
    """Greedy when `do_sample` is False; else softmax(logits / temperature) restricted to the
    top_k tokens and the smallest set whose probability reaches top_p, drawn with `generator`
    (a seeded torch.Generator makes it repeatable)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise EqsatError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise EqsatError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise EqsatError(f"top_k must be >= 1, got {self.top_k}")

    def next_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, vocab] logits -> [B] token ids."""
        if not self.do_sample:
            return logits.argmax(-1)
        scores = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            kth = scores.topk(self.top_k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1:
            ordered, order = scores.sort(dim=-1, descending=True)
            mass = ordered.softmax(-1).cumsum(-1)
            # drop a token when the tokens ranked above it already reach top_p
            drop = (mass - ordered.softmax(-1)) >= self.top_p
            scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        probs = scores.softmax(-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)


_WEIGHTS_FROM = {
    "checkpoint": "at load, read from the checkpoint's shards one tensor at a time",
    "model": "at load from the model's own tensors (planned on its meta twin: each made once)",
    "folded": "while optimizing the loaded model (docs/memory.md: when it is not planned on "
              "its meta twin)",
}


def program_options(model: nn.Module, optimize_options: dict[str, Any]
                    ) -> tuple[torch.dtype, dict[str, Any]]:
    """The dtype a Generator's programs compute `model` in, and the options both are
    optimized with (also a parallel start's child: parallel_start.py)."""
    first = next(model.parameters(), None)
    dtype = first.dtype if first is not None else torch.float32
    if optimize_options.get("backend", "auto") != "reference" and dtype in (
            torch.bfloat16, torch.float16):
        dtype = torch.float32  # the backends compute half models in float32 (formats/half.py)
    options = {"measure_eager": False, **optimize_options}
    if options.get("quantize") and "rules" not in options:
        # weights held once: a half-precision weight form would win at prefill (compute)
        # where the quantized one wins at decode (bytes), and both programs would hold
        # the weight; without it they share the quantized form (docs/generation.md)
        options["rules"] = [r for r in resolve(["all"]) if r.family != "half-weights"]
    return dtype, options


def optimize_step(step: nn.Module, example: tuple[torch.Tensor, ...],
                  options: dict[str, Any]) -> Any:
    """One program of a Generator: `step` (a CachedStep) optimized on `example`."""
    from ..api import optimize

    with _step_warnings():
        return optimize(step, example, **options)


@contextlib.contextmanager
def _step_warnings():
    from ..api import FallbackWarning

    with torch.no_grad(), warnings.catch_warnings():
        # the cache writes run in torch, in place on the buffers: expected, not a fallback
        warnings.filterwarnings("ignore", message=r".*\(fallback\): aten\.index_put\.default$",
                                category=FallbackWarning)
        yield


def prefill_tokens(prefill_chunk: int | None, max_seq_len: int) -> int:
    """The prefill program's tokens per call."""
    return min(prefill_chunk or DEFAULT_CHUNK, max_seq_len)


def cached_step(model: nn.Module, batch_size: int, max_seq_len: int, dtype: torch.dtype,
                meta: bool) -> CachedStep:
    """The module both programs are optimized from (its KV cache on the meta device with
    the model's weights when `meta`)."""
    with torch.device("meta") if meta else contextlib.nullcontext():
        return CachedStep(model, batch_size, max_seq_len, dtype).eval()


def example_inputs(tokens: int, batch_size: int, max_seq_len: int, meta: bool
                   ) -> tuple[torch.Tensor, ...]:
    """A program's inputs for `tokens` new tokens: ids, past length, positions, mask, last."""
    b, n = batch_size, max_seq_len
    xs = (torch.zeros(b, tokens, dtype=torch.long), torch.tensor(0),
          torch.arange(tokens).expand(b, tokens).contiguous(), torch.ones(b, n, dtype=torch.long),
          torch.zeros(1, dtype=torch.long))
    return tuple(x.to("meta") for x in xs) if meta else xs


@dataclass
class GeneratorReport:
    """What a Generator compiled: its two programs' reports, the cache and the arenas."""

    prefill: Any  # Report of the prefill-chunk program
    decode: Any  # Report of the decode-step program
    cache_bytes: int
    cache_buffers: int  # two per layer: keys and values
    cache_shape: tuple[int, ...]
    prefill_chunk: int
    compile_seconds: float
    prepared_bytes: int = 0  # what both programs hold beyond the model's parameters
    prepared_alone: tuple[int, int] = (0, 0)  # what each would hold alone (prefill, decode)
    shared: tuple[int, int] = (0, 0)  # tensors both programs hold, one copy: count, bytes
    # the model's own tensors the kernels read as stored (not copied): count, bytes
    model_tensors_read: tuple[int, int] = (0, 0)
    last_run: dict[str, float] = field(default_factory=dict)
    # from_pretrained: the checkpoint's bytes read and the seconds the weights took (read,
    # converted, quantized, packed), apart from the compile
    weights_read_bytes: int = 0
    load_seconds: float = 0.0
    # how the prepared weights were made: "checkpoint" (read from its shards at load),
    # "model" (at load from the model's own tensors, planned on its meta twin: weights/meta.py) or
    # "folded" (computed while optimizing the loaded model, where the twin cannot stand in)
    weights_from: str = "folded"
    # where each program was optimized: "here", "in a parallel process" (a cold
    # from_pretrained: parallel_start.py), "by an earlier start" (the program cache's, a
    # warm start); "here (why not in parallel)" where a parallel process failed
    decode_optimized: str = "here"
    prefill_optimized: str = "here"

    def to_dict(self) -> dict[str, Any]:
        return {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict(),
                "cache_bytes": self.cache_bytes, "cache_buffers": self.cache_buffers,
                "cache_shape": list(self.cache_shape),
                "prefill_chunk": self.prefill_chunk, "compile_seconds": self.compile_seconds,
                "prepared_bytes": self.prepared_bytes,
                "prepared_alone": list(self.prepared_alone), "shared": list(self.shared),
                "model_tensors_read": list(self.model_tensors_read),
                "weights_read_bytes": self.weights_read_bytes,
                "load_seconds": self.load_seconds, "weights_from": self.weights_from,
                "decode_optimized": self.decode_optimized,
                "prefill_optimized": self.prefill_optimized,
                "last_run": dict(self.last_run)}

    def summary(self) -> str:
        def mib(n: float) -> str:
            return f"{n / 2**20:.2f} MiB"

        arena = {k: r.memory.get("arena_bytes", 0) for k, r in
                 (("prefill", self.prefill), ("decode", self.decode))}
        lines = [
            "eqsat-llm generator",
            "===================",
            (f"KV cache: {mib(self.cache_bytes)} ({self.cache_buffers} buffers of "
             f"{list(self.cache_shape)}), written in place by both programs"),
            f"arenas: prefill {mib(arena['prefill'])}, decode {mib(arena['decode'])}",
            (f"folded and packed weights: {mib(self.prepared_bytes)} for both programs, equal "
             f"ones held once (alone: prefill {mib(self.prepared_alone[0])}, decode "
             f"{mib(self.prepared_alone[1])}; the model's own parameters not counted)"),
            (f"held once for both programs: {self.shared[0]} tensors, {mib(self.shared[1])}; "
             f"the model's own tensors read as stored: {self.model_tensors_read[0]}, "
             f"{mib(self.model_tensors_read[1])}"),
            (f"compiled in {self.compile_seconds:.1f} s (both programs; the decode step "
             f"optimized {self.decode_optimized}, the prefill program "
             f"{self.prefill_optimized})"),
            "weights prepared " + _WEIGHTS_FROM[self.weights_from],
        ]
        if self.weights_read_bytes:
            lines.append(f"weights: {self.weights_read_bytes / 1e9:.2f} GB of the checkpoint "
                         f"read and prepared in {self.load_seconds:.1f} s "
                         f"({self.weights_read_bytes / 1e9 / max(self.load_seconds, 1e-9):.2f}"
                         f" GB/s), within the compile time")
        if self.last_run:
            r = self.last_run
            lines.append(f"last generate: prompt {r['prompt_tokens']:.0f} tokens in "
                         f"{r['prefill_s'] * 1e3:.1f} ms, {r['new_tokens']:.0f} new tokens in "
                         f"{r['decode_s'] * 1e3:.1f} ms ({r['tokens_per_s']:.1f} tokens/s)")
        for name, rep in (("prefill", self.prefill), ("decode", self.decode)):
            title = (f"prefill program ({self.prefill_chunk} tokens per chunk)"
                     if name == "prefill" else "decode program (1 token)")
            lines += ["", f"--- {title} ---", rep.summary()]
        return "\n".join(lines)


class Generator:
    """A causal LM compiled for generation: a decode step and a prefill chunk over a static KV
    cache of `max_seq_len` positions for `batch_size` sequences. `optimize_options` go to
    `eqsat_llm.optimize` for both programs (rules, extractor, limits, progress...)."""

    def __init__(self, model: nn.Module, max_seq_len: int, *, batch_size: int = 1,
                 prefill_chunk: int | None = None, weights: WeightSource | None = None,
                 **optimize_options: Any):
        if max_seq_len < 2 or batch_size < 1:
            raise EqsatError(f"max_seq_len must be >= 2 and batch_size >= 1, got "
                             f"{max_seq_len} and {batch_size}")
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if limit is not None and max_seq_len > limit:
            raise EqsatError(f"max_seq_len {max_seq_len} exceeds the model's "
                             f"max_position_embeddings ({limit})")
        if weights is None and any(p.is_meta for p in model.parameters()):  # it needs them
            raise EqsatError("Generator runs the model, but its weights are on the meta device: "
                             "load them first (optimize() plans a meta-device model without "
                             "running it: docs/memory.md)")
        self.model = model.eval()
        self.max_seq_len, self.batch_size = max_seq_len, batch_size
        self.chunk = prefill_tokens(prefill_chunk, max_seq_len)
        if self.chunk < 1:
            raise EqsatError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        dtype, options = program_options(model, optimize_options)
        t0 = time.perf_counter()
        twin = False
        on_twin = weights is None and _on_meta_twin(model, options)
        # (planned on the twin, a half checkpoint loaded as float32 stays half: which weights
        # fit a half dtype is read off the loaded values, for both programs)
        with exact_half_of(model) if on_twin else contextlib.nullcontext():
            if on_twin:
                # a loaded model is planned on its meta twin and loaded from its own tensors:
                # each prepared weight made once, none held beside a folded copy
                # (weights/meta.py)
                own = ParameterSource(model)
                try:
                    self._optimize(meta_twin(model), dtype, own, options)
                    # (not where a constant is made in forward: its values only the model has)
                    twin = not own.missing(source_names(self.decode_program.graph.constants))
                except (EqsatError, RuntimeError, NotImplementedError, TypeError):
                    twin = False  # code that runs only on real tensors, a model that cannot
                    # be deep-copied (a lock among its attributes): planned as loaded
                weights = own if twin else None
            if not twin:
                self._optimize(model, dtype, weights, options)
            self.prefill_program = self._program(self.chunk, options)
        self._finish(model, weights, t0, "model" if twin else
                     "checkpoint" if weights is not None else "folded")

    def _finish(self, model: nn.Module | None, weights: WeightSource | None, t0: float,
                weights_from: str) -> None:
        """With both programs made: their weights (where planned on the meta device), the
        report and the run-time inputs."""
        from .checkpoint import CheckpointWeights, MadeInForward

        # (a loaded model's own source: its decode constants checked before the twin was kept)
        if isinstance(weights, CheckpointWeights):
            lost = weights.missing(source_names(self.decode_program.graph.constants)
                                   | source_names(self.prefill_program.graph.constants))
            if lost:
                raise MadeInForward(f"the model makes {len(lost)} tensors as it runs that "
                                    f"the checkpoint does not hold ({', '.join(lost[:3])}"
                                    f"{', ...' if len(lost) > 3 else ''})")
        self.load_seconds = 0.0  # (folded: the weights were made while optimizing)
        if weights is not None:  # planned on the meta device: each prepared weight is made now
            t1 = time.perf_counter()
            caches = {name: torch.zeros(meta.shape, dtype=meta.dtype)  # the caches, real (the
                      for name, meta in zip(self.step.cache_names(), self.step.caches())}
            for name, cache in caches.items():  # model's parameters stay meta)
                setattr(self.step, name, cache)
            # prefill first: its SwiGLU weights are prepared whole, and the decode step,
            # which may read the gate and up halves apart, takes them as views of those
            release_freed_memory()  # what optimizing freed: not beside the weights
            for program in (self.prefill_program, self.decode_program):
                program.load_weights(weights, state=caches)
                release_freed_memory()
            self.load_seconds = time.perf_counter() - t1
        caches = self.step.caches()
        self.report = GeneratorReport(
            prefill=self.prefill_program.report, decode=self.decode_program.report,
            cache_bytes=sum(c.numel() * c.element_size() for c in caches),
            cache_buffers=len(caches),
            cache_shape=tuple(caches[0].shape), prefill_chunk=self.chunk,
            compile_seconds=time.perf_counter() - t0,
            **_holdings(model, (self.prefill_program, self.decode_program)),
            weights_from=weights_from, decode_optimized=self._where[1],
            prefill_optimized=self._where[self.chunk])
        # run-time inputs, filled in place between calls (no allocation per token); the
        # cache and these are one generation's state: one generate() at a time
        self._lock = threading.Lock()
        self._mask = torch.zeros(self.batch_size, self.max_seq_len, dtype=torch.long)
        self._past = torch.zeros((), dtype=torch.long)
        self._last = torch.zeros(1, dtype=torch.long)

    def _optimize(self, model: nn.Module, dtype: torch.dtype, weights: WeightSource | None,
                  options: dict[str, Any]) -> None:
        """The cached step around `model` (on the meta device when `weights` will load it)
        and its decode program (the prefill program after it: _program)."""
        self._meta = weights is not None
        self.step = cached_step(model, self.batch_size, self.max_seq_len, dtype, self._meta)
        self._where: dict[int, str] = {}
        self.decode_program = self._program(1, options)

    def _program(self, tokens: int, options: dict[str, Any]) -> Any:
        """The program for `tokens` new tokens, taken from the program cache where an earlier
        start stored it, else optimized here; where it was optimized in self._where."""
        program = self._optimized(tokens, options)
        self._where[tokens] = "by an earlier start" if \
            program.report.program_cache == "hit" else "here"
        return program

    def _optimized(self, tokens: int, options: dict[str, Any]) -> Any:
        return optimize_step(self.step, example_inputs(tokens, self.batch_size,
                                                       self.max_seq_len, self._meta), options)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, max_seq_len: int,
                        quantize: str | None = None, dtype: torch.dtype | None = None,
                        **options: Any) -> Generator:
        """A Generator for the checkpoint directory `path` (config.json and safetensors
        shards, as save_pretrained writes them). The model is built and both programs are
        optimized and planned on the meta device; then each weight is read from the memory-
        mapped shards straight into the form its kernel reads (quantized with `quantize`,
        widened from half...), and its source bytes dropped: the full-precision model is never
        held (checkpoint.py, weights/lazy_weights.py). `dtype`: the model's, default the
        checkpoint's. Other options as Generator's and optimize's."""
        from . import fp8_checkpoint, warm_start
        from .checkpoint import Checkpoint, MadeInForward
        from .progress import ProgressLine, bytes_text

        ckpt = Checkpoint(path)
        fp8_checkpoint.check_quantize(ckpt.quant_method, quantize, path)
        if quantize is not None:
            options["quantize"] = quantize
        record_name = warm_start.key(ckpt, {"max_seq_len": max_seq_len, "dtype": dtype,
                                            **options})
        record = warm_start.load(record_name) if record_name else None
        line = ProgressLine()  # on a terminal only
        started: list[float] = []

        def reading(done: int) -> None:
            if not started:
                started.append(time.perf_counter())
            line.show("reading weights: " + bytes_text(done, ckpt.total_bytes,
                                                       time.perf_counter() - started[0]))

        ckpt.on_read = reading
        try:
            try:
                gen = cls._from_record(record, ckpt, max_seq_len, options) if record else None
                if gen is None:
                    gen = cls._cold_start(ckpt, max_seq_len, dtype, options, line,
                                          record_name)
            except MadeInForward as lost:  # planned on the loaded model instead (a fallback)
                warnings.warn(f"{ckpt.path}: {lost}; the model is loaded whole by transformers "
                              "and planned as loaded (more memory while it starts)",
                              stacklevel=2)
                gen = cls(_loaded(ckpt, dtype), max_seq_len, **options)
        finally:
            ckpt.on_read = None
            line.done()
        gen.checkpoint = ckpt
        gen.report.weights_read_bytes, gen.report.load_seconds = ckpt.bytes_read, \
            gen.load_seconds
        return gen

    @classmethod
    def _cold_start(cls, ckpt: Any, max_seq_len: int, dtype: torch.dtype | None,
                    options: dict[str, Any], line: Any, record_name: str | None) -> Generator:
        """from_pretrained without a start record: both programs optimized in child
        processes, in parallel, where that pays, and started from the record they leave
        (this process builds no model); else the model built here on the meta device. The
        record of a later start stored under `record_name`."""
        from ..codegen.c.build import prepare_kernel_library
        from . import warm_start

        prepare_kernel_library()  # (its compile overlaps the optimization: build.py)
        chunk = prefill_tokens(options.get("prefill_chunk"), max_seq_len)
        layers = layers_in(ckpt.path / "config.json")
        workers = start_workers(
            ckpt.path, layers, max_seq_len=max_seq_len, dtype=dtype,
            batch_size=options.get("batch_size", 1), chunk=chunk,
            options={k: v for k, v in options.items() if k not in ("batch_size",
                                                                   "prefill_chunk")},
            record=record_name)
        options.setdefault("progress", lambda text: line.show(f"optimizing: {text}"))
        if workers:
            options["progress"]("both programs, in parallel processes")
            whys = {tokens: worker.wait(wait_budget(layers))
                    for tokens, worker in workers.items()}
            record = warm_start.join_parts(record_name, list(workers)) \
                if record_name and not any(whys.values()) else None
            gen = cls._from_record(record, ckpt, max_seq_len, options,
                                   "in a parallel process") if record else None
            if gen is not None:
                return gen
            why = next((w for w in whys.values() if w), "its start record was not made")
            options["progress"](f"here ({why})")
        model = ckpt.empty_model(dtype)
        gen = cls(model, max_seq_len, weights=ckpt.weight_source(model), **options)
        if workers:  # the children's programs, where they stored them, were cache hits
            gen.report.decode_optimized = gen.report.prefill_optimized = f"here ({why})"
        programs = {1: gen.decode_program.cached_as, gen.chunk: gen.prefill_program.cached_as}
        if record_name is not None and None not in programs.values():
            warm_start.store(record_name, warm_start.StartRecord(
                programs, gen.decode_program._backend, **warm_start.facts(
                    ckpt, model, gen.step, [gen.decode_program.graph,
                                            gen.prefill_program.graph])))
        return gen

    @classmethod
    def _from_record(cls, record: Any, ckpt: Any, max_seq_len: int, options: dict[str, Any],
                     where: str = "by an earlier start") -> Generator | None:
        """from_pretrained from a StartRecord (warm_start.py): no model built, both programs
        from the program cache, where they were optimized (the report's words); None where
        one is gone from it (then a cold start)."""
        from ..api import cached_program
        from .checkpoint import CheckpointWeights
        from .kv_cache import CacheBuffers

        t0 = time.perf_counter()
        programs = {tokens: cached_program(name, record.backend)
                    for tokens, name in record.programs.items()}
        if None in programs.values():
            return None
        gen = cls.__new__(cls)
        gen.model = None  # (never built: the record holds what the Generator reads of it)
        gen.max_seq_len, gen.batch_size = max_seq_len, options.get("batch_size", 1)
        gen.chunk = prefill_tokens(options.get("prefill_chunk"), max_seq_len)
        gen.step = CacheBuffers(record.caches)
        gen.decode_program, gen.prefill_program = programs[1], programs[gen.chunk]
        gen._where = dict.fromkeys(programs, where)
        gen._recorded_defaults = record.eos_token_id, record.pad_token_id
        gen._finish(None, CheckpointWeights(ckpt, record.key_of, record.buffers.items), t0,
                    "checkpoint")
        return gen

    @property
    def caches(self) -> list[torch.Tensor]:
        """The KV cache buffers ([batch, KV heads, max_seq_len, head dim] per layer, keys and
        values), written in place by both programs."""
        return self.step.caches()

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 20, *,
                 attention_mask: torch.Tensor | None = None,
                 eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None,
                 generator: torch.Generator | None = None) -> torch.LongTensor:
        """Prompt + up to `max_new_tokens` new tokens per sequence ([B, P + new]); greedy
        unless `do_sample`. A sequence that produced `eos_token_id` (default: the model's
        generation_config's; [] for none) is filled with `pad_token_id` (default: the
        config's, else the eos id) until all have stopped, as transformers does.
        `attention_mask` [B, P] marks left padding of ragged prompts with 0."""
        sampling = Sampling(do_sample, temperature, top_k, top_p, generator)
        ids = self._check(input_ids, max_new_tokens, attention_mask)
        with self._lock:
            return self._generate(ids, max_new_tokens, attention_mask, sampling,
                                  *self._eos_and_pad(eos_token_id, pad_token_id))

    def next_token_logits(self, input_ids: torch.Tensor, *,
                          attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The logits [B, vocab] after each prompt (its prefill alone: what the first new
        token is chosen from). For scoring, and for checking a program against another
        implementation of the same checkpoint."""
        ids = self._check(input_ids, 1, attention_mask)
        with self._lock, torch.no_grad():
            logits, _ = self._start(ids, attention_mask)
        return logits[:ids.shape[0], -1].clone()

    def _start(self, ids: torch.Tensor, attention_mask: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill the mask and run the prompt: (the prefill's logits, the prompt positions)."""
        rows, prompt = ids.shape
        b = self.batch_size
        full = ids if rows == b else torch.cat([ids, ids[:1].expand(b - rows, prompt)])
        given = (attention_mask.to(torch.long) if attention_mask is not None
                 else torch.ones_like(ids))
        if rows < b:
            given = torch.cat([given, given[:1].expand(b - rows, prompt)])
        self._mask.zero_()
        self._mask[:, :prompt] = given
        # positions as transformers derives them from the mask: left padding does not count
        positions = (given.cumsum(-1) - 1).clamp(min=0)
        return self._prefill(full, positions), positions

    def _generate(self, ids: torch.Tensor, max_new_tokens: int,
                  attention_mask: torch.Tensor | None, sampling: Sampling, eos: list[int],
                  pad: int) -> torch.LongTensor:
        rows, prompt = ids.shape
        b = self.batch_size
        t0 = time.perf_counter()
        with torch.no_grad():
            logits, positions = self._start(ids, attention_mask)
            t1 = time.perf_counter()
            out = [ids]
            done = torch.zeros(rows, dtype=torch.bool)
            next_pos = positions[:, -1:] + 1
            step_ids = torch.zeros(b, 1, dtype=torch.long)
            self._last.zero_()
            for i in range(max_new_tokens):
                tok = sampling.next_tokens(logits[:rows, -1])
                tok = torch.where(done, torch.full_like(tok, pad), tok)
                out.append(tok[:, None])
                if eos:
                    done |= torch.isin(tok, torch.tensor(eos))
                if i == max_new_tokens - 1 or bool(done.all()):
                    break
                pos = prompt + i
                step_ids[:rows, 0] = tok
                step_ids[rows:, 0] = tok[0]
                self._mask[:, pos] = 1
                self._past.fill_(pos)
                logits = self.decode_program(step_ids, self._past, next_pos, self._mask,
                                             self._last)
                next_pos = next_pos + 1
        t2 = time.perf_counter()
        new = len(out) - 1
        self.report.last_run = {"prompt_tokens": prompt, "new_tokens": new,
                                "prefill_s": t1 - t0, "decode_s": t2 - t1,
                                "tokens_per_s": rows * new / (t2 - t0)}
        return torch.cat(out, 1)

    def _prefill(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run the prompt through the chunk program; the logits at its last token."""
        prompt, c = ids.shape[1], self.chunk
        starts = list(range(0, prompt, c))
        if prompt > c and starts[-1] + c > prompt:
            starts[-1] = prompt - c  # end the last chunk at the prompt's end
        logits = None
        for s in starts:
            n = min(c, prompt - s)
            chunk_ids, chunk_pos = ids[:, s:s + n], positions[:, s:s + n]
            if n < c:  # only a prompt shorter than one chunk: pad it at its end
                chunk_ids = torch.cat([chunk_ids, chunk_ids[:, -1:].expand(-1, c - n)], 1)
                chunk_pos = torch.cat([chunk_pos, chunk_pos[:, -1:] + torch.arange(
                    1, c - n + 1)], 1)
            self._past.fill_(s)
            self._last.fill_(n - 1)
            logits = self.prefill_program(chunk_ids.contiguous(), self._past,
                                          chunk_pos.contiguous(), self._mask, self._last)
        return logits

    def _check(self, input_ids: Any, max_new_tokens: int,
               attention_mask: torch.Tensor | None) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 \
                or input_ids.dtype not in (torch.long, torch.int32):
            raise EqsatError("input_ids must be an integer tensor [batch, prompt length], got "
                             f"{getattr(input_ids, 'dtype', type(input_ids))}"
                             f"{list(getattr(input_ids, 'shape', []))}")
        rows, prompt = input_ids.shape
        if not 1 <= rows <= self.batch_size:
            raise EqsatError(f"{rows} sequences given; this Generator was compiled for at most "
                             f"batch_size={self.batch_size}")
        if prompt < 1:
            raise EqsatError("the prompt is empty")
        if max_new_tokens < 1:
            raise EqsatError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if prompt + max_new_tokens > self.max_seq_len:
            raise EqsatError(f"prompt of {prompt} tokens + {max_new_tokens} new tokens exceeds "
                             f"max_seq_len={self.max_seq_len}; build the Generator with a "
                             "larger max_seq_len")
        if attention_mask is not None and tuple(attention_mask.shape) != (rows, prompt):
            raise EqsatError(f"attention_mask has shape {list(attention_mask.shape)}; expected "
                             f"{[rows, prompt]} like input_ids")
        return input_ids.to(torch.long)

    def _generation_defaults(self) -> tuple[Any, Any]:
        """The model's eos and pad ids, read when asked (a user may set them after the
        Generator is built); a Generator started without its model: the start record's."""
        if self.model is None:
            return self._recorded_defaults
        config = getattr(self.model, "generation_config", None)
        return getattr(config, "eos_token_id", None), getattr(config, "pad_token_id", None)

    def _eos_and_pad(self, eos_token_id: int | list[int] | None,
                     pad_token_id: int | None) -> tuple[list[int], int]:
        """As transformers: unset ids come from the model's generation_config; the pad id
        defaults to the first eos id. `eos_token_id=[]` never stops early."""
        eos_default, pad_default = self._generation_defaults()
        if eos_token_id is None:
            eos_token_id = eos_default
        if pad_token_id is None:
            pad_token_id = pad_default
        eos = ([] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int)
               else list(eos_token_id))
        return eos, pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)


def _loaded(ckpt: Any, dtype: torch.dtype | None) -> nn.Module:
    """The checkpoint's model loaded whole by transformers (from_pretrained's fallback)."""
    from transformers import AutoModelForCausalLM

    from .checkpoint import _dtype

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(
            str(ckpt.path), dtype=dtype or _dtype(ckpt.config), local_files_only=True).eval()


def _on_meta_twin(model: nn.Module, options: dict[str, Any]) -> bool:
    """Whether a loaded model's programs are planned on its meta twin: on the C backend,
    where nothing of the planning reads the weights' values (not sparsity=, which reads their
    zeros, nor measure_eager, which runs the model), and meta.plans_on_meta holds."""
    return (options.get("backend", "auto") in ("auto", "c") and not options.get("sparsity")
            and not options.get("measure_eager") and plans_on_meta(model))


def _storages(model: nn.Module | None, program: Any) -> tuple[dict[int, int], dict[int, int]]:
    """The distinct storages (address -> bytes) a program's constants and prepared weights
    hold beyond the model's own tensors, and those of the model's own it reads as stored."""
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())
           } if model is not None else set()
    held: dict[int, int] = {}
    read: dict[int, int] = {}
    for t in [*program.graph.constants.values(), *getattr(program._runtime, "weights", [])]:
        if isinstance(t, torch.Tensor) and not t.is_meta and t.untyped_storage().nbytes():
            ptr = t.untyped_storage().data_ptr()
            (read if ptr in own else held)[ptr] = t.untyped_storage().nbytes()
    return held, read


def _holdings(model: nn.Module | None, programs: tuple[Any, Any]) -> dict[str, Any]:
    """GeneratorReport's fields on what the two programs hold: together, each alone, the
    tensors both hold (one copy), and the model's own tensors read as stored."""
    (held_p, read_p), (held_d, read_d) = (_storages(model, p) for p in programs)
    both = held_p.keys() & held_d.keys()
    return {"prepared_bytes": sum({**held_p, **held_d}.values()),
            "prepared_alone": (sum(held_p.values()), sum(held_d.values())),
            "shared": (len(both), sum(held_p[k] for k in both)),
            "model_tensors_read": (len({**read_p, **read_d}),
                                   sum({**read_p, **read_d}.values()))}


_GENERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def generate(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int = 20,
             **options: Any) -> torch.LongTensor:
    """`Generator(model, ...).generate(input_ids, max_new_tokens, ...)` with the Generator
    built once per model and reused while its capacity fits: max_seq_len is the next power of
    two >= prompt + new tokens (at least 256, at most the model's max_position_embeddings),
    batch_size the batch given. Options named by Generator.generate go there; the rest
    (prefill_chunk, rules, extractor...) to the Generator."""
    gen_keys = {"attention_mask", "eos_token_id", "pad_token_id", "do_sample", "temperature",
                "top_k", "top_p", "generator"}
    call = {k: v for k, v in options.items() if k in gen_keys}
    build = {k: v for k, v in options.items() if k not in gen_keys}
    need = input_ids.shape[1] + max_new_tokens
    key = (input_ids.shape[0], tuple(sorted((k, repr(v)) for k, v in build.items())))
    cached = _GENERATORS.get(model, {}).get(key)
    if cached is None or cached.max_seq_len < need:
        size = max(256, 1 << (need - 1).bit_length())
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if limit is not None:
            size = min(size, limit)
        cached = Generator(model, size, batch_size=input_ids.shape[0], **build)
        _GENERATORS.setdefault(model, {})[key] = cached
    return cached.generate(input_ids, max_new_tokens, **call)
