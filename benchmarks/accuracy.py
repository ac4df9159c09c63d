"""Accuracy of quantized programs on a model with trained weights: a small byte-level
LLaMA (transformers.LlamaForCausalLM) trained here, offline, on the Python standard library's
own source, then compiled by eqsat-llm in fp32, int8 and int4 and compared with eager fp32.

    .venv/bin/python benchmarks/accuracy.py [--steps 300] [--cache-dir DIR] [--quick]
        [--write] [--max-load 1.0] [--wait-load 600]

No checkpoint can be downloaded, and random weights say little about quantization (their logits
are near-tied and their weights have no outliers), so the model is trained: hidden 256, 4
layers, 8 heads / 2 KV heads (grouped-query attention), FFN 704, vocab 256 (a token is a
byte), sdpa attention, ~3M parameters; AdamW from a fixed seed on 16 x 128-byte windows drawn
from the stdlib's *.py files (sysconfig's "stdlib" path; site-packages/ and the test suite
test/ left out; sorted by path, every 10th file held out for evaluation). It takes ~4 minutes
on one thread; the state_dict is cached under ~/.cache/eqsat-llm/accuracy/ (or
$EQSAT_LLM_ACCURACY_CACHE, or --cache-dir), keyed by a hash of the config, the training
settings and the training bytes (the stdlib differs between Python versions), so a rerun
skips training.

Systems, each compiled once with `eqsat_llm.optimize(model, (input_ids,), quantize=...,
measure_eager=False)` on the first held-out batch (4 x 128 bytes) and run on every held-out
batch (8 of them: 4096 positions); `model` is the torch.export capture that optimize makes
itself (eqsat_llm.capture.export.export, once per weights: it is most of a compile's time here):
eager fp32, eqsat fp32, int8, fp8_e4m3, fp8_e5m2, fp8_e4m3_g128, int4 (= int4_g32), int4_g64,
int4_g128, int8 with
keep_float=["lm_head"], int8_dynamic (activations coded per row in 7 bits too: the 4 x 128
batch is prefill-sized, so its GEMMs multiply integers) and int4_dynamic (int4_g32 weights,
activations coded per block of 32 in 8 bits: with AVX-512 its prefill GEMMs multiply bytes,
without it the cost model keeps int4_g32 there and the row is int4's).
Per system: top-1 next-byte
agreement with eager fp32 over all positions, the largest and the mean |logit error| over the
largest |eager logit|, the held-out cross-entropy (nats and bits per byte), next-byte accuracy,
and how many of the program's GEMMs read integer weights. The same rows for the untrained
model (the same config and seed, random init) show what trained weights change.
`--quick`: a smaller model (hidden 128, 1 layer, FFN 256), a few training steps and one
2 x 64 batch: a smoke test, not a measurement.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized import parse_args, write_results

from eqsat_llm import optimize
from eqsat_llm.capture.export import export
from eqsat_llm.formats.quant_formats import DYNAMIC_STORED
from eqsat_llm.formats.quant_formats import FORMATS as QUANT_FORMATS
from eqsat_llm.models.model_matrix import Logits

SECTION = "## Accuracy of quantized programs: a byte-level LLaMA trained on the stdlib"

CONFIG = {"hidden": 256, "layers": 4, "heads": 8, "kv": 2, "ffn": 704, "vocab": 256}
CONFIG_QUICK = {"hidden": 128, "layers": 1, "heads": 4, "kv": 2, "ffn": 256, "vocab": 256}
TRAIN = {"batch": 16, "seq": 128, "lr": 2e-3, "betas": (0.9, 0.95), "weight_decay": 0.1,
         "warmup": 20, "final_lr_frac": 0.1, "clip": 1.0, "seed": 0, "version": 1}
STEPS, STEPS_QUICK = 300, 20
EVAL = {"batch": 4, "seq": 128, "batches": 8}
EVAL_QUICK = {"batch": 2, "seq": 64, "batches": 1}
HOLD_OUT_EVERY = 10  # every 10th file (sorted by path) is held out
CACHED_NOTE = " (when it was trained; loaded from the cache here)"

# (label, quantize, keep_float)
SYSTEMS = [("eager fp32", None, ()), ("eqsat fp32", None, ()), ("eqsat int8", "int8", ()),
           ("eqsat fp8_e4m3", "fp8_e4m3", ()), ("eqsat fp8_e5m2", "fp8_e5m2", ()),
           ("eqsat fp8_e4m3_g128", "fp8_e4m3_g128", ()),
           ("eqsat int4 (g32)", "int4", ()),
           ("eqsat int4_g64", "int4_g64", ()),
           ("eqsat int4_g128", "int4_g128", ()),
           ("eqsat int8, lm_head float", "int8", ("model.lm_head",)),
           ("eqsat int8_dynamic", "int8_dynamic", ()),
           ("eqsat int4_dynamic", "int4_dynamic", ())]
# (keep_float names parameters as the module given to optimize names them: the model is
# wrapped in model_matrix.Logits, so its LM head is "model.lm_head", not "lm_head")


@dataclass
class Row:
    model: str  # "trained" or "untrained"
    system: str
    top1_agreement: float  # argmax agrees with eager fp32's, over all held-out positions
    max_rel: float  # max |logits - eager| / max |eager logits|
    mean_rel: float  # mean |logits - eager| / max |eager logits|
    loss: float  # held-out cross-entropy, nats per byte
    bits_per_byte: float
    accuracy: float  # next byte predicted (argmax == the actual next byte)
    quantized_gemms: int | None  # GEMMs reading integer weights (None: eager)
    gemms: int | None  # GEMMs with a constant weight in the program
    note: str = ""


# --- data ------------------------------------------------------------------------------------
def stdlib_files() -> tuple[Path, list[Path]]:
    """The stdlib's *.py files, sorted by path; site-packages/ and test/ left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p for p in root.rglob("*.py")
                    if p.relative_to(root).parts[0] not in ("site-packages", "test")),
                   key=lambda p: p.relative_to(root).as_posix())
    return root, files


def corpus() -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(training bytes, held-out bytes, a description): the files' bytes, concatenated."""
    root, files = stdlib_files()
    train, held = [], []
    for i, p in enumerate(files):
        (held if i % HOLD_OUT_EVERY == 0 else train).append(p.read_bytes())
    tr, ho = b"".join(train), b"".join(held)
    info = {"root": str(root), "python": platform.python_version(), "files": len(files),
            "train_files": len(train), "held_out_files": len(held), "train_bytes": len(tr),
            "held_out_bytes": len(ho)}

    def as_tensor(b: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(b), dtype=torch.uint8).long()
    return as_tensor(tr), as_tensor(ho), info


def eval_batches(held: torch.Tensor, ev: dict) -> list[torch.Tensor]:
    """`ev["batches"]` batches of `ev["batch"]` windows of seq + 1 bytes, evenly spaced over
    the held-out bytes (inputs: [:, :-1], next bytes: [:, 1:])."""
    n, width = ev["batches"] * ev["batch"], ev["seq"] + 1
    starts = torch.linspace(0, len(held) - width, n).long()
    windows = torch.stack([held[s:s + width] for s in starts.tolist()])
    return list(windows.split(ev["batch"]))


# --- model and training ----------------------------------------------------------------------
def build_model(cfg: dict, seed: int) -> torch.nn.Module:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv"], max_position_embeddings=512, use_cache=False,
        attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config).eval()


def cache_dir(option: str | None) -> Path:
    if option:
        return Path(option)
    if os.environ.get("EQSAT_LLM_ACCURACY_CACHE"):
        return Path(os.environ["EQSAT_LLM_ACCURACY_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "eqsat-llm" / "accuracy"


def cache_key(cfg: dict, steps: int, train: torch.Tensor) -> str:
    data = hashlib.sha256(train.to(torch.uint8).numpy().tobytes()).hexdigest()
    spec = json.dumps({"config": cfg, "train": TRAIN, "steps": steps, "data": data},
                      sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:20]


def lr_at(step: int, steps: int) -> float:
    """Linear warmup, then cosine down to final_lr_frac of the peak."""
    peak, warm = TRAIN["lr"], min(TRAIN["warmup"], max(1, steps // 5))
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    floor = TRAIN["final_lr_frac"]
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def mean_loss(model: torch.nn.Module, batches: list[torch.Tensor]) -> float:
    model.eval()
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(
            model(input_ids=b[:, :-1]).logits.flatten(0, 1), b[:, 1:].flatten()).item()
            for b in batches]
    return sum(losses) / len(losses)


def train_model(model: torch.nn.Module, train: torch.Tensor, steps: int,
                probe: list[torch.Tensor]) -> dict:
    """AdamW on random windows of the training bytes; the held-out loss on `probe` at a few
    points along the way. Returns the training record."""
    gen = torch.Generator().manual_seed(TRAIN["seed"])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=TRAIN["betas"])
    width = TRAIN["seq"] + 1
    curve = [(0, mean_loss(model, probe))]
    every = max(1, steps // 6)
    t0 = time.perf_counter()
    train_loss = float("nan")
    for step in range(steps):
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        starts = torch.randint(0, len(train) - width, (TRAIN["batch"],), generator=gen)
        x = torch.stack([train[s:s + width] for s in starts.tolist()])
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["clip"])
        opt.step()
        train_loss = loss.item()
        if (step + 1) % every == 0 or step + 1 == steps:
            curve.append((step + 1, mean_loss(model, probe)))
            print(f"  step {step + 1}/{steps}: train loss {train_loss:.3f}, held-out "
                  f"{curve[-1][1]:.3f} nats/byte, {time.perf_counter() - t0:.0f} s", flush=True)
    model.eval()
    return {"steps": steps, "train_s": time.perf_counter() - t0, "final_train_loss": train_loss,
            "curve": curve}


def trained_model(cfg: dict, steps: int, train: torch.Tensor, probe: list[torch.Tensor],
                  cache: Path) -> tuple[torch.nn.Module, dict]:
    """The model after `steps` of training: from the cache, or trained now (and cached)."""
    model = build_model(cfg, TRAIN["seed"])
    path = cache / f"{cache_key(cfg, steps, train)}.pt"
    if path.exists():
        saved = torch.load(path, weights_only=True)
        model.load_state_dict(saved["state_dict"])
        record = json.loads(saved["record"]) | {"cached": str(path)}
        print(f"trained weights from the cache: {path}", flush=True)
        return model.eval(), record
    print(f"training {steps} steps ({sum(p.numel() for p in model.parameters())} parameters, "
          f"{torch.get_num_threads()} thread(s)) ...", flush=True)
    record = train_model(model, train, steps, probe)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"state_dict": model.state_dict(), "record": json.dumps(record)}, tmp)
    tmp.replace(path)
    return model.eval(), record | {"cached": None, "saved": str(path)}


# --- evaluation ------------------------------------------------------------------------------
def gemm_counts(compiled) -> tuple[int, int]:
    """(GEMMs reading integer weights, GEMMs with a constant weight) in the program (a
    float weight kept in half precision is not counted as quantized)."""
    g = compiled.graph
    gemms = [n for n in g.nodes if n.op in ("gemm", "matmul") and g.node(n.inputs[1]).op == "const"]
    quantized = (*QUANT_FORMATS, *DYNAMIC_STORED)
    return sum(n.attrs.get("weight") in quantized for n in gemms), len(gemms)


def evaluate(name: str, model: torch.nn.Module, batches: list[torch.Tensor]) -> list[Row]:
    wrapped = Logits(model).eval()
    with torch.no_grad():
        want = [wrapped(b[:, :-1]) for b in batches]
    scale = max(float(w.abs().max()) for w in want)
    targets = torch.cat([b[:, 1:].flatten() for b in batches])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        captured = export(wrapped, (batches[0][:, :-1],))
        print(f"  {name}: captured in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for label, q, keep in SYSTEMS:
        t0 = time.perf_counter()
        counts, note = (None, None), ""
        if label.startswith("eager"):
            run = wrapped
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run = optimize(captured, (batches[0][:, :-1],), quantize=q,
                               keep_float=list(keep), measure_eager=False)
            counts = gemm_counts(run)
            rep = run.report
            note = f"backend {rep.backend}" + (f", ran in torch: {rep.torch_ops}"
                                               if rep.torch_ops else "")
        with torch.no_grad():
            got = [run(b[:, :-1]) for b in batches]
        err = torch.cat([(g - w).abs().flatten() for g, w in zip(got, want)]).double()
        logits = torch.cat([g.flatten(0, 1) for g in got])
        top = torch.cat([(g.argmax(-1) == w.argmax(-1)).flatten() for g, w in zip(got, want)])
        loss = float(torch.nn.functional.cross_entropy(logits, targets))
        rows.append(Row(name, label, float(top.double().mean()), float(err.max()) / scale,
                        float(err.mean()) / scale, loss, loss / math.log(2),
                        float((logits.argmax(-1) == targets).double().mean()), *counts, note))
        print(f"  {name} {label}: agreement {rows[-1].top1_agreement:.2%}, max rel "
              f"{rows[-1].max_rel:.2e}, {rows[-1].bits_per_byte:.3f} bits/byte "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return rows


def table(rows: list[Row]) -> str:
    head = ("| weights | system | top-1 agrees with eager fp32 | max abs logit error / max "
            "logit | mean abs logit error / max logit | held-out loss (nats/byte) | bits/byte "
            "| next-byte accuracy | GEMMs quantized |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        gemms = "-" if r.gemms is None else f"{r.quantized_gemms}/{r.gemms}"
        lines.append(f"| {r.model} | {r.system} | {r.top1_agreement:.2%} | {r.max_rel:.2e} | "
                     f"{r.mean_rel:.2e} | {r.loss:.3f} | {r.bits_per_byte:.3f} | "
                     f"{r.accuracy:.1%} | {gemms} |" + (f" {r.note}" if "torch" in r.note else ""))
    return "\n".join(lines)


def describe(cfg: dict, steps: int, record: dict, data: dict, ev: dict, rows: list[Row]) -> str:
    by = {(r.model, r.system): r for r in rows}
    before, after = by[("untrained", "eager fp32")], by[("trained", "eager fp32")]
    curve = ", ".join(f"{s}: {v:.2f}" for s, v in record["curve"])
    return (
        f"A LlamaForCausalLM (hidden {cfg['hidden']}, {cfg['layers']} layers, {cfg['heads']} "
        f"heads / {cfg['kv']} KV heads, FFN {cfg['ffn']}, vocab {cfg['vocab']}: bytes, sdpa) "
        f"trained {steps} steps of AdamW (batch {TRAIN['batch']} x {TRAIN['seq']} bytes, peak "
        f"lr {TRAIN['lr']}, seed {TRAIN['seed']}) on the Python {data['python']} stdlib's "
        f"*.py files ({data['train_files']} files, {data['train_bytes'] / 1e6:.1f} MB; "
        f"{data['held_out_files']} files held out), one torch thread: "
        f"{record['train_s']:.0f} s{CACHED_NOTE if record.get('cached') else ''}. "
        f"Held-out loss {before.loss:.3f} nats/byte ({before.bits_per_byte:.2f} bits/byte; "
        f"log 256 = {math.log(256):.3f}) before training, {after.loss:.3f} "
        f"({after.bits_per_byte:.2f} bits/byte) after; along the way (step: nats/byte on "
        f"{ev['batch']} held-out windows): {curve}. "
        f"Evaluated on {ev['batches']} held-out batches of {ev['batch']} x {ev['seq']} bytes "
        f"({ev['batches'] * ev['batch'] * ev['seq']} positions); each program compiled on the "
        "first. Errors are relative to the largest |logit| of eager fp32 on the same weights; "
        "\"untrained\" is the same config and seed before training." + partial_groups(cfg)
        + "\n\n" + table(rows))


def partial_groups(cfg: dict) -> str:
    """Which int4 group sizes leave a weight float here: K must fill whole groups."""
    ks = {"hidden": cfg["hidden"], "FFN": cfg["ffn"]}
    def partial(g: int) -> str:
        return ", ".join(f"{k} {v}" for k, v in ks.items() if v % g)

    out = [f"int4_g{g} leaves the GEMMs whose K ({partial(g)}) is not a multiple of {g} float"
           for g in (32, 64, 128) if any(v % g for v in ks.values())]
    return (" " + "; ".join(out) + " (the FFN's K is the down projection's: one GEMM a layer)."
            if out else "")


def main(argv: list[str] | None = None) -> list[Row]:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--steps", type=int, default=None,
                     help=f"training steps (default {STEPS}; --quick: {STEPS_QUICK})")
    own.add_argument("--cache-dir", default=None,
                     help="where trained weights are kept (default: $EQSAT_LLM_ACCURACY_CACHE "
                          "or ~/.cache/eqsat-llm/accuracy)")
    mine, rest = own.parse_known_args(argv)
    args, load_ok = parse_args(rest, __doc__)
    torch.set_num_threads(1)  # training on one thread (the machine is shared)
    cfg = CONFIG_QUICK if args.quick else CONFIG
    ev = EVAL_QUICK if args.quick else EVAL
    steps = mine.steps if mine.steps is not None else STEPS_QUICK if args.quick else STEPS
    train, held, data = corpus()
    print(f"stdlib {data['root']} (Python {data['python']}): {data['train_bytes']} training "
          f"bytes, {data['held_out_bytes']} held out", flush=True)
    batches = eval_batches(held, ev)
    probe = eval_batches(held, {"batch": ev["batch"], "seq": TRAIN["seq"], "batches": 1})
    model, record = trained_model(cfg, steps, train, probe, cache_dir(mine.cache_dir))
    print(f"training: {record['train_s']:.0f} s, held-out loss {record['curve'][0][1]:.3f} -> "
          f"{record['curve'][-1][1]:.3f} nats/byte", flush=True)
    rows = evaluate("trained", model, batches)
    rows += evaluate("untrained", build_model(cfg, TRAIN["seed"]), batches)
    text = describe(cfg, steps, record, data, ev, rows)
    print(text)
    if args.write:
        write_results("accuracy.py", argv, text, load_ok, SECTION)
    return rows


if __name__ == "__main__":
    main()

