"""llama.cpp as a peer: the same weights, prefill and decode side by side, per precision.

    .venv/bin/python benchmarks/llamacpp.py [--layers 22] [--prompt 128] [--new 64]
        [--pairs fp32,bf16,int8,int4] [--rounds 2] [--threads N] [--write]
        [--isa avx2 --llama-lib DIR]
        (pairs: also int4_dynamic against Q4_0, and fp8_e4m3 against Q8_0: llama.cpp has no
        FP8 type, so that row puts eqsat-llm's fp8 beside its int8 in one run)

Needs the bench extra (`pip install -e '.[bench]'`: llama-cpp-python, whose source package
builds llama.cpp for this CPU, and gguf). Never in the test path. On a CPU with AMX, the
default (native) build of llama-cpp-python 0.3.36 crashed here (SIGSEGV in its first call on
a Q4_0 or Q8_0 file, after its AMX buffer repacked the weights; F16 and F32 ran): build it
without AMX,

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
      -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
      pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36

`--isa avx2` runs both systems as an AVX2 machine would, on a wider one: eqsat-llm with
EQSAT_ISA=avx2 (its C kernels compiled without AVX-512), llama.cpp from a build made without
AVX-512 (`--llama-lib`: the folder of its libllama.so, read through LLAMA_CPP_LIB_PATH),

    CMAKE_ARGS="<the flags above, with -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF \
      -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF>" pip install --no-cache-dir \
      --no-binary llama-cpp-python --no-deps --target DIR llama-cpp-python==0.3.36

(DIR/llama_cpp/lib is the folder; --no-cache-dir, or pip reuses the AVX-512 wheel it built
before). The run refuses a library whose system info names AVX512, and the table's section
is its own ("... AVX2 builds"). Memory and cores are the wider machine's.

(a native build with `-mno-amx-tile -mno-amx-int8 -mno-amx-bf16` decoded the same files no
faster: Q4_0 62.5 against 53.3 ms a token, Q8_0 72.7 against 67.3, F16 96.4 against ~92;
turning off its repacking buffers, `use_extra_bufts=False`, made Q4_0 slower, 73.5 ms).

1. A TinyLlama-1.1B-shaped LLaMA checkpoint (d 2048, 22 layers, 32 heads, 4 KV heads, FFN
   5632, vocab 32000) with random bf16 weights (checkpoint_memory.write_checkpoint).
2. The same weights as an F32 GGUF (arch "llama"; q and k rows permuted from transformers'
   half-split rotary layout to llama.cpp's interleaved one, as llama.cpp's own converter
   does; a synthetic SentencePiece vocabulary, since tokens are fed as ids), then
   llama.cpp's own quantizer (`llama_model_quantize`, its default parameters, as its
   `llama-quantize` tool runs) makes the F16, Q8_0 and Q4_0 files. Its defaults keep some
   tensors wider (the output matrix of a Q4_0 file is Q6_K): file sizes in the table.
3. Correctness: greedy tokens of llama.cpp F32 and of eqsat-llm fp32 against transformers'
   eager fp32 on the prompt (tokens agreeing from the start, of `new`).
4. Timing: pairs eqsat-llm fp32 / llama.cpp F32, bf16 (the checkpoint's own bf16 model) / F16,
   int8 / Q8_0, int4 (int4_g32) / Q4_0, int4_dynamic (int4_g32 weights, activations coded per
   block of 32 in 8 bits where the byte product pays: decode) / Q4_0 (whose product codes
   the activations so too, as Q8_0). Each run is a fresh process: the prompt in one call
   (prefill ms), then `new` greedy tokens, one call each (decode ms a token: the calls after
   the first token, which comes from the prefill). Rounds alternate the systems; the best of
   `rounds` is kept for each. Both at their defaults but the thread count: llama-cpp-python
   starts half the cores, set here to all (`--threads`, default the CPU count), which is
   what eqsat-llm's programs use (its prompt goes in chunks of 64 tokens, llama.cpp's in
   one batch of up to 512). eqsat-llm's start (compile, weights) is outside the
   timings, and so is the background move of its weights onto 2 MiB pages that follows it
   (docs/c-backend.md); its program and C caches are warm after the first round.
--write puts the table in benchmarks/RESULTS.md ("llama.cpp side by side").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoint_memory import SHAPES, write_checkpoint
from optimize_time import cpu_name, write_section

# eqsat-llm precision -> (llama.cpp file type, its name in llama.h's enum llama_ftype)
PAIRS = {"fp32": ("F32", "LLAMA_FTYPE_ALL_F32"), "bf16": ("F16", "LLAMA_FTYPE_MOSTLY_F16"),
         "int8": ("Q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0"),
         "int4": ("Q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0"),
         "int4_dynamic": ("Q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0"),
         # llama.cpp has no FP8 file type: fp8 runs against its 8-bit one, beside int8's row
         "fp8_e4m3": ("Q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0"),
         "fp8_e4m3_g128": ("Q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0")}


# --- the GGUF files ---------------------------------------------------------------------------
def _gguf_name(name: str) -> str:
    """llama.cpp's tensor name for a transformers LLaMA weight."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    if name in fixed:
        return fixed[name]
    parts = name.split(".")  # model.layers.{i}.{module}.{proj}.weight
    i, rest = parts[2], ".".join(parts[3:])
    return f"blk.{i}." + {
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight"}[rest]


def _interleave_rotary(w, heads: int):
    """Rows of a q or k projection from the half-split rotary layout (transformers) to the
    interleaved one (llama.cpp's LLaMA): per head, rows (j, j + half) become (2j, 2j + 1)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def write_gguf(ckpt: Path, out: Path) -> None:
    """The checkpoint's weights as an F32 GGUF file (exact: bf16 values widen exactly),
    written under a temporary name and renamed when whole."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    cfg = json.loads((ckpt / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    part = out.with_suffix(".part")
    w = gguf.GGUFWriter(str(part), "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(float((cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = cfg["vocab_size"]  # <unk> <s> </s>, the 256 byte tokens, then plain pieces
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    kinds = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + \
        [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (vocab - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(kinds)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    for shard in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is no dict
                t = f.get_tensor(name).float().numpy()
                if name.endswith("q_proj.weight"):
                    t = _interleave_rotary(t, heads)
                elif name.endswith("k_proj.weight"):
                    t = _interleave_rotary(t, kv_heads)
                w.add_tensor(_gguf_name(name), np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    part.rename(out)


def quantize_gguf(f32: Path, out: Path, ftype: str) -> None:
    """llama.cpp's own quantizer, its default parameters but the type."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    params.nthread = os.cpu_count() or 1
    part = out.with_suffix(".part")
    if llama_cpp.llama_model_quantize(str(f32).encode(), str(part).encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize to {ftype} failed")
    part.rename(out)


# --- one timed run per process -----------------------------------------------------------------
LLAMA = r"""
import json, sys, time
import numpy as np, llama_cpp, torch
path, prompt_file, new, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids = torch.load(prompt_file)[0].tolist()
llm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + new, n_threads=threads,
                      n_threads_batch=threads, verbose=False)
isa = llama_cpp.llama_print_system_info().decode()
out = []
def argmax():  # the last token's logits (Llama.eval keeps none without logits_all)
    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
t0 = time.perf_counter()
llm.eval(ids)
out.append(argmax())
t1 = time.perf_counter()
for _ in range(new - 1):
    llm.eval([out[-1]])
    out.append(argmax())
t2 = time.perf_counter()
print(json.dumps({"prefill_ms": (t1 - t0) * 1e3, "decode_ms": (t2 - t1) * 1e3 / (new - 1),
                  "tokens": out, "system_info": isa}))
"""

EQSAT = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from eqsat_llm.generation.generator import Generator
path, fmt, prompt_file, new = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ids = torch.load(prompt_file)
dtype = torch.float32 if fmt == "fp32" else None
quantize = None if fmt in ("fp32", "bf16") else fmt
gen = Generator.from_pretrained(path, max_seq_len=ids.shape[1] + new, quantize=quantize,
                                dtype=dtype)
for program in (gen.prefill_program, gen.decode_program):  # weights on 2 MiB pages: the
    if program._runtime.huge_pages is not None:         # background move, a second or two
        program._runtime.huge_pages.join()
out = gen.generate(ids, max_new_tokens=new, eos_token_id=[])
run = gen.report.last_run
print(json.dumps({"prefill_ms": run["prefill_s"] * 1e3,
                  "decode_ms": run["decode_s"] * 1e3 / (new - 1),
                  "tokens": out[0, ids.shape[1]:].tolist()}))
"""

EAGER = r"""
import json, sys, torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
ids, new = torch.load(sys.argv[2]), int(sys.argv[3])
out, cache = [], transformers.DynamicCache(config=model.config)
with torch.no_grad():
    x = ids
    for _ in range(new):
        logits = model(x, past_key_values=cache, use_cache=True).logits[0, -1]
        out.append(int(logits.argmax()))
        x = torch.tensor([[out[-1]]])
print(json.dumps({"tokens": out}))
"""


def child(code: str, *args: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=env, check=False)
    if out.returncode:
        raise SystemExit(f"{args}: the run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def agreeing(a: list[int], b: list[int]) -> int:
    """How many tokens agree from the start."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# --- what every generation peer's benchmark shares (also benchmarks/ort_genai.py) -------------
def peer_parser(description: str, pairs: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--pairs", default=pairs)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--work", type=Path, help="keep the files here (default: a temp dir)")
    p.add_argument("--write", action="store_true")
    return p


def work_checkpoint(work: Path | None, prefix: str, layers: int) -> tuple[Path, Path]:
    """(the work folder, the TinyLlama-shaped bf16 checkpoint in it, written once)"""
    work = work or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "ckpt"
    if not (ckpt / "config.json").exists():
        ckpt.mkdir(exist_ok=True)
        write_checkpoint(ckpt, SHAPES["tinyllama"], layers)
    return work, ckpt


def write_prompt(work: Path, tokens: int) -> Path:
    import torch

    prompt = work / "prompt.pt"
    torch.save(torch.randint(3, 30000, (1, tokens),
                             generator=torch.Generator().manual_seed(1)), prompt)
    return prompt


def alternated(pairs: list[str], runs: dict[str, Callable[[str], dict]], rounds: int
               ) -> tuple[dict[tuple[str, str], dict], dict[tuple[str, str], list[int]]]:
    """Each system's run per precision, `rounds` times, the systems' order alternated from
    round to round: (the best prefill and decode ms per (precision, system), the tokens of the
    last run)."""
    best: dict[tuple[str, str], dict] = {}
    tokens: dict[tuple[str, str], list[int]] = {}
    for r in range(rounds):
        for fmt in pairs:
            for system, run in list(runs.items())[::1 if r % 2 == 0 else -1]:
                got = run(fmt)
                print(f"round {r}: {fmt} {system}: prefill {got['prefill_ms']:.0f} ms, "
                      f"decode {got['decode_ms']:.1f} ms/token", flush=True)
                tokens[(fmt, system)] = got["tokens"]
                old = best.get((fmt, system))
                best[(fmt, system)] = {k: min(got[k], old[k]) if old else got[k]
                                       for k in ("prefill_ms", "decode_ms")}
    return best, tokens


def main() -> None:
    p = peer_parser(__doc__.split("\n\n")[0], "fp32,bf16,int8,int4")
    p.add_argument("--isa", choices=("native", "avx2"), default="native",
                   help="avx2: both systems built without AVX-512 (the docstring says how)")
    p.add_argument("--llama-lib", type=Path, help="llama.cpp's library folder (--isa avx2)")
    p.add_argument("--section", help="the RESULTS section --write replaces (default: the "
                   "side-by-side section of --isa; a subset of the pairs gets its own)")
    args = p.parse_args()
    import llama_cpp
    import torch

    pairs = args.pairs.split(",")
    work, ckpt = work_checkpoint(args.work, "eqsat-llamacpp-", args.layers)
    f32 = work / "model-F32.gguf"
    if not f32.exists():
        write_gguf(ckpt, f32)
    files = {}
    for fmt in pairs:
        kind, ftype = PAIRS[fmt]
        files[fmt] = f32 if kind == "F32" else work / f"model-{kind}.gguf"
        if not files[fmt].exists():
            quantize_gguf(f32, files[fmt], ftype)
        print(f"{kind}: {files[fmt].stat().st_size / 1e9:.2f} GB", flush=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CACHE_HOME=str(work / "cache"))
    eqsat_env, llama_env = isa_environments(args, env)
    common = (str(write_prompt(work, args.prompt)), str(args.new))
    eager = child(EAGER, str(ckpt), *common, env=env)["tokens"]
    t_start = time.time()
    system_info: list[str] = []

    def llama(fmt: str) -> dict:
        got = child(LLAMA, str(files[fmt]), *common, str(args.threads), env=llama_env)
        if args.isa == "avx2" and "AVX512 = 1" in got["system_info"]:
            raise SystemExit(f"--isa avx2: the llama.cpp library uses AVX-512: "
                             f"{got['system_info']}")
        system_info[:] = [got["system_info"]]
        return got

    best, tokens = alternated(pairs, {
        "eqsat-llm": lambda f: child(EQSAT, str(ckpt), f, *common, env=eqsat_env),
        "llama.cpp": llama}, args.rounds)
    lines = [("| eqsat-llm / llama.cpp | file (llama.cpp) | prefill ms, eqsat / llama.cpp | "
              "ratio | decode ms/token, eqsat / llama.cpp | ratio | greedy tokens = "
              "transformers fp32 (eqsat / llama.cpp) |"), "|---|---|---|---|---|---|---|"]
    for fmt in pairs:
        e, c = best[(fmt, "eqsat-llm")], best[(fmt, "llama.cpp")]
        kind = PAIRS[fmt][0]
        lines.append(
            f"| {fmt} / {kind} | {files[fmt].stat().st_size / 1e9:.2f} GB | "
            f"{e['prefill_ms']:.0f} / {c['prefill_ms']:.0f} | "
            f"{e['prefill_ms'] / c['prefill_ms']:.2f}x | {e['decode_ms']:.1f} / "
            f"{c['decode_ms']:.1f} | {e['decode_ms'] / c['decode_ms']:.2f}x | "
            f"{agreeing(tokens[(fmt, 'eqsat-llm')], eager)} / "
            f"{agreeing(tokens[(fmt, 'llama.cpp')], eager)} of {args.new} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        built = ("both built without AVX-512 (EQSAT_ISA=avx2; llama.cpp's system info: "
                 f"{system_info[0].strip()})" if args.isa == "avx2" else
                 "llama.cpp built from source for this CPU")
        head = (f"Command: `.venv/bin/python benchmarks/llamacpp.py {shlex.join(sys.argv[1:])}` "
                f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t_start))}, {cpu_name()}, "
                f"{platform.machine()}, {os.cpu_count()} cores; llama-cpp-python "
                f"{llama_cpp.__version__}, {built}, {args.threads} threads; "
                f"torch {torch.__version__}). TinyLlama-1.1B shape, {args.layers} layers, random "
                f"bf16 weights; prompt {args.prompt} tokens in one call, then {args.new} greedy "
                f"tokens; each run a fresh process, the systems alternated, best of "
                f"{args.rounds} rounds. Ratio: eqsat-llm's time over llama.cpp's (below 1: "
                "eqsat-llm faster). Greedy tokens: how many agree with transformers' eager fp32 "
                "from the start (random weights leave near-ties: a lower precision drifts "
                "early).")
        title = args.section or ("## llama.cpp side by side (benchmarks/llamacpp.py)"
                                 if args.isa == "native" else
                                 "## llama.cpp side by side, AVX2 builds (benchmarks/llamacpp.py "
                                 "--isa avx2)")
        write_section(head + "\n\n" + table, title)


def isa_environments(args: argparse.Namespace, env: dict[str, str]
                     ) -> tuple[dict[str, str], dict[str, str]]:
    """(eqsat-llm's environment, llama.cpp's) for --isa."""
    if args.isa == "native":
        return env, env
    if args.llama_lib is None or not (args.llama_lib / "libllama.so").exists():
        raise SystemExit("--isa avx2 needs --llama-lib: the folder of a llama.cpp built "
                         "without AVX-512 (the docstring says how)")
    return dict(env, EQSAT_ISA="avx2"), dict(env, LLAMA_CPP_LIB_PATH=str(args.llama_lib))


if __name__ == "__main__":
    main()
