"""ONNX Runtime GenAI as a peer: the same weights, prefill and decode side by side, per precision.

    .venv/bin/python benchmarks/ort_genai.py [--work DIR] [--pairs fp32,int8,int4,int4_dynamic]
        [--prompt 128] [--new 64] [--rounds 2] [--write]

Needs the bench extra (`onnxruntime-genai`). Never in the test path. ORT's own generation
loop, in place of a hand-written one: its model builder (`onnxruntime_genai.models.builder`,
CPU execution provider, its defaults) turns the TinyLlama-shaped bf16 checkpoint of
benchmarks/llamacpp.py into an ONNX model per precision: fp32; int8 and int4 as its
`MatMulNBits` weights in blocks of 32 (its CPU default `accuracy_level` 4: activations
quantized to int8 in the kernel; eqsat-llm's int4 and int4_dynamic, whose activations are
coded so too, both run against its int4). The builder wants a tokenizer; the checkpoint has
none (tokens are fed as ids), so a word-level one of the vocabulary's size is written beside
links to the shards, with `architectures` in its config.json. Its session runs `--threads` intra-op
threads (the machine's cores; left unset it ran one here). Each run a fresh process, the systems
alternated, best of `--rounds`: ORT GenAI's `append_tokens` (prefill) and
`generate_next_token` (decode), greedy; eqsat-llm's Generator as in llamacpp.py, on the same
prompt. Greedy tokens: how many agree with transformers' eager fp32 from the start.
--write puts the table into benchmarks/RESULTS.md ("ONNX Runtime GenAI side by side")."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp import (
    EAGER,
    EQSAT,
    agreeing,
    alternated,
    child,
    peer_parser,
    work_checkpoint,
    write_prompt,
)
from optimize_time import cpu_name, write_section

PAIRS = ("fp32", "int8", "int4", "int4_dynamic")
# eqsat-llm's format -> ORT GenAI's precision: its int4 codes the activations in 8 bits in
# the kernel (accuracy_level 4), as int4_dynamic does; weight-only int4 is run against it too
ORT_PRECISION = {"int4_dynamic": "int4"}

ORT = r"""
import json, sys, time
import torch, onnxruntime_genai as og
path, prompt_file, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = torch.load(prompt_file)[0].tolist()
model = og.Model(path)
params = og.GeneratorParams(model)
params.set_search_options(max_length=len(ids) + new, do_sample=False)
gen = og.Generator(model, params)
t0 = time.perf_counter()
gen.append_tokens(ids)
t1 = time.perf_counter()
for _ in range(new - 1):
    gen.generate_next_token()
t2 = time.perf_counter()
seq = [int(t) for t in gen.get_sequence(0)]
print(json.dumps({"prefill_ms": (t1 - t0) * 1e3, "decode_ms": (t2 - t1) * 1e3 / (new - 1),
                  "tokens": seq[len(ids):]}))
"""


def builder_input(ckpt: Path, out: Path) -> Path:
    """The checkpoint as the builder reads it: links to its shards, `architectures` in its
    config, and a word-level tokenizer of the vocabulary's size."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    for f in ckpt.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    config = json.loads((ckpt / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (out / "config.json").write_text(json.dumps(config, indent=1))
    vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, config["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="t1",
                            eos_token="t2").save_pretrained(str(out))
    return out


def build(source: Path, out: Path, precision: str, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i",
                           str(source), "-o", str(out), "-p", precision, "-e", "cpu", "-c",
                           str(out.parent / "builder-cache")], capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode:
        raise SystemExit(f"the builder failed for {precision}:\n{done.stderr[-3000:]}")


def threads(model: Path, n: int) -> None:
    """Its session's intra-op threads set to n: left unset, ORT GenAI ran one thread here
    (int4 decode 76.8 ms a token, 42.3 with 2 threads on this 2-core machine)."""
    path = model / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = n
    path.write_text(json.dumps(config, indent=4))


def main() -> None:
    args = peer_parser(__doc__.split("\n\n")[0], ",".join(PAIRS)).parse_args()
    import onnxruntime_genai as og
    import torch

    pairs = args.pairs.split(",")
    work, ckpt = work_checkpoint(args.work, "eqsat-ortgenai-", args.layers)
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CACHE_HOME=str(work / "cache"))
    source = builder_input(ckpt, work / "ortgenai-input")
    models = {}
    for fmt in pairs:
        precision = ORT_PRECISION.get(fmt, fmt)
        models[fmt] = work / f"ortgenai-{precision}"
        if not (models[fmt] / "genai_config.json").exists():
            build(source, models[fmt], precision, env)
        threads(models[fmt], args.threads)
        size = sum(f.stat().st_size for f in models[fmt].glob("model.onnx*"))
        print(f"{fmt}: {size / 1e9:.2f} GB", flush=True)
    common = (str(write_prompt(work, args.prompt)), str(args.new))
    eager = child(EAGER, str(ckpt), *common, env=env)["tokens"]
    t_start = time.time()
    best, tokens = alternated(pairs, {
        "eqsat-llm": lambda f: child(EQSAT, str(ckpt), f, *common, env=env),
        "ORT GenAI": lambda f: child(ORT, str(models[f]), *common, env=env)}, args.rounds)
    lines = [("| precision | ORT GenAI model | prefill ms, eqsat / ORT GenAI | ratio | decode "
              "ms/token, eqsat / ORT GenAI | ratio | greedy tokens = transformers fp32 (eqsat "
              "/ ORT GenAI) |"), "|---|---|---|---|---|---|---|"]
    names = {f: f"{f} / {ORT_PRECISION[f]}" if f in ORT_PRECISION else f for f in pairs}
    for fmt in pairs:
        e, o = best[(fmt, "eqsat-llm")], best[(fmt, "ORT GenAI")]
        size = sum(f.stat().st_size for f in models[fmt].glob("model.onnx*"))
        lines.append(
            f"| {names[fmt]} | {size / 1e9:.2f} GB | {e['prefill_ms']:.0f} / "
            f"{o['prefill_ms']:.0f} | "
            f"{e['prefill_ms'] / o['prefill_ms']:.2f}x | {e['decode_ms']:.1f} / "
            f"{o['decode_ms']:.1f} | {e['decode_ms'] / o['decode_ms']:.2f}x | "
            f"{agreeing(tokens[(fmt, 'eqsat-llm')], eager)} / "
            f"{agreeing(tokens[(fmt, 'ORT GenAI')], eager)} of {args.new} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        head = (f"Command: `.venv/bin/python benchmarks/ort_genai.py {' '.join(sys.argv[1:])}` "
                f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t_start))}, {cpu_name()}, "
                f"{platform.machine()}, {os.cpu_count()} cores; onnxruntime-genai "
                f"{og.__version__}, its builder's CPU defaults, {args.threads} intra-op "
                f"threads; torch {torch.__version__}). "
                f"TinyLlama-1.1B shape, {args.layers} layers, random bf16 weights; prompt "
                f"{args.prompt} tokens in one call, then {args.new} greedy tokens; each run a "
                f"fresh process, the systems alternated, best of {args.rounds} rounds. Ratio: "
                "eqsat-llm's time over ORT GenAI's (below 1: eqsat-llm faster).")
        write_section(head + "\n\n" + table,
                      "## ONNX Runtime GenAI side by side (benchmarks/ort_genai.py)")


if __name__ == "__main__":
    main()
