"""The `eqsat-llm` command: demo, optimize, explain, report diff, generate, calibrate, rules,
extract, fuzz."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path


def interleaved_ms(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median milliseconds per call of each function, measured in interleaved rounds so that
    a burst of load on the machine hits every system alike."""
    for fn in fns.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t) * 1000)
    return {name: statistics.median(v) for name, v in samples.items()}


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from . import optimize
    from .models.workloads import LLAMA_BLOCK_SHAPES, llama_block_case

    torch.set_num_threads(args.threads)
    shapes = LLAMA_BLOCK_SHAPES if args.shape == "all" else (args.shape,)
    worst = 0.0
    for shape in shapes:
        model, inputs = llama_block_case(shape)
        print(f"\n### LLaMA-style block, {shape}: inputs "
              + ", ".join(f"{list(x.shape)}" for x in inputs), flush=True)
        compiled = optimize(model, inputs, progress=print if args.verbose else None)
        with torch.no_grad():
            expected = model(*inputs)
            got = compiled(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        err = max((a - b).abs().max().item() for a, b in zip(expected, got))
        worst = max(worst, err)
        print(compiled.report.summary())
        with torch.no_grad():
            ms = interleaved_ms({"eager": lambda m=model, x=inputs: m(*x),
                                 "eqsat": lambda c=compiled, x=inputs: c(*x)}, args.rounds)
        eager_ms, ours_ms = ms["eager"], ms["eqsat"]
        print(f"(1-minute load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
        print(f"\nmax |eqsat - eager| = {err:.2e}   (tolerance 1e-5)")
        print(f"median time: eager {eager_ms:.3f} ms, eqsat-llm ({compiled.report.backend} "
              f"backend) {ours_ms:.3f} ms -> {eager_ms / ours_ms:.2f}x eager")
    if worst > 1e-5:
        print(f"FAILED: outputs differ from eager by {worst:.2e}", file=sys.stderr)
        return 1
    return 0


def load_case(spec: str) -> tuple:
    """A reference workload by name, or "package.module:function" returning (model, inputs)."""
    import importlib

    from .models.workloads import WORKLOADS

    if spec in WORKLOADS:
        return WORKLOADS[spec]()
    if ":" not in spec:
        raise SystemExit(f"error: {spec!r} is neither a workload ({', '.join(WORKLOADS)}) "
                         "nor module:function")
    module, fn = spec.split(":", 1)
    return getattr(importlib.import_module(module), fn)()


def _program_options(args: argparse.Namespace) -> dict:
    options: dict = {"backend": args.backend}
    if args.sparsity:
        options["sparsity"] = args.sparsity
    if args.quantize:
        keep = [p for p in (args.keep_float or "").split(",") if p]
        options.update(quantize=args.quantize, keep_float=keep)
    return options


def _add_program_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=["auto", "c", "triton", "reference"], default="auto",
                   help="what runs the program (auto: Triton for CUDA inputs, else C; triton "
                   "without a GPU runs in Triton's interpreter: slow, docs/triton-backend.md)")
    p.add_argument("--quantize", metavar="FORMAT",
                   help="weights as int8, fp8 (= fp8_e4m3), fp8_e5m2, fp8_e4m3_g128 (a "
                   "scale per 128 rows: an FP8 checkpoint's bytes kept), int4 (= int4_g32), "
                   "int4_g64 or int4_g128; "
                   "int8_dynamic: int8 weights and activations coded per row where an "
                   "integer product pays (prefill); int4_dynamic: int4_g32 weights and "
                   "activations coded per block of 32 where the byte product pays (decode) "
                   "(docs/quantization.md)")
    p.add_argument("--keep-float", metavar="NAMES",
                   help="with --quantize: comma-separated modules or parameter globs kept float")
    p.add_argument("--sparsity", choices=["auto"],
                   help="run GEMMs on 2:4 or 16x16 block-sparse weights with sparse kernels "
                   "where it pays (docs/sparsity.md)")


def cmd_optimize(args: argparse.Namespace) -> int:
    import torch

    from . import optimize
    from .reporting.html import render

    model, inputs = load_case(args.model)
    rules = args.rules.split(",") if args.rules else None
    compiled = optimize(model, inputs, rules=rules, extractor=args.extractor,
                        progress=print if args.verbose else None, **_program_options(args))
    with torch.no_grad():
        expected, got = model(*inputs), compiled(*inputs)
    pairs = zip(expected if isinstance(expected, tuple) else (expected,),
                got if isinstance(got, tuple) else (got,))
    err = max((a - b).abs().max().item() for a, b in pairs)
    if args.profile:
        _profile(compiled, inputs)
    print(compiled.report.summary())
    print(f"\nmax |eqsat - eager| = {err:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(compiled.report.to_dict(), f, indent=1, default=str)
        print(f"report written to {args.json}")
    if args.report:
        page = render(compiled.report, compiled.captured.graph, compiled.graph,
                      title=f"eqsat-llm: {args.model}", cost_model=compiled.cost_model)
        with open(args.report, "w") as f:
            f.write(page)
        print(f"HTML report written to {args.report}")
    return 0


def _profile(compiled: object, inputs: object) -> None:
    """Time each backend kernel of the program on the inputs, into its report."""
    from .profile import attach_profile, profile_program

    print("profiling each kernel of the program ...", flush=True)
    attach_profile(compiled.report, profile_program(compiled, list(inputs)))


def cmd_explain(args: argparse.Namespace) -> int:
    """Why the optimized program has a kernel: its cost, the rules that built it, what it was
    chosen over. MODEL is a workload (optimized now) or a report's JSON file."""
    from .errors import EqsatError
    from .reporting.explain import explain

    if args.model.endswith(".json"):
        with open(args.model) as f:
            report = json.load(f)
    else:
        from . import optimize

        model, inputs = load_case(args.model)
        rules = args.rules.split(",") if args.rules else None
        compiled = optimize(model, inputs, rules=rules, extractor=args.extractor,
                            measure_eager=False, **_program_options(args))
        if args.profile:
            _profile(compiled, inputs)
        report = compiled.report.to_dict()
    try:
        print(explain(report, args.op))
    except EqsatError as exc:
        print(f"eqsat-llm explain: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_report_diff(args: argparse.Namespace) -> int:
    """What changed between two saved reports (`optimize --json`, `generate --json`)."""
    from .errors import EqsatError
    from .reporting.explain import diff

    reports = []
    for path in (args.a, args.b):
        try:
            with open(path) as f:
                reports.append(json.load(f))
        except (OSError, ValueError) as exc:
            print(f"eqsat-llm report diff: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    try:
        print(diff(reports[0], reports[1], (args.a, args.b)))
    except EqsatError as exc:
        print(f"eqsat-llm report diff: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"eqsat-llm report diff: {args.a} or {args.b} is not an eqsat-llm report "
              f"(no key {exc})", file=sys.stderr)
        return 2
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Compile a causal LM for generation, generate --new-tokens greedily (eos ignored: a
    measurement), print tokens/s (and eager transformers' beside it with --eager, tokens
    compared)."""
    import torch

    from . import Generator
    from .models.model_matrix import causal_lm

    torch.set_num_threads(args.threads)
    max_len = args.max_seq_len or args.prompt_len + args.new_tokens
    print(f"compiling {args.model} for generation: batch {args.batch}, max_seq_len {max_len}",
          flush=True)
    options = dict(batch_size=args.batch, prefill_chunk=args.chunk,
                   progress=print if args.verbose else None, **_program_options(args))
    if Path(args.model).is_dir():  # a checkpoint directory: weights read at load
        gen = Generator.from_pretrained(args.model, max_seq_len=max_len, **options)
        model = gen.model
        if args.eager:
            raise SystemExit("error: --eager loads the model whole; run transformers apart")
    else:
        try:
            model = causal_lm(args.model)
        except KeyError as exc:
            raise SystemExit(f"error: {exc.args[0]}") from None
        gen = Generator(model, max_len, **options)
    model.generation_config.eos_token_id = None  # always --new-tokens tokens: a measurement
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(3, vocab - 1, (args.batch, args.prompt_len),
                        generator=torch.Generator().manual_seed(args.seed))
    print(f"compiled in {gen.report.compile_seconds:.1f} s", flush=True)
    if args.report:
        print(gen.report.summary())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(gen.report.to_dict(), f, indent=1, default=str)
        print(f"report (both programs) written to {args.json}")
    runs = []
    for _ in range(args.repeat):
        out = gen.generate(ids, args.new_tokens)
        runs.append(dict(gen.report.last_run))
    best = min(runs, key=lambda r: r["prefill_s"] + r["decode_s"])
    steps = max(best["new_tokens"] - 1, 1)
    print(f"eqsat-llm: prompt {args.prompt_len} x {args.batch} in {best['prefill_s'] * 1e3:.1f} ms"
          f", {best['new_tokens']:.0f} new tokens, {best['decode_s'] / steps * 1e3:.2f} ms per "
          f"decode step: {best['tokens_per_s']:.1f} tokens/s")
    if args.eager:
        t = time.perf_counter()
        with torch.no_grad():
            want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=args.new_tokens, pad_token_id=0)
        eager_s = time.perf_counter() - t
        rate = args.batch * args.new_tokens / eager_s
        same = torch.equal(want[:, :out.shape[1]], out)
        print(f"transformers eager generate: {rate:.1f} tokens/s -> eqsat-llm "
              f"{best['tokens_per_s'] / rate:.2f}x; tokens {'match' if same else 'DIFFER'}")
    return 0


def cmd_rules_list(args: argparse.Namespace) -> int:
    from .rulebook import load_library

    print(f"{'rule':<26}{'family':<12}{'soundness':<14}note")
    for fam, rules in load_library().items():
        for r in rules:
            print(f"{r.name:<26}{fam:<12}{r.soundness:<14}{r.note}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .extraction.calibrate import main_calibrate

    return main_calibrate(args.quick, args.force)


def cmd_rules_check(args: argparse.Namespace) -> int:
    from .errors import RuleError
    from .rulecheck import main_check

    try:
        return main_check(args.specs, instances=args.instances, seed=args.seed)
    except RuleError as exc:  # a rule file that does not load (raised on import, typo)
        print(f"error: {exc}", file=sys.stderr)
        return 2


def cmd_extract(args: argparse.Namespace) -> int:
    from .extraction import extract as ex
    from .extraction.egraph_json import EGraphFormatError, load_egraph
    from .extraction.ilp import extract_ilp

    methods = {"tree": ex.extract_tree_greedy, "dag": ex.extract_dag_greedy,
               "ilp": lambda g: extract_ilp(g, time_limit=args.time_limit)}
    try:
        egraph = load_egraph(args.file)
        result = methods[args.method](egraph)
        ex.check_extraction(egraph, result.choices)
    except (EGraphFormatError, ex.ExtractionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a missing or unreadable file
        print(f"error: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    out = {"method": result.method, "cost": result.cost, "lower_bound": result.lower_bound,
           "gap": None if result.lower_bound is None else result.cost - result.lower_bound,
           "seconds": result.seconds}
    if args.choices:
        out["choices"] = result.choices
    print(json.dumps(out))
    return 0


def cmd_fuzz(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .fuzz import available_backends, fuzz

    backends = args.backend.split(",") if args.backend else available_backends()
    print(f"fuzzing {args.count} models, seed {args.seed}, backends {', '.join(backends)}",
          flush=True)
    result = fuzz(args.count, args.seed, backends, shrink_failures=not args.no_shrink,
                  save_dir=Path(args.save) if args.save else None, max_steps=args.max_steps,
                  progress=lambda line: print(line, flush=True))
    print(result.summary())
    return 1 if result.found else 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # raised inside torch.export's own pytree code in torch 2.13; nothing a user can change
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    parser = argparse.ArgumentParser(prog="eqsat-llm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="optimize the LLaMA-style block, check it, time it")
    demo.add_argument("--shape", default="all",
                      choices=["all", "prefill", "decode", "decode_kv"])
    demo.add_argument("--rounds", type=int, default=50)
    demo.add_argument("--threads", type=int, default=2)
    demo.add_argument("--verbose", action="store_true", help="show saturation progress")
    demo.set_defaults(fn=cmd_demo)
    opt = sub.add_parser("optimize", help="optimize a workload or module:function, report")
    opt.add_argument("model", help="a reference workload name or package.module:function "
                     "returning (model, example_inputs)")
    opt.add_argument("--rules", help="comma-separated rule families (default: all)")
    opt.add_argument("--extractor", choices=["tree", "dag", "ilp"], default="ilp")
    opt.add_argument("--report", metavar="OUT.html", help="write the HTML cost report")
    opt.add_argument("--json", metavar="OUT.json", help="write the report as JSON")
    opt.add_argument("--profile", action="store_true",
                     help="measure each backend kernel's time beside its prediction")
    opt.add_argument("--verbose", action="store_true")
    _add_program_options(opt)
    opt.set_defaults(fn=cmd_optimize)
    exp = sub.add_parser("explain", help="why the optimized program has a kernel")
    exp.add_argument("model", help="a workload, package.module:function, or a report's JSON")
    exp.add_argument("--op", required=True,
                     help="the kernel: an op (attention), a label (gemm[rms_norm]) or an id (%%12)")
    exp.add_argument("--rules", help="comma-separated rule families (default: all)")
    exp.add_argument("--extractor", choices=["tree", "dag", "ilp"], default="ilp")
    exp.add_argument("--profile", action="store_true", help="also measure the kernels")
    _add_program_options(exp)
    exp.set_defaults(fn=cmd_explain)
    rep = sub.add_parser("report", help="saved reports")
    rep_sub = rep.add_subparsers(dest="report_command", required=True)
    rdiff = rep_sub.add_parser("diff", help="what changed between two reports (--json files)")
    rdiff.add_argument("a")
    rdiff.add_argument("b")
    rdiff.set_defaults(fn=cmd_report_diff)
    gen = sub.add_parser("generate", help="compile a causal LM for text generation; tokens/s")
    gen.add_argument("model", help="a checkpoint directory (config.json, *.safetensors), a "
                     "model-matrix family (llama, gpt2:medium, ...), tinyllama[:layers], or "
                     "package.module:function returning the model")
    gen.add_argument("--prompt-len", type=int, default=128)
    gen.add_argument("--new-tokens", type=int, default=128)
    gen.add_argument("--batch", type=int, default=1)
    gen.add_argument("--max-seq-len", type=int, help="cache length (default: prompt + new)")
    gen.add_argument("--chunk", type=int, help="prefill chunk (default: the Generator's)")
    gen.add_argument("--repeat", type=int, default=3, help="generate this often; best shown")
    gen.add_argument("--eager", action="store_true",
                     help="also run transformers' generate and compare tokens and speed")
    gen.add_argument("--report", action="store_true", help="print the Generator's report")
    gen.add_argument("--json", metavar="OUT.json", help="write the report of both programs "
                     "(prefill, decode) as JSON, for `explain` and `report diff`")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--threads", type=int, default=2)
    gen.add_argument("--verbose", action="store_true")
    _add_program_options(gen)
    gen.set_defaults(fn=cmd_generate)
    cal = sub.add_parser("calibrate", help="measure this machine for the cost model; cached")
    cal.add_argument("--quick", action="store_true", help="about a second instead of ~10")
    cal.add_argument("--force", action="store_true",
                     help="save even when other processes load the CPU")
    cal.set_defaults(fn=cmd_calibrate)
    rules = sub.add_parser("rules", help="the rule library")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    rules_sub.add_parser("list", help="every rule with its family and soundness class"
                         ).set_defaults(fn=cmd_rules_list)
    check = rules_sub.add_parser(
        "check", help="check rules numerically against the ops' reference semantics")
    check.add_argument("specs", nargs="*", metavar="FILE_OR_MODULE",
                       help='rule files, modules or family names (default: the library\'s "all")')
    check.add_argument("--instances", type=int, default=20)
    check.add_argument("--seed", type=int, default=0)
    check.set_defaults(fn=cmd_rules_check)
    extract = sub.add_parser("extract", help="extract from an egraph-serialize JSON file")
    extract.add_argument("file")
    extract.add_argument("--method", choices=["tree", "dag", "ilp"], default="dag")
    extract.add_argument("--time-limit", type=float, default=10.0,
                         help="seconds for the ILP solver (it returns its best program so far)")
    extract.add_argument("--choices", action="store_true", help="print the chosen nodes")
    extract.set_defaults(fn=cmd_extract)
    fz = sub.add_parser("fuzz", help="optimize random valid models, compare with eager")
    fz.add_argument("--count", type=int, default=200)
    fz.add_argument("--seed", type=int, default=0)
    fz.add_argument("--backend", help="comma-separated backends (default: all available)")
    fz.add_argument("--max-steps", type=int, default=8, help="op families per model")
    fz.add_argument("--save", metavar="DIR", default="tests/fuzz_regressions",
                    help="where failing models are saved as regression tests ('' to not save)")
    fz.add_argument("--no-shrink", action="store_true", help="save failing models as drawn")
    fz.set_defaults(fn=cmd_fuzz)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
