"""GPU training-step throughput at full model sizes: every GPU target of the issue in one call.

    python benchmarks/gpu_throughput.py                        # on a lent GPU: all four groups
    python benchmarks/gpu_throughput.py --models gpt2,packed   # a subset of gpt2,bert,t5,packed
    python benchmarks/gpu_throughput.py --quick --no-write     # smoke run: tiny shapes (CPU without CUDA)

Each group runs its implementations side by side in one process, on the same batch, in
interleaved rounds (every row once per round, the order reversed every other round), with bf16
autocast (weights and AdamW state stay float32), fused AdamW and dropout 0 on every side:

* **gpt2**: GPT-2 124M (12 layers, d 768, 12 heads, context 1024, vocab 50257), batch 16 x 1024:
  lmlab eager and under ``torch.compile``, transformers (sdpa), and the nanoGPT-style model of
  ``pretrain_throughput.py`` (``PlainGPT``) eager and compiled. Targets: lmlab compiled >= 50% MFU
  and >= 1.0x the compiled nanoGPT-style loop.
* **bert**: BERT-base MLM (12 x 768, 12 heads, d_ff 3072, vocab 30522), batch 32 x 512, 15% of
  each row masked: lmlab eager and compiled on its MLM objective's path (the head at the masked
  positions only) vs transformers. Target: >= 1.3x transformers. Every lmlab row computes its loss
  as its objective does (``model_throughput.lmlab_loss``: backbone, head, ``lmlab.losses``).
* **t5**: T5-base (12 + 12 layers, d 768, 12 heads, d_ff 3072, vocab 32128), batch 32 x (512
  source + 128 target): lmlab eager and compiled vs transformers. Targets: >= 1.5x, >= 30% MFU.
* **packed**: GPT-2 124M CLM on rows that hold several documents (``doc_ids`` and per-document
  positions from lmlab's own CLM objective; on CUDA the model builds FlexAttention's
  block-sparse mask) against the same rows as one document each (the fused causal kernel);
  eager and compiled. Target: packed >= 0.97x one document per row.

lmlab and transformers hold the same weights (``save_pretrained`` -> ``lmlab.loading.load_model``,
as ``model_throughput.py``; the nanoGPT-style model gets the same GPT-2 weights copied in): the
report lists each side's float32 eval loss on the benchmark batch, which must agree.
MFU = model FLOPs per step (``lmlab.models.flops.training_flops``) / median step time / the bf16
matmul rate measured in the same run (``matmul_peak.py``, before and after the groups, the best):
the issue's definition, not the card's rated peak. Peak GB = ``torch.cuda.max_memory_allocated``
during one extra step of the row, less what the other rows hold. Compile time (first step minus a
steady step) is listed below the table. A row that fails (out of memory, say) in its warm-up or
timed steps shows its error and lets go of its model and AdamW state; the other rows keep their
figures. ``--dropout`` above 0 is refused with the packed group: FlexAttention has no attention
dropout, so the model would run the dense kernel under FlexAttention's name.

Default shapes need a CUDA device. ``--quick`` runs tiny shapes, 1 warm-up + 2 timed steps per
row, on CUDA when there is one, else on the CPU: a smoke run that proves every row runs end to
end (verdicts n/a). On a CPU the compiled rows are skipped unless ``--compile-on-cpu`` (inductor
took 2-36 s per tiny model on a 2-core CPU). The full run is sized for one call of under
~8 minutes on one H100 (an estimate, not yet measured: no GPU was lent while it was written):
3 warm-up + 10 timed steps per row, four models compiled (lmlab GPT-2, BERT, T5 and the
nanoGPT-style model); the packed group's compiled rows (two more graphs) need
``--packed-compiled``. After each group the report and ``--json`` are rewritten, marked partial,
so a call cut short by a time limit keeps what it measured. On a lent machine only ``$OUT``
comes back: ``cp BENCHMARKS.md $OUT/ && python benchmarks/gpu_throughput.py --markdown
$OUT/BENCHMARKS.md --json $OUT/gpu.json``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from matmul_peak import QUICK_SIZES, matmul_peak  # noqa: E402
from model_throughput import (  # noqa: E402
    QUICK,
    Runner,
    Shape,
    compiled_copy,
    eval_loss,
    interleaved_rounds,
    lmlab_loss,
    make_batch,
    same_weight_models,
    warm_up,
)
from pretrain_throughput import PlainGPT  # noqa: E402

from lmlab.errors import LmlabError  # noqa: E402

SECTION = "gpu_throughput"
GROUPS = ("gpt2", "bert", "t5", "packed")
GPT2 = Shape(batch=16, seq=1024, d_model=768, layers=12, heads=12, d_ff=3072, vocab=50257)
FULL = {
    "gpt2": GPT2,
    "bert": Shape(batch=32, seq=512, d_model=768, layers=12, heads=12, d_ff=3072, vocab=30522),
    "t5": Shape(batch=32, seq=512, dec=128, d_model=768, layers=12, heads=12, d_ff=3072, vocab=32128),
    "packed": GPT2,
}
#: mean document length of the packed rows (tokens): ~4 documents per 1024-token row
MEAN_DOC = {False: 256, True: 8}
PEAK_SIZES = (4096, 8192)  # a GPU reaches its bf16 matmul rate only on large squares
NAMES = {"gpt2": "GPT-2 CLM", "bert": "BERT MLM 15%", "t5": "T5 span corruption",
         "packed": "GPT-2 CLM, packed documents"}
COMPILE_SKIPPED = ("skipped on a CPU: inductor took 2-36 s per model here even at tiny shapes "
                   "(--compile-on-cpu runs it)")
PACKED_COMPILE_SKIPPED = ("not run by default: two more compiled graphs of GPT-2, left out to keep one call "
                          "under ~8 minutes (--packed-compiled adds them)")


@dataclass(frozen=True)
class Row:
    """One implementation of a group, what its ratio is taken against and its targets."""

    name: str
    ref: str | None = None          # the row of the same group its tokens/s ratio divides by
    ratio_target: float | None = None
    mfu_target: float | None = None

    @property
    def compiled(self) -> bool:
        return "compiled" in self.name


def skip_reason(group: str, spec: Row, args) -> str | None:
    """Why ``spec`` is not run in this call (None: it runs)."""
    if not spec.compiled:
        return None
    if not args.compiled:
        return COMPILE_SKIPPED
    return PACKED_COMPILE_SKIPPED if group == "packed" and not args.packed_compiled else None


def spec_of(group: str, name: str) -> Row:
    """The row of ``group`` called ``name`` (KeyError for a name ``ROWS`` does not list)."""
    return {spec.name: spec for spec in ROWS[group]}[name]


ONE_DOC, PACKED = "one document per row", "packed documents"
ROWS: dict[str, tuple[Row, ...]] = {
    "gpt2": (Row("lmlab", "transformers"),
             Row("lmlab compiled", "nanoGPT-style compiled", 1.0, 0.50),
             Row("transformers"), Row("nanoGPT-style"), Row("nanoGPT-style compiled")),
    "bert": (Row("lmlab", "transformers", 1.3), Row("lmlab compiled", "transformers", 1.3),
             Row("transformers")),
    "t5": (Row("lmlab", "transformers", 1.5, 0.30), Row("lmlab compiled", "transformers", 1.5, 0.30),
           Row("transformers")),
    "packed": (Row(f"lmlab, {ONE_DOC}"), Row(f"lmlab, {PACKED}", f"lmlab, {ONE_DOC}", 0.97),
               Row(f"lmlab compiled, {ONE_DOC}"),
               Row(f"lmlab compiled, {PACKED}", f"lmlab compiled, {ONE_DOC}", 0.97)),
}


# --------------------------------------------------------------------------- the nanoGPT-style side
class NanoGPTStep(nn.Module):
    """``PlainGPT`` behind the ``model(**batch).loss`` call a Runner makes. ``labels`` are the
    input ids, shifted here as GPT2LMHeadModel shifts them (the last position predicts nothing)."""

    def __init__(self, gpt: nn.Module):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids, labels):
        targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -1)], dim=1)
        return SimpleNamespace(loss=self.gpt(input_ids, targets))


def nanogpt_from(hf) -> PlainGPT:
    """A ``PlainGPT`` holding the weights of a transformers ``GPT2LMHeadModel`` (its Conv1D
    matrices are stored input-major: transposed into ``nn.Linear``'s layout)."""
    c, t = hf.config, hf.transformer
    gpt = PlainGPT(c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_head, c.n_inner)
    with torch.no_grad():
        gpt.wte.weight.copy_(t.wte.weight)  # the tied head with it
        gpt.wpe.weight.copy_(t.wpe.weight)
        norms = [(gpt.ln_f, t.ln_f)]
        for mine, theirs in zip(gpt.blocks, t.h):
            norms += [(mine.ln1, theirs.ln_1), (mine.ln2, theirs.ln_2)]
            for lin, conv in ((mine.qkv, theirs.attn.c_attn), (mine.proj, theirs.attn.c_proj),
                              (mine.fc, theirs.mlp.c_fc), (mine.out, theirs.mlp.c_proj)):
                lin.weight.copy_(conv.weight.t())
                lin.bias.copy_(conv.bias)
        for mine, theirs in norms:
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
    return gpt


# --------------------------------------------------------------------------- packed rows
def packed_batches(s: Shape, mean_doc: int, seed: int = 0) -> tuple[dict, dict, float]:
    """``(packed inputs, the same rows as one document each, documents per row)``.

    Documents start at random positions (each position with probability ``1 / mean_doc``, the
    first always); lmlab's CLM objective turns both into model inputs, exactly as the trainer
    does: per-document positions, no target at a document's first token, ``doc_ids`` only where
    a row holds more than one document."""
    from lmlab.data.batch import TokenBatch
    from lmlab.objectives.clm import CausalLM

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, s.vocab, (s.batch, s.seq), generator=g)
    starts = torch.rand(s.batch, s.seq, generator=g) < 1.0 / mean_doc
    starts[:, 0] = True
    doc_ids = starts.long().cumsum(1) - 1
    index = torch.arange(s.seq).expand(s.batch, -1)
    positions = index - torch.where(starts, index, 0).cummax(1).values
    clm = CausalLM(SimpleNamespace(vocab_size=s.vocab, special_ids=()))
    packed = clm.prepare(TokenBatch(ids, doc_ids, positions))
    single = clm.prepare(TokenBatch(ids, torch.zeros_like(ids), index.clone()))
    return packed, single, float(starts.sum(1).float().mean())


# --------------------------------------------------------------------------- one group
def on_device(batch: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def build_group(group: str, s: Shape, args) -> tuple[dict[str, Runner], dict[str, Any]]:
    """The runners of ``group`` (the rows ``skip_reason`` lets run in this call) and what the
    report needs: losses (same weights), tokens and model FLOPs per step, parameters."""
    from lmlab.models.flops import training_flops

    device = args.device
    family = "gpt2" if group == "packed" else group
    hf, lm = same_weight_models(family, s, args.dropout)
    lm.to(device)
    batch, dec_len, head_positions = make_batch(family, s)
    info: dict[str, Any] = {"params": lm.num_parameters(),
                            "params_hf": sum(p.numel() for p in hf.parameters()),
                            "hf_attention": getattr(hf.config, "_attn_implementation", "?"),
                            "tokens_per_step": s.batch * (s.seq + dec_len),
                            "model_flops_per_step": training_flops(lm.config, s.seq, s.batch,
                                                                   decoder_len=dec_len or None,
                                                                   logit_positions=head_positions)}
    wanted: dict[str, tuple[nn.Module, dict, Any]] = {}
    lm_loss = lmlab_loss(family)  # the objective's path: backbone, head, lmlab.losses

    def add(name: str, model, inputs: dict, loss_fn=None) -> None:
        """Row ``name`` on ``model`` (a module, or a function that makes one: called only when the
        row runs, so a skipped compiled row costs no copy of the model); ``loss_fn(model, inputs)``
        for lmlab's rows (None: ``model(**inputs).loss``, transformers')."""
        if skip_reason(group, spec_of(group, name), args) is None:
            wanted[name] = (model if isinstance(model, nn.Module) else model(), inputs, loss_fn)

    def compiled(model: nn.Module):
        return lambda: compiled_copy(model)

    if group == "packed":
        packed, single, docs = packed_batches(s, MEAN_DOC[args.quick])
        packed, single = on_device(packed, device), on_device(single, device)
        info["docs_per_row"] = docs
        del hf
        lm.attention_backend = "flex"  # what train.attention=auto picks on CUDA
        dense = copy.deepcopy(lm)
        dense.attention_backend = "sdpa"
        info["losses"] = {"packed, lmlab's mask backend": eval_loss(lm, packed, lm_loss),
                          "packed, dense mask": eval_loss(dense, packed, lm_loss),
                          ONE_DOC: eval_loss(lm, single, lm_loss)}
        del dense
        add(f"lmlab, {ONE_DOC}", lm, single, lm_loss)
        add(f"lmlab, {PACKED}", lm, packed, lm_loss)
        lm_c = functools.cache(compiled(lm))  # one module, two graphs (with, without doc_ids)
        add(f"lmlab compiled, {ONE_DOC}", lm_c, single, lm_loss)
        add(f"lmlab compiled, {PACKED}", lm_c, packed, lm_loss)
        return runners(wanted, args), info

    hf.to(device)  # only the groups that time transformers move it to the device
    hf_batch = on_device(batch, device)
    lm_batch = dict(hf_batch)
    info["losses"] = {"lmlab": eval_loss(lm, lm_batch, lm_loss), "transformers": eval_loss(hf, hf_batch)}
    add("lmlab", lm, lm_batch, lm_loss)
    add("lmlab compiled", compiled(lm), lm_batch, lm_loss)
    add("transformers", hf, hf_batch)
    if group == "gpt2":
        nano = NanoGPTStep(nanogpt_from(hf).to(device))
        info["losses"]["nanoGPT-style"] = eval_loss(nano, hf_batch)
        add("nanoGPT-style", nano, hf_batch)
        add("nanoGPT-style compiled", lambda: NanoGPTStep(torch.compile(copy.deepcopy(nano.gpt))), hf_batch)
    return runners(wanted, args), info


def runners(wanted: dict[str, tuple[nn.Module, dict, Any]], args) -> dict[str, Runner]:
    return {name: Runner(name, model, inputs, autocast=torch.bfloat16, device=args.device, fused=True,
                         loss_fn=loss_fn)
            for name, (model, inputs, loss_fn) in wanted.items()}


def cuda_peak_gb(r: Runner) -> float:
    """GB (10^9 bytes) one training step of ``r`` needs on its own: its parameters, gradients and
    optimizer state, plus the allocator's high-water mark above what was allocated before."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    r.step()
    own = common.static_bytes(r.model, r.optimizer, grads=True)
    return (own + torch.cuda.max_memory_allocated() - base) / 1e9


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def free_memory(device: str) -> None:
    """Collect what is unreferenced (a traceback's frames sit in cycles) and, on CUDA, hand the
    cached blocks back so the next row starts from what the live rows really hold."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def drop_row(rows: dict[str, dict], r: Runner, error: str, device: str, label: str = "") -> None:
    """Record ``r`` as failed with ``error`` and let go of what it holds: its AdamW state, and its
    model unless another row shares it. Called after the ``except`` block, once the traceback
    (which holds the failed step's activations) is gone."""
    rows[r.name] = {"error": error[:300]}
    r.model = r.optimizer = None
    free_memory(device)
    print(f"  {label}{r.name}: failed: {rows[r.name]['error']}", flush=True)


def timed_rounds(runners: list[Runner], steps: int, rows: dict[str, dict], device: str,
                 label: str = "") -> list[Runner]:
    """``interleaved_rounds`` where a row whose step raises (out of memory, say) is recorded in
    ``rows`` as failed and leaves the rounds; the other rows keep their times. Returns those."""
    return interleaved_rounds(runners, steps,
                              on_error=lambda r, error: drop_row(rows, r, error, device, label))


def run_group(group: str, s: Shape, args) -> dict[str, Any]:
    result: dict[str, Any] = {"group": group, "shape": vars(s).copy(), "rows": {}}
    built, info = build_group(group, s, args)
    result.update(info)
    label = f"{group} / "
    live = []
    for r in built.values():  # one broken row costs its row, not the group
        error = None
        try:
            warm_up(r, args.warmup)
        except Exception as err:
            error = error_text(err)
        if error is None:
            live.append(r)
            print(f"  {label}{r.name}: first step {r.first_step:.1f} s", flush=True)
        else:
            drop_row(result["rows"], r, error, args.device, label)
    live = timed_rounds(live, args.steps, result["rows"], args.device, label)
    tokens, flops = info["tokens_per_step"], info["model_flops_per_step"]
    for r in live:
        med = statistics.median(r.times)
        row = {"step_s": med, "tokens_per_s": tokens / med, "model_flops_per_s": flops / med,
               "times": r.times, "first_step_s": r.first_step,
               "compile_s": max(0.0, r.first_step - med) if "compiled" in r.name else None}
        result["rows"][r.name] = row
        if args.device == "cuda":  # the timed figures stand whether or not the extra step fits
            try:
                row["peak_gb"] = cuda_peak_gb(r)
            except Exception as err:
                row["peak_error"] = error_text(err)[:300]
            if "peak_error" in row:
                free_memory(args.device)
                print(f"  {label}{r.name}: peak GB step failed: {row['peak_error']}", flush=True)
    for spec in ROWS[group]:
        why = skip_reason(group, spec, args)
        if why:
            result["rows"][spec.name] = {"skipped": why}
    result["rows"] = {spec.name: result["rows"][spec.name] for spec in ROWS[group]}  # table order
    return result


def judge(results: list[dict], peak: float, judged: bool) -> None:
    """Add MFU, ratios and verdicts to every measured row (``judged`` False: verdicts n/a)."""
    for res in results:
        rows = res.get("rows", {})
        for spec in ROWS[res["group"]]:
            row = rows.get(spec.name, {})
            if "tokens_per_s" not in row:
                continue
            row["mfu"] = row["model_flops_per_s"] / peak
            ref = rows.get(spec.ref, {}) if spec.ref else {}
            row["ratio"] = row["tokens_per_s"] / ref["tokens_per_s"] if "tokens_per_s" in ref else None
            checks = []
            if spec.ratio_target is not None:
                checks.append((row["ratio"], spec.ratio_target))
            if spec.mfu_target is not None:
                checks.append((row["mfu"], spec.mfu_target))
            if checks:
                row["verdict"] = ("; ".join(common.verdict(v, t, higher_is_better=True) for v, t in checks)
                                  if judged else "n/a")


# --------------------------------------------------------------------------- report
def target_text(spec: Row) -> str:
    parts = []
    if spec.ratio_target is not None:
        parts.append(f"≥{spec.ratio_target}x {spec.ref}")
    if spec.mfu_target is not None:
        parts.append(f"MFU ≥{spec.mfu_target:.0%}")
    return "; ".join(parts) or "—"


def report(results: list[dict], header: str) -> str:
    headers = ["model", "implementation", "tokens/s", "ratio", "MFU", "target", "verdict", "peak GB"]
    rows, notes = [], []
    for res in results:
        group = res["group"]
        if "error" in res:
            rows.append([NAMES[group], "failed", "—", "—", "—", "—", "n/a", "—"])
            notes.append(f"- {group}: failed: {res['error']}")
            continue
        model = f"{NAMES[group]} {res['params'] / 1e6:.1f}M"
        for spec in ROWS[group]:
            row = res["rows"][spec.name]
            impl = f"transformers ({res['hf_attention']})" if spec.name == "transformers" else spec.name
            if "tokens_per_s" not in row:
                why = row.get("skipped") or f"failed: {row.get('error')}"
                rows.append([model, impl, "—", "—", "—", target_text(spec), "n/a", "—"])
                notes.append(f"- {group} / {spec.name}: {why}")
                continue
            ratio = "—" if row.get("ratio") is None else f"{row['ratio']:.2f}x {spec.ref}"
            peak = "failed" if "peak_error" in row else common.fmt(row.get("peak_gb"), 1)
            rows.append([model, impl, f"{row['tokens_per_s']:,.0f}", ratio, f"{row['mfu']:.0%}",
                         target_text(spec), row.get("verdict", "—"), peak])
            if "peak_error" in row:
                notes.append(f"- {group} / {spec.name}: peak GB step failed: {row['peak_error']}")
        losses = ", ".join(f"{k} {v:.4f}" for k, v in res["losses"].items())
        notes.append(f"- {group}: float32 eval loss on the benchmark batch (same weights): {losses}")
        compiles = [f"{name} {row['compile_s']:.0f} s" for name, row in res["rows"].items()
                    if row.get("compile_s") is not None]
        if compiles:
            notes.append(f"- {group}: compile time (first step minus a steady step): {', '.join(compiles)}")
        if res["params"] != res["params_hf"]:
            notes.append(f"- {group}: parameter counts differ: lmlab {res['params']:,}, "
                         f"transformers {res['params_hf']:,}")
        if group == "packed":
            notes.append(f"- packed: {res['docs_per_row']:.1f} documents per row on average; MFU counts "
                         "full causal attention for both (the packed rows need less)")
    table = common.markdown_table(headers, rows)
    return "\n".join(["## GPU training-step throughput (`benchmarks/gpu_throughput.py`)", "", header, "",
                      table, "", *notes, "", LEGEND.strip(), ""])


LEGEND = """
**tokens/s** = batch x (source + target) tokens / median step time over the timed steps of
`zero_grad -> forward (bf16 autocast) -> backward -> fused AdamW.step`, CUDA synchronised around
each step; **ratio** = tokens/s over the named row's in the same run; **MFU** = model FLOPs per
step (`lmlab.models.flops`: 6 x matmul parameters per token + attention, the MLM head only at the
15% labelled positions) / step time / the bf16 matmul rate measured in this run (the issue's
definition, and what the MFU targets are judged on: not the card's rated peak, which is higher, so
this MFU reads higher than one against the datasheet); **peak GB** = one step's allocator
high-water mark plus the row's own parameters, gradients and AdamW state
(`torch.cuda.max_memory_allocated`; — on a CPU; "failed" when that extra step did not fit).
"""


def header_lines(args, peaks: list[dict], started: float) -> str:
    import transformers

    peak = max(p["flops"] for p in peaks)
    if args.device == "cuda":
        machine = f"{torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}"
    else:
        machine = f"CPU: {common.machine_line().split('; Python')[0]}"
    lines = [
        ("**CPU smoke run** (no CUDA device, tiny shapes): it shows that every row runs end to end; "
         "its figures mean nothing for the GPU targets, so every verdict is n/a. " if args.device == "cpu"
         else "**Smoke run** (`--quick`, tiny shapes): verdicts n/a. " if args.quick else "")
        + f"Device: {machine}; torch {torch.__version__}, transformers {transformers.__version__}.",
        f"bf16 matmul rate measured in this run (MFU's denominator): {peak / 1e12:.2f} TFLOP/s "
        f"(best of {len(peaks)} probes: " + ", ".join(f"{p['flops'] / 1e12:.2f}" for p in peaks) + ").",
        "Shapes: " + "; ".join(
            f"{g} batch {s.batch} x {s.seq}" + (f" + {s.dec}" if g == "t5" else "")
            + f", {s.layers} layers, d {s.d_model}, {s.heads} heads, d_ff {s.d_ff}, vocab {s.vocab}"
            for g, s in args.shapes.items()) + ".",
        f"bf16 autocast (float32 weights and AdamW state), fused AdamW, dropout {args.dropout}; "
        f"{args.warmup} warm-up + {args.steps} timed steps per row, interleaved rounds. "
        f"Run took {time.time() - started:.0f} s.",
        f"Command: `{args.command}`",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 1+2 steps; on the CPU without CUDA")
    ap.add_argument("--models", default=",".join(GROUPS), help="comma-separated subset of the default")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per row (default 10; quick 2)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per row (default 3; quick 1)")
    ap.add_argument("--dropout", type=float, default=0.0, help="every dropout, every side (default 0)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: auto)")
    ap.add_argument("--compile-on-cpu", action="store_true", help="run the compiled rows on a CPU too")
    ap.add_argument("--packed-compiled", action="store_true",
                    help="add the compiled rows of the packed group (two more compiled graphs)")
    common.add_output_options(ap)
    args = ap.parse_args(argv)
    args.command = common.rerun_command("gpu_throughput.py", argv)
    args.groups = [g.strip() for g in args.models.split(",") if g.strip()]
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown or not args.groups:
        raise LmlabError(f"unknown model group {unknown[0]!r}" if unknown else "--models names no group",
                         f"choose from {','.join(GROUPS)}")
    common.require_counts(args, {"steps": 10, "warmup": 3})
    if not 0.0 <= args.dropout < 1.0:
        raise LmlabError(f"--dropout must be in [0, 1), got {args.dropout}", "pass e.g. --dropout 0")
    if args.dropout > 0 and "packed" in args.groups:
        raise LmlabError(f"--dropout {args.dropout} with the packed group: FlexAttention has no attention "
                         "dropout, so its rows would time the dense kernel under FlexAttention's name",
                         "pass --dropout 0, or leave packed out of --models")
    for opt, path in (("--markdown", None if args.no_write else args.markdown), ("--json", args.json)):
        if path is not None and (path.is_dir() or not path.parent.is_dir()):
            raise LmlabError(f"{opt} {path} is a directory or has no parent directory",
                             "name a file in an existing directory")
    args.steps = args.steps or (2 if args.quick else 10)
    args.warmup = args.warmup or (1 if args.quick else 3)
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu" and not args.quick:
        raise LmlabError("no CUDA device", "run with --quick for a CPU smoke run")
    args.compiled = args.device == "cuda" or args.compile_on_cpu
    args.shapes = {g: QUICK if args.quick else FULL[g] for g in args.groups}
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    started = time.time()
    if args.device == "cpu":
        from lmlab.runtime import choose_threads, set_threads

        set_threads(choose_threads(args.threads)[0])
    sizes = QUICK_SIZES if args.quick else PEAK_SIZES
    seconds = 0.05 if args.quick else 0.3

    def probe() -> dict:
        return matmul_peak(sizes, dtype=torch.bfloat16, seconds=seconds, device=args.device)

    peaks = [probe()]
    print(f"device {args.device}; bf16 matmul {peaks[0]['flops'] / 1e12:.2f} TFLOP/s", flush=True)
    results = []
    for group in args.groups:
        t0 = time.time()
        try:
            res = run_group(group, args.shapes[group], args)
        except Exception as err:  # a group that cannot be built costs its rows, not the run
            res = {"group": group, "error": error_text(err)[:300]}
        free_memory(args.device)
        rates = {k: round(v["tokens_per_s"]) for k, v in res.get("rows", {}).items() if "tokens_per_s" in v}
        print(f"{group}: {rates or res.get('error')} ({time.time() - t0:.0f} s)", flush=True)
        results.append(res)
        if len(results) < len(args.groups):  # a run cut short by a time limit keeps what it measured
            publish(results, peaks, args, started)
    peaks.append(probe())
    text = publish(results, peaks, args, started)
    print(text)
    if not args.no_write:
        print(f"wrote section {SECTION} of {args.markdown}")
    return results


def publish(results: list[dict], peaks: list[dict], args, started: float) -> str:
    """Judge the rows and write the report (and ``--json``); before the last group the header says
    which groups are still to come."""
    judge(results, max(p["flops"] for p in peaks), judged=args.device == "cuda" and not args.quick)
    header = header_lines(args, peaks, started)
    todo = args.groups[len(results):]
    if todo:
        header = f"**Partial**: {', '.join(todo)} not measured yet.\n{header}"
    text = report(results, header)
    if args.json:
        from lmlab.fileio import write_json

        write_json(args.json, {"device": args.device, "quick": args.quick, "peaks": peaks, "results": results,
                               "complete": not todo})
    if not args.no_write:
        common.update_section(SECTION, text, args.markdown)
    return text


if __name__ == "__main__":
    try:
        main()
    except LmlabError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
