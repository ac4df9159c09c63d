"""Decode with the prepared weights on 2 MiB pages and without, side by side.

    .venv/bin/python benchmarks/huge_pages.py [--dir CKPT] [--formats fp32,bf16,int8,int4]
        [--rounds 2] [--write]

The C runtime moves its large prepared weights onto 2 MiB pages in a background thread
(memcheck.collapse_in_background, docs/c-backend.md); `EQSAT_HUGE_PAGES=0` turns that off.
Per format, `Generator.from_pretrained` of a TinyLlama-shaped bf16 checkpoint (22 layers;
written first unless --dir holds one) in a fresh process, with and without, alternated,
runs as benchmarks/llamacpp.py runs eqsat-llm (prompt 128 tokens, 64 greedy tokens, timed
after the move): the best prefill and decode of `--rounds`. --write puts the table in
benchmarks/RESULTS.md ("Weights on 2 MiB pages")."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoint_memory import SHAPES, write_checkpoint
from llamacpp import EQSAT, child
from optimize_time import cpu_name, write_section


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, help="the checkpoint (written here when absent)")
    p.add_argument("--formats", default="fp32,bf16,int8,int4")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    import torch

    ckpt = args.dir or Path(tempfile.mkdtemp(prefix="eqsat-ckpt-"))
    if not (ckpt / "config.json").exists():
        ckpt.mkdir(parents=True, exist_ok=True)
        write_checkpoint(ckpt, SHAPES["tinyllama"], SHAPES["tinyllama"]["num_hidden_layers"])
    work = Path(tempfile.mkdtemp(prefix="eqsat-huge-"))
    prompt = work / "prompt.pt"
    torch.save(torch.randint(3, 30000, (1, 128), generator=torch.Generator().manual_seed(1)),
               prompt)
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CACHE_HOME=str(work / "cache"))
    best: dict[tuple[str, str], dict[str, float]] = {}
    for r in range(args.rounds):
        for fmt in args.formats.split(","):
            for huge in ("1", "0")[::1 if r % 2 == 0 else -1]:
                got = child(EQSAT, str(ckpt), fmt, str(prompt), "64",
                            env=env | {"EQSAT_HUGE_PAGES": huge})
                old = best.get((fmt, huge))
                best[(fmt, huge)] = {k: min(got[k], old[k]) if old else got[k]
                                     for k in ("prefill_ms", "decode_ms")}
                print(f"round {r}: {fmt} huge pages {huge}: prefill {got['prefill_ms']:.0f} ms,"
                      f" decode {got['decode_ms']:.1f} ms/token", flush=True)
    lines = [("| format | decode ms/token, 2 MiB pages / 4 KiB | ratio "
              "| prefill ms, 2 MiB / 4 KiB |"), "|---|---|---|---|"]
    for fmt in args.formats.split(","):
        h, s = best[(fmt, "1")], best[(fmt, "0")]
        lines.append(f"| {fmt} | {h['decode_ms']:.1f} / {s['decode_ms']:.1f} | "
                     f"{h['decode_ms'] / s['decode_ms']:.2f} | "
                     f"{h['prefill_ms']:.0f} / {s['prefill_ms']:.0f} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        head = (f"Command: `.venv/bin/python benchmarks/huge_pages.py {' '.join(sys.argv[1:])}` "
                f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_name()}, "
                f"{platform.machine()}, {os.cpu_count()} cores). TinyLlama shape, 22 layers, "
                "from a bf16 checkpoint (fp32: its values widened); prompt 128, 64 greedy "
                f"tokens; each run a fresh process, with and without alternated, best of "
                f"{args.rounds}. 4 KiB: `EQSAT_HUGE_PAGES=0`.")
        write_section(head + "\n\n" + table, "## Weights on 2 MiB pages (benchmarks/huge_pages.py)")


if __name__ == "__main__":
    main()
