"""Generating from a checkpoint directory: peak memory and start-up, per precision.

    .venv/bin/python benchmarks/checkpoint_memory.py [--shape tinyllama|llama7b|mixtral_large]
        [--layers N]
        [--formats bf16,int8,int4] [--loaded] [--warm] [--check-logits] [--write]
        (formats: fp32 too, the bf16 checkpoint's values widened: dtype=torch.float32)

Writes a LLaMA-shaped checkpoint in bf16 with random weights layer by layer (one shard a layer:
never the whole model in memory; mixtral_large: the model built whole and written by
transformers' save_pretrained, its experts one tensor each), then for each format runs, in a
fresh process, `Generator.from_pretrained(dir, max_seq_len=256, quantize=...)` and a 16-token
prompt with 16 new tokens, and reports the process's peak RSS beside what it must hold (the
prepared weights, the KV cache, the two arenas) and the bare `import eqsat_llm, torch` process.
A start is the Generator's construction (from_pretrained) in that process; its imports are
timed apart. "(peak - bare) / held" is the issue's measure (peak <= 1.15 x held + bare). The
child peak is the largest child process's (the parallel start's optimizer, or gcc). With
--loaded, transformers loads the checkpoint first and `Generator(model, ...)` prepares from the
loaded model's tensors: the table says what the Generator adds to the model. --write puts the
table into benchmarks/RESULTS.md ("Generating from a checkpoint" or "from a loaded model").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPES = {
    "tinyllama": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                  "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000},
    "llama7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000},
    # a mixture of experts (model_matrix.MIXTRAL_LARGE: 8 experts of FFN 3584, top-2), written
    # by transformers' save_pretrained: one tensor per expert, converted as it loads
    "mixtral_large": {"moe": True, "num_hidden_layers": 4, "vocab_size": 32000},
}


def write_checkpoint(path: Path, shape: dict, layers: int) -> int:
    """config.json and one bf16 safetensors shard per layer (and one for the rest), random
    weights; returns the checkpoint's bytes."""
    import torch
    import transformers
    from safetensors.torch import save_file

    if shape.get("moe"):  # small enough to build whole (1.7 GB fp32)
        from eqsat_llm.models.model_matrix import mixtral_large

        model = mixtral_large().to(torch.bfloat16)
        model.config.use_cache = True
        model.save_pretrained(path)
        return sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = transformers.LlamaConfig(**(shape | {"num_hidden_layers": layers}),
                                   max_position_embeddings=2048, rms_norm_eps=1e-5,
                                   tie_word_embeddings=False, dtype="bfloat16")
    cfg.save_pretrained(path)
    d, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = d // shape["num_attention_heads"] * shape["num_key_value_heads"]
    gen = torch.Generator().manual_seed(0)

    def rand(*s: int) -> torch.Tensor:
        return (torch.randn(*s, generator=gen) * 0.02).to(torch.bfloat16)

    def layer(i: int) -> dict[str, torch.Tensor]:
        if i == layers:
            return {"model.embed_tokens.weight": rand(v, d), "model.norm.weight":
                    torch.ones(d, dtype=torch.bfloat16), "lm_head.weight": rand(v, d)}
        p = f"model.layers.{i}."
        return {p + "self_attn.q_proj.weight": rand(d, d),
                p + "self_attn.k_proj.weight": rand(kv, d),
                p + "self_attn.v_proj.weight": rand(kv, d),
                p + "self_attn.o_proj.weight": rand(d, d),
                p + "mlp.gate_proj.weight": rand(f, d),
                p + "mlp.up_proj.weight": rand(f, d),
                p + "mlp.down_proj.weight": rand(d, f),
                p + "input_layernorm.weight": torch.ones(d, dtype=torch.bfloat16),
                p + "post_attention_layernorm.weight": torch.ones(d, dtype=torch.bfloat16)}

    weight_map, total, n = {}, 0, layers + 1
    for k in range(n):  # one shard made, written and dropped at a time
        tensors = layer(k)
        name = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


CHILD = r"""
import json, resource, sys, time, warnings
t0 = time.perf_counter()
warnings.filterwarnings("ignore")
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
import torch, eqsat_llm
from eqsat_llm.generation.generator import Generator
bare, import_s = rss(), time.perf_counter() - t0
path, fmt, loaded = sys.argv[1], sys.argv[2], sys.argv[3] == "loaded"
quantize = None if fmt in ("bf16", "fp32") else fmt
dtype = torch.float32 if fmt == "fp32" else torch.bfloat16  # fp32: the bf16 values widened
model_bytes, model_s, own, load_rss = 0, 0.0, set(), 0
if loaded:  # transformers loads the model (bf16); the Generator prepares from its tensors
    import transformers
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model_s = time.perf_counter() - t
    load_rss = rss()  # what transformers' loading leaves, before the Generator starts
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
t = time.perf_counter()
gen = Generator(model, max_seq_len=256, quantize=quantize) if loaded else \
    Generator.from_pretrained(path, max_seq_len=256, quantize=quantize, dtype=dtype)
start = time.perf_counter() - t
programs = (gen.decode_program, gen.prefill_program)
held = {w.untyped_storage().data_ptr(): w.untyped_storage().nbytes()
        for p in programs for w in p._runtime.weights
        if w.untyped_storage().data_ptr() not in own}
ids = torch.randint(3, 30000, (1, 16), generator=torch.Generator().manual_seed(1))
for program in programs:  # the background move of the weights onto 2 MiB pages: done
    if program._runtime.huge_pages is not None:
        program._runtime.huge_pages.join()
gen.generate(ids, max_new_tokens=16)
run = gen.report.last_run
if len(sys.argv) > 4:  # the next-token logits of the check's prompts, for --check-logits
    prompts = torch.load(sys.argv[4])
    torch.save(torch.cat([gen.next_token_logits(p[None]) for p in prompts]), sys.argv[5])
print(json.dumps({"format": fmt, "bare": bare, "model": model_bytes, "model_s": model_s,
    "load_rss": load_rss,
    "weights_from": gen.report.weights_from, "peak": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss * 1024, "prepared": sum(held.values()),
    "child_peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    "decode_optimized": gen.report.decode_optimized,
    "stamped": [p.report.stamped_calls for p in programs],
    "prefill_optimized": gen.report.prefill_optimized,
    "decode_prepared": sum({w.untyped_storage().data_ptr(): w.untyped_storage().nbytes()
                            for w in gen.decode_program._runtime.weights
                            if w.untyped_storage().data_ptr() not in own}.values()),
    "cache": gen.report.cache_bytes, "arenas": sum(p.plan.arena_bytes for p in programs),
    "start_s": start, "import_s": import_s, "read_bytes": gen.report.weights_read_bytes,
    # the weights' own seconds: loading less the C compile it includes (a cold cache's)
    "load_s": gen.load_seconds - sum(p._runtime.compile_seconds for p in programs)
              if gen.load_seconds else None,  # (folded: made while optimizing)
    "program_cache": gen.decode_program.report.program_cache, "decode_tok_s": run["new_tokens"] /
    run["decode_s"] if run["decode_s"] else None}))
"""


EAGER = r"""
import resource, sys, torch, transformers
from eqsat_llm.formats.quant_formats import dequantize, quantize
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
fmt = {"int4": "int4_g32"}.get(sys.argv[4], sys.argv[4])
if fmt not in ("bf16", "fp32"):  # every linear layer's weight as the format stores it
    # (x @ W: W is [K, N])
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            w = m.weight.data
            m.weight.data = dequantize(*quantize(w.t(), fmt), fmt).t().to(w.dtype)
with torch.no_grad():
    logits = model(torch.load(sys.argv[2])).logits[:, -1].float()
torch.save(logits, sys.argv[3])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""
PROMPTS = 8  # prompts of 16 tokens whose next-token logits --check-logits compares


def measure(path: Path, fmt: str, logits: Path | None, warm: bool, mode: str) -> dict:
    """One format in a fresh process, with an empty compile and program cache (a cold
    start); with `warm`, a second fresh process after it (the caches filled) for the warm
    start. `mode`: "checkpoint" (from_pretrained) or "loaded" (transformers loads it)."""
    extra = [mode] + ([str(logits.parent / "prompts.pt"), str(logits)] if logits else [])
    caches = Path(tempfile.mkdtemp(prefix="eqsat-cold-"))
    calibration = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
        "eqsat-llm" / "calibration"
    if calibration.is_dir():  # the machine's calibration kept: the cost model is the same
        shutil.copytree(calibration, caches / "eqsat-llm" / "calibration")
    cold = json.loads(_child(CHILD, str(path), fmt, *extra, cache=caches).strip()
                      .splitlines()[-1])
    if warm:
        again = json.loads(_child(CHILD, str(path), fmt, mode, cache=caches).strip()
                           .splitlines()[-1])
        cold["warm_start_s"], cold["warm_load_s"] = again["start_s"], again["load_s"]
        cold["warm_cache"], cold["warm_import_s"] = again["program_cache"], again["import_s"]
    shutil.rmtree(caches, ignore_errors=True)
    return cold


def _child(code: str, *args: str, cache: Path | None = None) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=env, check=False)
    if out.returncode:
        raise SystemExit(f"{args}: the run failed:\n{out.stderr[-3000:]}")
    return out.stdout


def compare_logits(path: Path, work: Path, formats: list[str]) -> list[str]:
    """transformers' own bf16 run of the checkpoint (fresh processes, after ours), against
    each format's next-token logits over PROMPTS prompts: the largest difference over the
    largest |logit|, the worst prompt's cosine, and whether the top token agrees; once
    against the checkpoint's weights, once against them stored in the format (each linear
    layer's weight quantized and dequantized: the program's own error, apart from the
    format's)."""
    import torch

    peak, want = 0, {}
    for ref in ["bf16", *[f for f in formats if f != "bf16"]]:
        out = work / f"eager-{ref}.pt"
        peak = max(peak, int(_child(EAGER, str(path), str(work / "prompts.pt"), str(out), ref)
                             .strip().splitlines()[-1]))
        want[ref] = torch.load(out)
    lines = [(f"Logits against transformers' own bf16 run of the checkpoint ({PROMPTS} "
              f"prompts of 16 tokens, the next token's logits; transformers' peak RSS "
              f"{peak / 1e9:.1f} GB). Against the checkpoint's weights, and against them "
              "stored in the format (each linear weight quantized and dequantized, then bf16):"),
             "",
             ("| format | against | max abs diff / max abs logit | cosine (worst prompt) | "
             "top-1 agrees |"),
             "|---|---|---|---|---|"]
    for fmt in formats:
        got = torch.load(work / f"{fmt}.pt")
        for ref in dict.fromkeys(["bf16", fmt]):
            w = want[ref]
            rel = float((got - w).abs().max() / w.abs().max())
            cos = float(torch.nn.functional.cosine_similarity(got, w, dim=-1).min())
            top1 = int((got.argmax(-1) == w.argmax(-1)).sum())
            what = "the checkpoint" if ref == "bf16" else f"the weights in {fmt}"
            lines.append(f"| {fmt} | {what} | {rel:.3f} | {cos:.4f} | {top1} of {PROMPTS} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tinyllama", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--formats", default="bf16,int8,int4")
    ap.add_argument("--dir", default=None, help="reuse or keep the checkpoint here")
    ap.add_argument("--check-logits", action="store_true",
                    help="compare each format's logits with transformers' run, after")
    ap.add_argument("--warm", action="store_true",
                    help="start each format a second time, its programs cached (warm start)")
    ap.add_argument("--loaded", action="store_true",
                    help="load the model with transformers first and pass it to Generator "
                    "(weights from the loaded model), instead of from_pretrained")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    mode = "loaded" if args.loaded else "checkpoint"
    shape = SHAPES[args.shape]
    layers = args.layers or shape["num_hidden_layers"]
    root = Path(args.dir or tempfile.mkdtemp(prefix="eqsat-ckpt-"))
    if not (root / "config.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        size = write_checkpoint(root, shape, layers)
    else:
        size = sum(f.stat().st_size for f in root.glob("*.safetensors"))
    formats = args.formats.split(",")
    work = Path(tempfile.mkdtemp(prefix="eqsat-logits-")) if args.check_logits else None
    if work:
        import torch

        torch.save(torch.randint(3, shape["vocab_size"], (PROMPTS, 16),
                                 generator=torch.Generator().manual_seed(2)),
                   work / "prompts.pt")
    rows = [measure(root, fmt, work / f"{fmt}.pt" if work else None, args.warm, mode)
            for fmt in formats]
    lines = [(f"{args.shape} shape, {layers} layers, bf16 checkpoint of {size / GB:.2f} GB, "
              "max_seq_len 256; peak RSS of a fresh process"),
             ""]
    if args.loaded:
        lines += loaded_table(rows)
    else:
        lines += checkpoint_table(rows)
    if work:
        lines += [""] + compare_logits(root, work, formats)
    table = "\n".join(lines)
    print(table)
    if args.write:
        import datetime

        from optimize_time import write_section

        from eqsat_llm.extraction.machine import cpu_model

        cpu = cpu_model()
        head = (f"Command: `.venv/bin/python benchmarks/checkpoint_memory.py "
                f"{' '.join(sys.argv[1:])}` ({datetime.date.today()}, {cpu}, "
                f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end).")
        what = "a loaded model" if args.loaded else "a checkpoint"
        write_section(head + "\n\n" + table, f"## Generating from {what}: the {args.shape} shape")


GB = 1e9


def _seconds(s: float | None) -> str:
    return "while optimizing" if s is None else f"{s:.1f}"


def loaded_table(rows: list[dict]) -> list[str]:
    """The loaded model's rows: what the Generator adds to the model transformers holds."""
    lines = [("The model loaded by transformers (bf16), then `Generator(model, max_seq_len=256, "
              "quantize=...)`: the prepared weights are those not the model's own tensors; the "
              "overhead is the peak less everything held (bare process, model, prepared, cache "
              "and arenas); of it, transformers' loading leaves the RSS after its load less the "
              "bare process and the model, before the Generator starts."),
             "",
             ("| format | peak RSS GB | model GB | prepared GB | KV cache + arenas GB | bare GB "
              "| overhead GB | RSS after transformers' load GB (left by it) | weights from "
              "| transformers load s | Generator start s (weights s) | warm start s "
              "| decode tok/s |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        held = r["bare"] + r["model"] + r["prepared"] + r["cache"] + r["arenas"]
        warm = f"{r['warm_start_s']:.1f}" if "warm_start_s" in r else "not run"
        lines.append(f"| {r['format']} | {r['peak'] / GB:.2f} | {r['model'] / GB:.2f} | "
                     f"{r['prepared'] / GB:.2f} | {(r['cache'] + r['arenas']) / GB:.2f} | "
                     f"{r['bare'] / GB:.2f} | {(r['peak'] - held) / GB:.2f} | "
                     f"{r['load_rss'] / GB:.2f} "
                     f"({(r['load_rss'] - r['bare'] - r['model']) / GB:.2f}) | "
                     f"{r['weights_from']} | {r['model_s']:.1f} | {r['start_s']:.1f} "
                     f"({_seconds(r['load_s'])}) | {warm} | {r['decode_tok_s'] or 0:.1f} |")
    return lines


def checkpoint_table(rows: list[dict]) -> list[str]:
    lines = [
             ("| format | peak RSS GB | prepared weights GB (decode's) | KV cache + arenas GB "
              "| bare process GB | (peak - bare) / held | cold start s (weights s, GB/s read) "
              "| programs optimized: decode, prefill (largest child's peak GB; layer calls "
              "spliced at capture) "
              "| warm start s (weights s) | imports s (cold, warm) | decode tok/s |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        held = r["prepared"] + r["cache"] + r["arenas"]
        warm = (f"{r['warm_start_s']:.1f} ({_seconds(r['warm_load_s'])}; program cache "
                f"{r['warm_cache']})" if "warm_start_s" in r else "not run")
        imports = f"{r['import_s']:.1f}" + (f", {r['warm_import_s']:.1f}"
                                           if "warm_import_s" in r else "")
        lines.append(f"| {r['format']} | {r['peak'] / GB:.2f} | {r['prepared'] / GB:.2f} "
                     f"({r['decode_prepared'] / GB:.2f}) | {(r['cache'] + r['arenas']) / GB:.2f} "
                     f"| {r['bare'] / GB:.2f} | {(r['peak'] - r['bare']) / held:.2f} | "
                     f"{r['start_s']:.1f} ({_seconds(r['load_s'])}, "
                     f"{r['read_bytes'] / GB / max(r['load_s'] or 0, 1e-9):.2f}) | "
                     f"{r['decode_optimized']}, {r['prefill_optimized']} "
                     f"({r['child_peak'] / GB:.2f}; {' + '.join(map(str, r['stamped']))}) "
                     f"| {warm} | "
                     f"{imports} | {r['decode_tok_s'] or 0:.1f} |")
    return lines


if __name__ == "__main__":
    main()
