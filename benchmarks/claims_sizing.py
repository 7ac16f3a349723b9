"""Size a comparison grid to a GPU loan: measure each arm on the CPU, estimate it on one H100/H200.

For every pretraining arm of a grid (the first seed's runs) this builds the run exactly as
``lmlab compare`` would (``lmlab.lab.load_grid`` plans it; the trainer builds its model, objective
and data path from the planned config, on the grid's own corpus and tokenizer), then:

* **measures** its training tokens per CPU-second: process CPU time (``time.process_time``), one
  thread, fp32, a few optimizer steps after a warm-up at a small batch (``--rows``), so other jobs
  on a shared machine do not skew it; and the host-side preparation alone (masking, span
  corruption), which on a GPU runs beside the step and bounds it from below;
* **counts** its FLOPs per token (the objective's ``step_flops``, as the grid's FLOPs budgets do);
* **estimates** its time on one H100/H200 from the last GPU figures (issue 28; H100, bf16, eager):
  GPT-2 124M ran at 297k tokens/s = 32.8% MFU against the bf16 matmul rate measured in that run,
  which with lmlab's FLOPs count of GPT-2 (0.854 GFLOP per token at context 1024) puts that rate
  at 7.7e14 FLOP/s. A model of width 256 cannot keep the GPU that busy; we assume
  ``--mfu`` (10%) of that rate for encoders and decoders, and T5's recorded penalty on top for
  encoder-decoders (T5-base 11.1% vs BERT-base 28.3%: x0.39). Each arm's time is the largest of
  (a) its FLOPs at that rate, (b) its CPU cost relative to the grid's first pretraining arm
  times that arm's GPU time (an arm whose non-matmul work makes it slower per FLOP on the CPU is
  assumed as slow on the GPU), (c) ``--step-floor-ms`` per step (kernel launches of one eager
  step of a small model) and (d) its measured host preparation per step, plus ``--run-overhead-s``
  per pretraining run (set-up, evaluations, checkpoints).
* **adds** what is not pretraining: ``--start-s`` per grid (process start, imports, CUDA), the
  data preparation measured here (tokenizer training and shards, CPU seconds; ``--data-s`` when
  the cache was already built) and every fine-tuning run, counted in optimizer steps and
  evaluation batches from the grid's settings at ``--finetune-step-ms`` each (eager steps of a
  small model are launch-bound on a GPU: their time hardly depends on the width).

It prints a table, the total for one seed, and the factor every pretraining budget would need to
fit ``--target-s`` (default 240 s), and writes ``sizing.json`` and ``sizing.md`` into ``--out``.
``--cpu`` also estimates the grid on this CPU (one thread per run, as the CPU grids run):
measured CPU seconds per token, fine-tuning at ``--finetune-tokens`` tokens per example.

    python benchmarks/claims_sizing.py --config configs/grids/claims-gpu.toml
    python benchmarks/claims_sizing.py --config configs/grids/claims-trend-electra.toml --cpu
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a checkout without lmlab installed
    sys.path.insert(0, str(ROOT / "src"))

#: the last GPU figures (issue 28: H100, bf16, eager, before the engine redesign)
GPT2_TOKENS_PER_S = 297_000.0
GPT2_MFU = 0.328
BERT_BASE_MFU, T5_BASE_MFU = 0.283, 0.111
#: stated assumptions (each a flag)
SMALL_MFU = 0.10
STEP_FLOOR_MS = 5.0
RUN_OVERHEAD_S = 5.0
START_S = 15.0
DATA_S = 30.0
FINETUNE_STEP_MS = 8.0
FINETUNE_TOKENS = 32  # tokens per fine-tuning example, padded (SST-2 sentences, grouped by length)
KIND = "claims sizing"
ENTRIES = ("sizing.json", "sizing.md")


@dataclass
class ArmCost:
    """One pretraining arm: what was measured here and what is estimated for one GPU."""

    arm: str
    objective: str
    architecture: str
    steps: int
    tokens: int
    flops_per_token: float
    cpu_tokens_per_s: float  # training tokens per CPU-second, one thread
    host_tokens_per_s: float  # host-side preparation alone
    gpu_flops_s: float = 0.0
    gpu_cpu_ratio_s: float = 0.0
    gpu_floor_s: float = 0.0
    gpu_host_s: float = 0.0
    gpu_s: float = 0.0  # the largest of the four, plus the per-run overhead
    cpu_s: float = 0.0  # the whole run on one CPU thread here


def gpt2_flops_per_token() -> float:
    """lmlab's training FLOPs per token of GPT-2 124M at context 1024 (the recorded run's shape)."""
    from lmlab.models import get_preset
    from lmlab.models.flops import training_flops

    config = get_preset("gpt2-base", vocab_size=50257, max_positions=1024)
    return training_flops(config, 1024, 1) / 1024


def gpu_matmul_rate() -> float:
    """The bf16 matmul rate the recorded 32.8% MFU was measured against (FLOP/s)."""
    return GPT2_TOKENS_PER_S * gpt2_flops_per_token() / GPT2_MFU


# --------------------------------------------------------------------------- measuring


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (data workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def prepare_data(run, cache: str, work: Path) -> float:
    """Tokenise the grid's corpus into ``cache`` (as the runs will find it); its CPU seconds."""
    from lmlab.train.config import load_config
    from lmlab.train.data import prepare_run_data

    data = load_config(measurement_config(run, cache, 1)).data
    start = cpu_seconds()
    prepare_run_data(data, work / "data-run", lambda msg: None)
    return cpu_seconds() - start


def measurement_config(run, cache: str, rows: int) -> dict[str, Any]:
    """The run's planned config, on one CPU thread at a small batch, nothing evaluated or saved."""
    cfg = copy.deepcopy(run.config)
    cfg["data"]["cache_dir"] = cache
    cfg["train"].update(batch_size=rows, grad_accum=1, threads=1, device="cpu", precision="fp32",
                        progress="off", eval_at_start=False, prefetch=False, max_steps=10**6, compile=False,
                        loggers=[], distributed="auto")
    return cfg


def measure_arm(run, cache: str, rows: int, warmup: int, steps: int, work: Path) -> tuple[float, float]:
    """Training tokens per CPU-second of ``run`` and of its host-side preparation alone."""
    from lmlab.train import distributed as dist_
    from lmlab.train.config import load_config
    from lmlab.train.loop import Trainer

    run_dir = work / run.dirname
    run_dir.mkdir(parents=True)
    trainer = Trainer(load_config(measurement_config(run, cache, rows)), run_dir, False, lambda msg: None)
    trainer.info = dist_.DistInfo()
    trainer.setup()
    for _ in range(warmup):
        trainer.train_step()
    start = time.process_time()
    for _ in range(steps):
        trainer.train_step()
    step_cpu = time.process_time() - start
    tokens = steps * rows * trainer.cfg.train.seq_len
    return tokens / max(step_cpu, 1e-9), host_rate(trainer, run)


def host_rate(trainer, run, calls: int = 3) -> float:
    """Tokens per CPU-second of the host-side part of a step (reading the windows, and the masking or
    span corruption of objectives that prepare on the host) at the run's own batch: no model runs,
    so the full batch is cheap, and a small one would overstate the per-call overhead."""
    rows = run.config["train"]["batch_size"] * run.config["train"].get("grad_accum", 1)
    trainer.host_inputs(trainer.windows.batch(0, rows), 10_000)  # warm-up
    start = time.process_time()
    for i in range(calls):
        trainer.host_inputs(trainer.windows.batch((i + 1) * rows, rows), 10_001 + i)
    return calls * rows * trainer.cfg.train.seq_len / max(time.process_time() - start, 1e-9)


# --------------------------------------------------------------------------- estimating


def arm_mfu(architecture: str, mfu: float) -> float:
    return mfu * (T5_BASE_MFU / BERT_BASE_MFU) if architecture == "seq2seq" else mfu


def estimate_gpu(costs: list[ArmCost], args, rate: float) -> None:
    """Fill each arm's GPU estimates (module docstring: the largest of four bounds + overhead)."""
    ref = costs[0]
    ref_s_per_token = ref.flops_per_token / (rate * arm_mfu(ref.architecture, args.mfu))
    for c in costs:
        c.gpu_flops_s = c.tokens * c.flops_per_token / (rate * arm_mfu(c.architecture, args.mfu))
        c.gpu_cpu_ratio_s = c.tokens * ref_s_per_token * ref.cpu_tokens_per_s / c.cpu_tokens_per_s
        c.gpu_floor_s = c.steps * args.step_floor_ms / 1000
        c.gpu_host_s = c.tokens / c.host_tokens_per_s
        c.gpu_s = max(c.gpu_flops_s, c.gpu_cpu_ratio_s, c.gpu_floor_s, c.gpu_host_s) + args.run_overhead_s
        c.cpu_s = c.tokens / c.cpu_tokens_per_s


def count_rows(path: str) -> int:
    """Data rows of a task file (lines, less a header line for TSV/CSV)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = sum(1 for line in f if line.strip())
    return lines - 1 if path.endswith((".tsv", ".csv")) else lines


def finetune_work(run) -> dict[str, int]:
    """Optimizer steps and evaluation batches of one fine-tuning run, from its settings."""
    s = run.settings
    n = min(s.get("max_train_examples") or math.inf, count_rows(run.task.train))
    n_dev = min(s.get("max_eval_examples") or math.inf, count_rows(run.task.dev))
    sliced = s.get("select_on", "train-slice") == "train-slice"
    n_slice = math.ceil(n * s.get("select_fraction", 0.1)) if sliced else 0
    batch, eval_batch = s.get("batch_size", 32), s.get("eval_batch_size", 64)
    rates = len(s.get("lr_sweep") or [1e-4, 3e-4, 1e-3]) if s.get("lr") == "auto" else 1
    per_epoch = math.ceil((n - n_slice) / batch)
    epochs = s.get("epochs", 3)
    steps = s.get("max_steps") or epochs * per_epoch  # max_steps, when set, replaces the epochs
    evals = epochs * math.ceil((n_slice or n_dev) / eval_batch) + math.ceil(n_dev / eval_batch)
    return {"steps": rates * int(steps), "eval_batches": rates * evals, "examples": int(n - n_slice)}


# --------------------------------------------------------------------------- reporting


def fmt_s(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds < 3600 else f"{seconds / 3600:,.2f} h"


def table(costs: list[ArmCost], cpu: bool) -> str:
    head = ["arm", "objective", "steps", "tokens", "GFLOP/token", "CPU tokens/s", "host tokens/s",
            "GPU by FLOPs", "by CPU ratio", "step floor", "host prep", "GPU estimate"]
    head += ["CPU (1 thread)"] if cpu else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for c in costs:
        bounds = [f"{x:.3g} s" for x in (c.gpu_flops_s, c.gpu_cpu_ratio_s, c.gpu_floor_s, c.gpu_host_s)]
        measured = [f"{c.flops_per_token / 1e9:.4f}", *(f"{x:,.0f}" for x in (c.cpu_tokens_per_s,
                                                                                c.host_tokens_per_s))]
        cells = [c.arm, c.objective, f"{c.steps:,}", f"{c.tokens / 1e6:.2f}M", *measured, *bounds,
                 f"**{c.gpu_s:.1f} s**"]
        cells += [fmt_s(c.cpu_s)] if cpu else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fit_factor(costs: list[ArmCost], fixed_s: float, target_s: float, args) -> float | None:
    """The factor on every pretraining budget that brings one seed to ``target_s`` (its pretraining
    time is linear in the budget; the fixed part is not); None when the fixed part alone is over."""
    variable = sum(c.gpu_s - args.run_overhead_s for c in costs)
    return (target_s - fixed_s) / variable if variable > 0 and target_s > fixed_s else None


def summarise(grid, costs, finetune_runs, data_s, data_measured, args) -> dict[str, Any]:
    finetunes = [finetune_work(f) for f in finetune_runs]
    gpu_ft = sum((w["steps"] + w["eval_batches"]) * args.finetune_step_ms / 1000 for w in finetunes)
    fixed = args.start_s + data_s + gpu_ft + args.run_overhead_s * len(costs)
    gpu_total = args.start_s + data_s + gpu_ft + sum(c.gpu_s for c in costs)
    out = {
        "grid": grid.name, "source": grid.source, "seeds": grid.seeds,
        "assumptions": {k: getattr(args, k) for k in ("mfu", "step_floor_ms", "run_overhead_s", "start_s",
                                                      "finetune_step_ms", "finetune_tokens", "rows")},
        "gpu_matmul_rate_flops": gpu_matmul_rate(),
        "data_s": data_s, "data_measured": data_measured,
        "arms": [asdict(c) for c in costs],
        "finetune_runs": len(finetunes), "finetune_steps": sum(w["steps"] for w in finetunes),
        "gpu_finetune_s": gpu_ft, "gpu_seed_s": gpu_total, "target_s": args.target_s,
        "gpu_fixed_s": fixed, "budget_factor_for_target": fit_factor(costs, fixed, args.target_s, args),
    }
    if args.cpu:
        cpu_ft = cpu_finetune_s(grid, costs, finetune_runs, finetunes, args)
        out["cpu_finetune_s"] = cpu_ft
        out["cpu_seed_s"] = data_s + cpu_ft + sum(c.cpu_s for c in costs)
    return out


def cpu_finetune_s(grid, costs, finetune_runs, finetunes, args) -> float:
    """Fine-tuning on this CPU: its examples' tokens at the CPU cost per token of the pretraining arm
    of the same preset (the first one; fine-tuning runs the same model), three passes for a step's
    forward + backward and one for an evaluation example."""
    per_token = {}
    for c in costs:
        arm = next(a for a in grid.arms if a.name == c.arm)
        per_token.setdefault(arm.preset, 1 / c.cpu_tokens_per_s)
    fallback = max(per_token.values())
    total = 0.0
    for run, w in zip(finetune_runs, finetunes, strict=True):
        s = run.settings
        tokens = (w["steps"] * s.get("batch_size", 32) + w["eval_batches"] * s.get("eval_batch_size", 64) / 3)
        total += tokens * args.finetune_tokens * per_token.get(run.pretrain.arm.preset, fallback)
    return total


def fit_line(summary: dict[str, Any]) -> str:
    factor, target = summary["budget_factor_for_target"], summary["target_s"]
    if factor is None:
        return (f"- cannot fit {target:.0f} s by the pretraining budgets: what does not scale with them "
                f"(start, data, fine-tuning, per-run overheads) takes {summary['gpu_fixed_s']:.0f} s")
    return f"- to fit {target:.0f} s, multiply every pretraining budget by **{factor:.3g}**"


def markdown(summary: dict[str, Any], costs: list[ArmCost], args) -> str:
    a = summary["assumptions"]
    lines = [f"# Sizing of grid `{summary['grid']}` ({summary['source']})", "",
             f"Measured on this CPU (process CPU time, 1 thread, fp32, batch {args.rows} rows, "
             f"{args.steps} steps after {args.warmup}); estimated for one H100/H200 (bf16): bf16 matmul "
             f"rate {summary['gpu_matmul_rate_flops'] / 1e12:.0f} TFLOP/s (GPT-2 124M: 297k tokens/s = 32.8% "
             f"MFU), assumed MFU {a['mfu']:.0%} for these small models (encoder-decoders x0.39), step floor "
             f"{a['step_floor_ms']} ms, {a['run_overhead_s']} s per pretraining run.", "",
             table(costs, args.cpu), "",
             f"- one seed on one GPU: **{fmt_s(summary['gpu_seed_s'])}** = start {a['start_s']:.0f} s + data "
             f"{summary['data_s']:.0f} s ({'measured here' if summary['data_measured'] else 'assumed'}) + "
             f"{summary['finetune_runs']} fine-tuning runs ({summary['finetune_steps']:,} steps at "
             f"{a['finetune_step_ms']} ms, with their evaluations: {summary['gpu_finetune_s']:.0f} s) + "
             f"pretraining {sum(c.gpu_s for c in costs):.0f} s",
             fit_line(summary)]
    if args.cpu:
        seeds = len(summary["seeds"])
        lines.append(f"- one seed on this CPU (one thread per run): **{fmt_s(summary['cpu_seed_s'])}** "
                     f"(fine-tuning {fmt_s(summary['cpu_finetune_s'])}, at {a['finetune_tokens']} tokens per "
                     f"example); x{seeds} seeds = {fmt_s(summary['cpu_seed_s'] * seeds)} of CPU time")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/grids/claims-gpu.toml", help="the grid file")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a grid key, as lmlab compare --set")
    ap.add_argument("--out", default=None,
                    help="folder for sizing.json and sizing.md (default runs/sizing/<grid>)")
    ap.add_argument("--cache", default=None, help="token cache to use or fill (default: a temporary folder)")
    ap.add_argument("--rows", type=int, default=4, help="batch rows while measuring (default 4)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per arm (default 6)")
    ap.add_argument("--mfu", type=float, default=SMALL_MFU, help="assumed MFU of these small models")
    ap.add_argument("--step-floor-ms", type=float, default=STEP_FLOOR_MS)
    ap.add_argument("--run-overhead-s", type=float, default=RUN_OVERHEAD_S)
    ap.add_argument("--start-s", type=float, default=START_S)
    ap.add_argument("--data-s", type=float, default=DATA_S, help="data preparation when the cache was built")
    ap.add_argument("--finetune-step-ms", type=float, default=FINETUNE_STEP_MS)
    ap.add_argument("--finetune-tokens", type=int, default=FINETUNE_TOKENS)
    ap.add_argument("--target-s", type=float, default=240.0, help="the time one seed should take on the GPU")
    ap.add_argument("--cpu", action="store_true", help="also estimate the grid on this CPU")
    return ap.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """One-line errors for numbers that cannot size anything."""
    from lmlab.errors import LmlabError

    for name in ("rows", "steps", "finetune_tokens"):
        if getattr(args, name) < 1:
            raise LmlabError(f"--{name.replace('_', '-')} is {getattr(args, name)}", "give at least 1")
    for name in ("mfu", "step_floor_ms", "finetune_step_ms", "target_s"):
        if not getattr(args, name) > 0 or (name == "mfu" and args.mfu > 1):
            raise LmlabError(f"--{name.replace('_', '-')} is {getattr(args, name)}",
                             "give a positive number" + (" up to 1" if name == "mfu" else ""))


def first_seed_runs(grid) -> tuple[list, list]:
    seed = grid.seeds[0]
    pretrain = [r for r in grid.pretrain_runs if r.seed == seed and r.arm.pretrained]
    finetunes = [f for f in grid.finetune_runs if f.seed == seed]
    return pretrain, finetunes


def measure(grid, args, work: Path) -> tuple[list[ArmCost], float, bool]:
    runs, _ = first_seed_runs(grid)
    cache = args.cache or str(work / "cache")
    fresh = not (Path(cache).is_dir() and any(Path(cache).iterdir()))
    print(f"preparing the grid's data in {cache} ...", file=sys.stderr, flush=True)
    data_s = prepare_data(runs[0], cache, work)
    measured = fresh
    costs = []
    for run in runs:
        print(f"measuring {run.arm.name} ...", file=sys.stderr, flush=True)
        cpu_rate, host_rate = measure_arm(run, cache, args.rows, args.warmup, args.steps, work)
        costs.append(ArmCost(run.arm.name, run.arm.objective, run.arm.architecture, run.steps, run.tokens,
                             run.flops_per_step / (run.tokens / run.steps), cpu_rate, host_rate))
    return costs, (data_s if measured else args.data_s), measured


def main(argv: list[str] | None = None) -> int:
    from lmlab.errors import LmlabError
    from lmlab.fileio import atomic_write_text, write_json
    from lmlab.lab import load_grid
    from lmlab.ownership import claim_dir

    args = parse_args(argv)
    try:
        check_args(args)
        grid = load_grid(args.config, args.overrides)
        if not first_seed_runs(grid)[0]:
            raise LmlabError(f"grid {grid.name} has no pretraining arm",
                             "size a grid that pretrains something")
        out = claim_dir(args.out or ROOT / "runs" / "sizing" / grid.name, KIND, ENTRIES)
        with tempfile.TemporaryDirectory(prefix="claims-sizing-") as tmp:
            costs, data_s, measured = measure(grid, args, Path(tmp))
    except LmlabError as e:
        print(f"error: {e.problem}; {e.fix}", file=sys.stderr)
        return 2
    estimate_gpu(costs, args, gpu_matmul_rate())
    summary = summarise(grid, costs, first_seed_runs(grid)[1], data_s, measured, args)
    text = markdown(summary, costs, args)
    write_json(out / "sizing.json", summary)
    atomic_write_text(out / "sizing.md", text)
    print(text + f"\nwritten: {out / 'sizing.json'}, {out / 'sizing.md'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
