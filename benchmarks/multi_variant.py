"""Many tuned variants in one batch vs one variant at a time (lmlab.adapt.multi), on the CPU.

Base: a gpt2-small-shaped decoder (4 layers, d_model 256; random weights: speed does not depend on
them) with a byte-level BPE tokenizer (vocabulary 2000) trained on tinyshakespeare, whose lines
are the prompts. Variants (random trained weights): LoRA r=4/8/16 on q,v; prefix tuning with 10
and 20 virtual tokens; prompt tuning with 10 and 20; and the plain base - 8 variants.

The same rows are served two ways:

* **one batch**: :class:`MultiAdapterModel` runs every variant's rows in shared forwards;
* **one by one**: each variant's own model (``load_peft_model``: LoRA unmerged, as served from an
  adapter) runs its own rows, variant after variant.

Workloads: scoring (one forward over ``--rows-per-variant`` rows of 64 tokens per variant) and
greedy generation with the KV cache (``--gen-rows-per-variant`` prompts of 16 tokens per variant,
32 new tokens each). Reported: rows/s or new tokens/s, best of ``--repeats`` in one process with
``--threads`` threads, the ratio one batch / one by one, and the plain base on the same rows (all
rows, no adapters) for the cost of the per-row weights. Before timing, every batched row is
checked against its variant alone (logits within 1e-4, generated tokens equal).

    python benchmarks/multi_variant.py                       # ~a minute on one thread
    python benchmarks/multi_variant.py --quick --no-write    # smoke run: seconds
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

SECTION = "multi_variant"
VARIANTS = {
    "lora4": ("lora", {"rank": 4, "alpha": 8.0}),
    "lora8": ("lora", {"rank": 8, "alpha": 16.0}),
    "lora16": ("lora", {"rank": 16, "alpha": 32.0}),
    "prefix10": ("prefix", {"num_virtual_tokens": 10, "init": "random"}),
    "prefix20": ("prefix", {"num_virtual_tokens": 20, "init": "random"}),
    "prompt10": ("prompt", {"num_virtual_tokens": 10, "init": "random"}),
    "prompt20": ("prompt", {"num_virtual_tokens": 20, "init": "random"}),
    "base": None,
}


def best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny model, few rows")
    ap.add_argument("--rows-per-variant", type=int, default=8)
    ap.add_argument("--gen-rows-per-variant", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--markdown", type=Path, default=common.BENCHMARKS_MD)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    preset, seq = "gpt2-small", 64
    if args.quick:
        preset, seq, args.rows_per_variant, args.gen_rows_per_variant = "gpt2-tiny", 16, 2, 1
        args.new_tokens, args.repeats = 4, 1
    from lmlab.runtime import set_threads

    set_threads(args.threads)

    from lmlab.adapt import apply_method
    from lmlab.adapt.multi import MultiAdapterModel, generate_variants
    from lmlab.adapt.peft_io import load_peft_model, save_peft
    from lmlab.generate import generate
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    text = (common.DATA / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    tok = train_tokenizer("bytelevel", [text[:200_000]], vocab_size=2000)
    cfg = get_preset(preset, vocab_size=tok.vocab_size)

    def base():
        torch.manual_seed(0)
        return build_model(cfg).eval()

    stream = [i for line in text[200_000:400_000].splitlines() if line.strip() for i in tok.encode(line)]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        for i, (name, spec) in enumerate(VARIANTS.items()):
            model = base()
            if spec is not None:
                apply_method(model, *spec)
                g = torch.Generator().manual_seed(i)
                with torch.no_grad():
                    for p in model.parameters():
                        if p.requires_grad:
                            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            dirs[name] = None if spec is None else save_peft(model, Path(tmp) / name)
        alone = {k: (base() if d is None else load_peft_model(base(), d)).eval() for k, d in dirs.items()}
        groups = {"all 8 variants, kinds mixed": list(VARIANTS),
                  "the 3 LoRA variants": ["lora4", "lora8", "lora16"]}
        multis = {g: MultiAdapterModel(base(), {k: dirs[k] for k in names}).eval()
                  for g, names in groups.items()}
    plain = base()
    new = args.new_tokens

    def measure(group: str, names: list[str]) -> list[list]:
        multi, n = multis[group], len(names)
        score_ids = torch.tensor([stream[k * seq:(k + 1) * seq] for k in range(n * args.rows_per_variant)])
        score_names = [names[k % n] for k in range(len(score_ids))]
        gen_ids = torch.tensor([stream[(500 + k) * 16:(501 + k) * 16]
                                for k in range(n * args.gen_rows_per_variant)])
        gen_names = [names[k % n] for k in range(len(gen_ids))]
        own = {k: torch.tensor([i for i, v in enumerate(score_names) if v == k]) for k in names}
        own_gen = {k: torch.tensor([i for i, v in enumerate(gen_names) if v == k]) for k in names}

        @torch.no_grad()
        def score_batched():
            return multi(score_ids, variant_ids=score_names).logits

        @torch.no_grad()
        def score_alone():
            return {k: alone[k](score_ids[own[k]]).logits for k in names}

        def gen_batched():
            return generate_variants(multi, gen_ids, None, gen_names, max_new_tokens=new, eos_token_id=[])

        def gen_alone():
            return {k: generate(alone[k], gen_ids[own_gen[k]], max_new_tokens=new, eos_token_id=[])
                    for k in names}

        # identity first: the comparison is between equal outputs
        batched, each = score_batched(), score_alone()
        for k in names:
            torch.testing.assert_close(batched[own[k]], each[k], atol=1e-4, rtol=1e-4)
        out, each = gen_batched(), gen_alone()
        for k in names:
            assert torch.equal(out[own_gen[k]], each[k]), k
        rows_n, new_n = len(score_ids), len(gen_ids) * new
        t_sb, t_sa = best_time(score_batched, args.repeats), best_time(score_alone, args.repeats)
        t_sp = best_time(lambda: plain(score_ids), args.repeats)
        t_gb, t_ga = best_time(gen_batched, args.repeats), best_time(gen_alone, args.repeats)
        t_gp = best_time(lambda: generate(plain, gen_ids, max_new_tokens=new, eos_token_id=[]), args.repeats)
        return [[group, f"scoring, {seq} tokens per row (rows/s)", rows_n, common.fmt(rows_n / t_sb, 1),
                 common.fmt(rows_n / t_sa, 1), f"{t_sa / t_sb:.2f}x", common.fmt(rows_n / t_sp, 1)],
                [group, f"greedy generation, 16-token prompts, {new} new tokens, KV cache (new tokens/s)",
                 len(gen_ids), common.fmt(new_n / t_gb, 1), common.fmt(new_n / t_ga, 1),
                 f"{t_ga / t_gb:.2f}x", common.fmt(new_n / t_gp, 1)]]

    table = common.markdown_table(
        ["variants", "workload", "rows", "one batch", "one by one", "batch / one-by-one",
         "plain base, same rows"],
        [row for group, names in groups.items() for row in measure(group, names)])
    body = (f"## Many tuned variants in one batch (`benchmarks/multi_variant.py`)\n\n"
            f"Variants of one {preset} base (d_model {cfg.d_model}, {cfg.n_layers} layers, vocabulary "
            f"{cfg.vocab_size}): LoRA r=4/8/16 (q, v), prefix 10/20 and prompt 10/20 virtual tokens, and "
            f"the "
            f"plain base; rows spread evenly over the variants. *One batch*: `MultiAdapterModel`, every row "
            f"its own variant; *one by one*: each variant's own model on its rows, variant after variant; "
            f"*plain base*: the same rows through the base without adapters. Best of {args.repeats}, "
            f"{args.threads} thread(s); every batched row was first checked equal to its variant alone.\n\n"
            f"{table}\n\n{common.machine_line()}\n")
    print(body)
    if not args.no_write:
        common.update_section(SECTION, body, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
