"""Training-step throughput, MFU and peak memory: lmlab vs Hugging Face transformers, side by side.

For each family (BERT MLM, GPT-2 CLM, Llama CLM, T5 span corruption, BART denoising) one
transformers model is initialised (seed 0) and saved with ``save_pretrained``; lmlab loads that
very directory with ``lmlab.loading.load_model``, so both hold identical weights (checked: the
loss of both on the benchmark batch must agree, dropout off). Then, in ONE process and in
interleaved rounds (lmlab step, HF step, HF step, lmlab step, ...; load drift hits both sides),
each runs ``zero_grad -> forward -> loss.backward -> AdamW.step`` on the same batch.

Reported per row: tokens/s (median step; tokens = batch x (source + target) length), the ratio
lmlab / transformers, MFU = model FLOPs per second / measured fp32 matmul FLOP/s (model FLOPs
from ``lmlab.models.flops.training_flops``: the work the objective needs, so the MLM head counts
only at the masked positions; HFU counts the work the implementation actually does), and peak
tensor memory of one training step (parameters + AdamW state + the step's high-water mark of
activations and gradients, from ``torch.profiler``'s allocator events).

Optional rows: ``--compile`` (lmlab under ``torch.compile``; compile time reported separately,
steady state measured after warm-up) and ``--bf16`` (lmlab with bfloat16 autocast).

    python benchmarks/model_throughput.py --threads 1                  # full shapes (~14M params)
    python benchmarks/model_throughput.py --threads 1 --compile --bf16 # + optional rows
    python benchmarks/model_throughput.py --quick --no-write           # smoke run, seconds
    python benchmarks/model_throughput.py --models bert --profile      # top ops per implementation
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from matmul_peak import QUICK_SIZES, SIZES, matmul_peak  # noqa: E402

from lmlab.errors import LmlabError  # noqa: E402

SECTION = "model_throughput"
FAMILIES = ("bert", "gpt2", "llama", "t5", "bart")
#: lmlab tokens/s over transformers tokens/s: at least as fast, with plain PyTorch models (issue 26:
#: simplicity first; it was 1.2x for BERT and T5 with CPU-only kernels inside the models)
TARGETS = dict.fromkeys(FAMILIES, 1.0)
MFU_TARGET = 0.70
MASK_RATE = 0.15


@dataclass
class Shape:
    batch: int = 8
    seq: int = 256          # encoder / decoder-only length
    dec: int = 64           # T5 target length (span corruption: ~1/4 of the source)
    d_model: int = 384
    layers: int = 6
    heads: int = 6
    d_ff: int = 1536
    vocab: int = 8192


QUICK = Shape(batch=2, seq=32, dec=8, d_model=64, layers=2, heads=4, d_ff=256, vocab=512)


# --------------------------------------------------------------------------- the five setups
def hf_model(family: str, s: Shape, dropout: float | None):
    """A randomly initialised transformers model of ``family`` at shape ``s`` (seed 0)."""
    import transformers as tf

    if family == "bert":
        kw = {} if dropout is None else {"hidden_dropout_prob": dropout,
                                         "attention_probs_dropout_prob": dropout}
        cfg = tf.BertConfig(vocab_size=s.vocab, hidden_size=s.d_model, num_hidden_layers=s.layers,
                            num_attention_heads=s.heads, intermediate_size=s.d_ff,
                            max_position_embeddings=s.seq, **kw)
        cls = tf.BertForMaskedLM
    elif family == "gpt2":
        kw = {} if dropout is None else {"resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout}
        cfg = tf.GPT2Config(vocab_size=s.vocab, n_positions=s.seq, n_embd=s.d_model, n_layer=s.layers,
                            n_head=s.heads, n_inner=s.d_ff, bos_token_id=1, eos_token_id=2, **kw)
        cls = tf.GPT2LMHeadModel
    elif family == "llama":
        kw = {} if dropout is None else {"attention_dropout": dropout}
        # SwiGLU has three matrices: d_ff = 8/3 d keeps the parameters of a 4d two-matrix FFN
        cfg = tf.LlamaConfig(vocab_size=s.vocab, hidden_size=s.d_model, intermediate_size=s.d_ff * 2 // 3,
                             num_hidden_layers=s.layers, num_attention_heads=s.heads,
                             num_key_value_heads=s.heads // 2, max_position_embeddings=s.seq,
                             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=None,
                             **kw)
        cls = tf.LlamaForCausalLM
    elif family == "t5":
        kw = {} if dropout is None else {"dropout_rate": dropout}
        cfg = tf.T5Config(vocab_size=s.vocab, d_model=s.d_model, d_kv=s.d_model // s.heads, d_ff=s.d_ff,
                          num_layers=s.layers, num_decoder_layers=s.layers, num_heads=s.heads,
                          feed_forward_proj="relu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                          **kw)
        cls = tf.T5ForConditionalGeneration
    elif family == "bart":
        kw = {} if dropout is None else {"dropout": dropout, "attention_dropout": dropout,
                                         "activation_dropout": dropout}
        cfg = tf.BartConfig(vocab_size=s.vocab, d_model=s.d_model, encoder_layers=s.layers,
                            decoder_layers=s.layers, encoder_attention_heads=s.heads,
                            decoder_attention_heads=s.heads, encoder_ffn_dim=s.d_ff, decoder_ffn_dim=s.d_ff,
                            max_position_embeddings=s.seq, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                            decoder_start_token_id=2, forced_eos_token_id=2, **kw)
        cls = tf.BartForConditionalGeneration
    else:
        raise SystemExit(f"error: unknown family {family!r}; choose from {', '.join(FAMILIES)}")
    torch.manual_seed(0)
    return cls(cfg)


def make_batch(family: str, s: Shape, seed: int = 0) -> tuple[dict[str, torch.Tensor], int, int]:
    """``(inputs with labels, target length, positions per row that need the output head)``.

    Ids are drawn from ``[5, vocab)`` (clear of the special ids); no padding (packed windows).
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, s.vocab, (s.batch, s.seq), generator=g)
    if family == "bert":  # MLM: exactly 15% of the positions of each row masked and labelled
        k = max(1, round(MASK_RATE * s.seq))
        pos = torch.rand(s.batch, s.seq, generator=g).argsort(dim=1)[:, :k]
        labels = torch.full_like(ids, -100).scatter(1, pos, ids.gather(1, pos))
        return {"input_ids": ids.scatter(1, pos, 4), "labels": labels}, 0, k
    if family in ("gpt2", "llama"):  # CLM: labels = inputs, shifted inside the model
        return {"input_ids": ids, "labels": ids.clone()}, 0, s.seq
    if family == "t5":  # span corruption: source with sentinels, ~1/4-length target
        target = torch.randint(5, s.vocab, (s.batch, s.dec), generator=g)
        return {"input_ids": ids, "labels": target}, s.dec, s.dec
    # BART denoising: corrupted source in, original sequence out
    noisy = ids.masked_fill(torch.rand(ids.shape, generator=g) < 0.3, 4)
    return {"input_ids": noisy, "labels": ids}, s.seq, s.seq


# --------------------------------------------------------------------------- one implementation
@dataclass
class Runner:
    """One model + its optimizer, stepped on one batch; collects step times."""

    name: str
    model: torch.nn.Module
    batch: dict[str, torch.Tensor]
    autocast: torch.dtype | None = None
    #: where model and batch live ("cpu" or "cuda"): the autocast device; CUDA steps are timed
    #: between two ``torch.cuda.synchronize()`` calls (kernels run asynchronously)
    device: str = "cpu"
    fused: bool = False  # AdamW's fused kernel (one pass over all parameters)
    #: ``loss_fn(model, batch)``: the training loss; default ``model(**batch).loss`` (transformers)
    loss_fn: Any = None
    times: list[float] = field(default_factory=list)
    first_step: float | None = None

    def __post_init__(self):
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=self.fused or None)

    def step(self) -> float:
        sync = torch.cuda.synchronize if self.device == "cuda" else _no_sync
        sync()
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        ctx = torch.autocast(self.device, dtype=self.autocast) if self.autocast else contextlib.nullcontext()
        with ctx:
            loss = self.loss_fn(self.model, self.batch) if self.loss_fn else self.model(**self.batch).loss
        loss.backward()
        self.optimizer.step()
        sync()
        return time.perf_counter() - t0


def _no_sync() -> None:
    """CPU kernels finish before they return: nothing to wait for."""


def warm_up(r: Runner, steps: int) -> None:
    """``steps`` untimed steps; the first one's time is kept (it includes any compiling)."""
    for i in range(steps):
        dt = r.step()
        if i == 0:
            r.first_step = dt


def interleaved_rounds(runners: list[Runner], steps: int, before_round=None, on_error=None) -> list[Runner]:
    """``steps`` timed rounds, every runner once per round, the order reversed every other round
    (load drift on a shared machine hits every side alike); ``before_round()`` runs before each.

    Without ``on_error`` a step's exception propagates. With it, a runner whose step raises leaves
    the rounds and ``on_error(runner, "Type: message")`` is called once the exception (and the
    traceback that holds the step's activations) is gone. Returns the runners that finished."""
    live = list(runners)
    for rnd in range(steps):
        if before_round is not None:
            before_round()
        for r in (list(live) if rnd % 2 == 0 else live[::-1]):
            try:
                r.times.append(r.step())
                continue
            except Exception as err:
                if on_error is None:
                    raise
                error = f"{type(err).__name__}: {err}"
            live.remove(r)
            on_error(r, error)
    return live


def peak_step_memory(r: Runner) -> float:
    """MB: parameters + AdamW state + the allocator high-water mark of one profiled step."""
    from torch.profiler import ProfilerActivity, profile

    static = common.static_bytes(r.model, r.optimizer)
    r.optimizer.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        r.step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    peak = max((e["args"].get("Total Allocated", 0) for e in events if e.get("name") == "[memory]"),
               default=0)
    return (static + peak) / 2**20


def print_profile(r: Runner, rows: int = 18) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        r.step()
    print(f"\n--- profile: {r.name} (one training step) ---")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


# --------------------------------------------------------------------------- one family
def lmlab_loss(family: str):
    """``loss(model, batch)`` as lmlab's pretraining computes it: the objective's path (backbone,
    the head at the positions the objective scores, :mod:`lmlab.losses`), not the deprecated
    ``forward(labels=...)``."""
    from lmlab.losses import causal_lm_loss
    from lmlab.objectives.base import encoder_hidden, mask_of, masked_lm, teacher_forced

    if family == "bert":
        return lambda model, batch: masked_lm(model, encoder_hidden(model, batch), batch)[1]
    if family in ("gpt2", "llama"):
        return lambda model, batch: causal_lm_loss(
            model.heads["lm"](model.backbone(batch["input_ids"], batch.get("position_ids"),
                                             mask_of(batch, causal=True))),
            batch["labels"])
    return lambda model, batch: teacher_forced(model, batch)[1]


def eval_loss(model, batch, loss_fn=None) -> float:
    model.eval()
    with torch.no_grad():
        loss = float(loss_fn(model, batch) if loss_fn else model(**batch).loss)
    model.train()
    return loss


def compiled_copy(model):
    """A compiled copy of an lmlab model (``model.compile()`` compiles the stacks the objective's
    path calls, which ``torch.compile(model)`` would leave out)."""
    twin = copy.deepcopy(model)
    twin.compile()
    return twin


def same_weight_models(family: str, s: Shape, dropout: float | None):
    """``(transformers model, lmlab model)`` holding identical weights: lmlab loads the very
    directory the transformers model was saved to."""
    from lmlab.loading import load_model

    hf = hf_model(family, s, dropout)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        lm = load_model(tmp)
    return hf, lm


def run_family(family: str, s: Shape, args) -> dict[str, Any]:
    from lmlab.models.flops import training_flops

    hf, lm = same_weight_models(family, s, args.dropout)
    batch, dec_len, head_positions = make_batch(family, s)
    n_hf, n_lm = sum(p.numel() for p in hf.parameters()), lm.num_parameters()
    lm_loss = lmlab_loss(family)
    loss_hf, loss_lm = eval_loss(hf, batch), eval_loss(lm, batch, lm_loss)
    hf.train()
    lm.train()

    runners = [Runner("lmlab", lm, batch, loss_fn=lm_loss), Runner("transformers", hf, batch)]
    if args.bf16:
        runners.append(Runner("lmlab bf16", copy.deepcopy(lm), batch, autocast=torch.bfloat16,
                              loss_fn=lm_loss))
    if args.compile:
        runners.append(Runner("lmlab compiled", compiled_copy(lm), batch, loss_fn=lm_loss))
    for r in runners:  # warm-up (compile happens in the first step)
        warm_up(r, args.warmup)
    round_peaks = []  # fp32 matmul rate measured in every round: MFU per round, robust to load swings
    interleaved_rounds(runners, args.steps, lambda: round_peaks.append(
        matmul_peak(args.peak_sizes, seconds=args.peak_seconds, repeats=1)["flops"]))

    tokens = s.batch * (s.seq + dec_len)
    cfg = lm.config
    dec = dec_len or None
    model_flops = training_flops(cfg, s.seq, s.batch, decoder_len=dec, logit_positions=head_positions)
    done = {  # FLOPs each implementation actually performs
        "lmlab": model_flops,
        "transformers": training_flops(cfg, s.seq, s.batch, decoder_len=dec,
                                       logit_positions=s.seq if family == "bert" else None),
    }
    result: dict[str, Any] = {
        "family": family, "params_lmlab": n_lm, "params_hf": n_hf, "tokens_per_step": tokens,
        "loss_lmlab": loss_lm, "loss_hf": loss_hf, "model_flops_per_step": model_flops,
        "hf_attention": getattr(hf.config, "_attn_implementation", "?"), "rows": {},
        "round_peaks": round_peaks,
    }
    for r in runners:
        med = statistics.median(r.times)
        work = done["transformers" if r.name == "transformers" else "lmlab"]
        row = {"step_s": med, "tokens_per_s": tokens / med, "model_flops_per_s": model_flops / med,
               "done_flops_per_s": work / med, "times": r.times, "first_step_s": r.first_step,
               "mfu": statistics.median(model_flops / t / p for t, p in zip(r.times, round_peaks)),
               "hfu": statistics.median(work / t / p for t, p in zip(r.times, round_peaks))}
        if args.memory:
            row["peak_mb"] = peak_step_memory(r)
        result["rows"][r.name] = row
    if args.profile:
        for r in runners:
            print_profile(r)
    return result


# --------------------------------------------------------------------------- report
def report(results: list[dict], header: str, args) -> str:
    headers = ["model", "objective", "params", "tokens/step", "implementation", "tokens/s",
               "lmlab / HF", "target", "verdict", "MFU", "HFU", f"MFU ≥{MFU_TARGET:.0%}",
               "peak MB", "loss lmlab / HF"]
    objectives = {"bert": "MLM 15%", "gpt2": "CLM", "llama": "CLM", "t5": "span corruption",
                  "bart": "denoising"}
    rows = []
    for res in results:
        fam = res["family"]
        if "error" in res:
            rows.append([fam, objectives[fam], "—", "—", "failed", *["—"] * 3, "n/a", *["—"] * 5])
            continue
        hf_rate = res["rows"]["transformers"]["tokens_per_s"]
        for name, row in res["rows"].items():
            is_lmlab = name != "transformers"
            ratio = row["tokens_per_s"] / hf_rate if is_lmlab else None
            target = TARGETS.get(fam) if is_lmlab else None
            mfu, hfu = row["mfu"], row["hfu"]
            impl = name if is_lmlab else f"transformers ({res['hf_attention']})"
            if name == "lmlab compiled" and row.get("first_step_s"):
                impl += f" (compile {row['first_step_s']:.0f} s)"
            rows.append([
                fam, objectives[fam], f"{res['params_lmlab'] / 1e6:.1f}M", res["tokens_per_step"], impl,
                f"{row['tokens_per_s']:.0f}", "—" if ratio is None else f"{ratio:.2f}x",
                "—" if target is None else f"≥{target}x",
                "—" if target is None else common.verdict(ratio, target, higher_is_better=True),
                f"{mfu:.0%}", f"{hfu:.0%}",
                common.verdict(mfu, MFU_TARGET, higher_is_better=True) if is_lmlab else "—",
                common.fmt(row.get("peak_mb"), 0),
                f"{res['loss_lmlab']:.4f} / {res['loss_hf']:.4f}" if not is_lmlab else "",
            ])
    notes = [f"- {r['family']}: failed: {r['error']}" for r in results if "error" in r]
    notes += [f"- {r['family']}: parameter counts differ: lmlab {r['params_lmlab']}, HF {r['params_hf']}"
              for r in results if "error" not in r and r["params_lmlab"] != r["params_hf"]]
    table = common.markdown_table(headers, rows)
    return "\n".join(["## Model training-step throughput (`benchmarks/model_throughput.py`)", "",
                      header, "", table, "", *([*notes, ""] if notes else []), LEGEND.strip(), ""])


LEGEND = """
Columns: **tokens/s** = batch x (source + target) tokens per second, median over the timed
steps of `zero_grad -> forward -> backward -> AdamW.step`; **lmlab / HF** = tokens/s ratio in
this run; **MFU** = model FLOPs per second (the work the objective needs: 6 x matmul parameters per
token + attention, the MLM head only at the 15% labelled positions; `lmlab.models.flops`) over the
fp32 matmul rate measured in the same round (1024² and 2048² matmuls, just before the round's
steps; median over rounds, so a load swing moves both); **HFU** = the FLOPs the implementation really performs
(transformers computes the MLM vocabulary projection at every position) over the same rate
(the bf16 row is measured against the same fp32 rate, so its MFU can exceed 100%);
**peak MB** = parameters + AdamW state + allocator high-water mark of one step (`torch.profiler`:
what PyTorch's allocator hands out);
**loss lmlab / HF** = both models on the benchmark batch in eval mode: equal = same weights, same math.
"""


def header_lines(args, threads_reason: str, dtype_reason: str, peaks: list[dict], s: Shape,
                 load_start: tuple, started: float, round_peaks: list[float]) -> str:
    import importlib.metadata as md

    from lmlab.runtime import physical_cores

    cores = physical_cores()
    load_end = os.getloadavg()
    busy = max(load_start[0], load_end[0]) > (cores or 1)
    peak = max(p["flops"] for p in peaks)
    best_size = int(max(peaks, key=lambda p: p["flops"])["size"])
    before_after = " / ".join(f"{p['flops'] / 1e9:.1f}" for p in peaks)
    load_note = "**Measured under load** (load average above the core count): treat figures as rough. "
    lines = [
        f"{load_note if busy else ''}Machine: {common.machine_line().split('; Python')[0]}, "
        f"load {load_end[0]:.2f} at the end; "
        f"torch {torch.__version__}, transformers {md.version('transformers')}.",
        f"Shape: batch {s.batch}, context {s.seq} (T5 target {s.dec}; BART target {s.seq}), "
        f"d_model {s.d_model}, {s.layers} layers (per stack), {s.heads} heads, d_ff {s.d_ff} "
        f"(Llama SwiGLU {s.d_ff * 2 // 3}, "
        f"{s.heads // 2} kv heads), vocab {s.vocab}; no padding; dropout "
        f"{'as in each transformers config' if args.dropout is None else args.dropout}; "
        f"{args.warmup} warm-up + {args.steps} timed steps per row, interleaved.",
        f"Threads: {threads_reason}. Precision: float32 rows; auto here: {dtype_reason}.",
        f"fp32 matmul rate (same process, same threads): {peak / 1e9:.1f} GFLOP/s at best "
        f"(square {best_size}; {before_after} before / after the models; "
        f"{min(round_peaks, default=0) / 1e9:.1f}-{max(round_peaks, default=0) / 1e9:.1f} GFLOP/s in the "
        f"rounds, which is what MFU divides by). "
        f"Run took {time.time() - started:.0f} s.",
        f"Re-run on a quiet machine: `{args.command}`",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 1+2 steps: a smoke run")
    ap.add_argument("--models", default=",".join(FAMILIES), help="comma-separated subset of the default")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per row (default 6; quick 2)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per row (default 2; quick 1)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: auto)")
    ap.add_argument("--dropout", type=float, default=None, help="set every dropout (default: HF's)")
    ap.add_argument("--compile", action="store_true", help="add an lmlab torch.compile row")
    ap.add_argument("--bf16", action="store_true", help="add an lmlab bfloat16-autocast row")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip the profiled memory step")
    ap.add_argument("--profile", action="store_true", help="print the top ops of one step per row")
    common.add_output_options(ap)
    args = ap.parse_args(argv)
    args.command = common.rerun_command("model_throughput.py", argv)
    common.require_counts(args, {"steps": 6, "warmup": 2, "batch": 8})
    args.steps = args.steps or (2 if args.quick else 6)
    args.warmup = args.warmup or (1 if args.quick else 2)
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    started, load_start = time.time(), os.getloadavg()
    from lmlab.runtime import choose_precision, choose_threads, set_threads

    threads, threads_reason = choose_threads(args.threads)
    set_threads(threads)
    _, dtype_reason = choose_precision("auto", torch.device("cpu"))
    s = copy.copy(QUICK if args.quick else Shape())
    if args.batch:
        s.batch = args.batch
    sizes = QUICK_SIZES if args.quick else SIZES
    seconds = 0.05 if args.quick else 0.4
    args.peak_sizes, args.peak_seconds = sizes, seconds / 2
    peaks = [matmul_peak(sizes, seconds=seconds)]
    print(f"threads: {threads_reason}\nfp32 matmul: {peaks[0]['flops'] / 1e9:.1f} GFLOP/s", flush=True)
    results = []
    for family in [f.strip() for f in args.models.split(",") if f.strip()]:
        t0 = time.time()
        try:
            res = run_family(family, s, args)
        except Exception as err:  # one broken family costs its rows, not the run
            res = {"family": family, "error": f"{type(err).__name__}: {err}"[:300]}
        rates = {k: round(v["tokens_per_s"]) for k, v in res.get("rows", {}).items()}
        print(f"{family}: {rates or res.get('error')} ({time.time() - t0:.0f} s)", flush=True)
        results.append(res)
    peaks.append(matmul_peak(sizes, seconds=seconds))
    rounds = [p for r in results for p in r.get("round_peaks", [])]
    header = header_lines(args, threads_reason, dtype_reason, peaks, s, load_start, started, rounds)
    text = report(results, header, args)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"peaks": peaks, "results": results}, indent=1))
    if not args.no_write:
        common.update_section(SECTION, text, args.markdown)
        print(f"wrote section {SECTION} of {args.markdown}")
    return results

if __name__ == "__main__":
    try:
        main()
    except LmlabError as e:  # bad input: one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
