"""Zero-shot gains of instruction tuning on a held-out task (FLAN's evaluation, Wei et al. 2022).

1. **Pretrain** a small GPT (``lmlab.train.pretrain``, CLM; 4 layers x 128, byte-level BPE 4k)
   on unlabelled English text from ``$LMLAB_DATA/pretrain``: english-mix (the UTF-8 files),
   WikiText-2 valid/test and the first 12 MB of the unlabelled IMDB reviews. No text of any
   evaluation task is in it.
2. **Build the mixtures** (``lmlab.tasks.instruct_mixture``): SST-2, CoLA, RTE and STS-B
   (binarised at score 3), four of five templates each; **MRPC** (paraphrase) is held out
   entirely: no MRPC example and no MRPC template is trained on. Two mixtures:

   * ``all``: SST-2 + CoLA + RTE + STS-B. STS-B is in FLAN's *paraphrase* cluster with MRPC, so
     this holds out a task, not a cluster;
   * ``no-paraphrase``: SST-2 + CoLA + RTE, the whole paraphrase cluster held out (FLAN's rule).

3. **Instruction-tune** the same base with ``lmlab.finetune.finetune(..., task="instruct")``
   (packing on, loss on responses only) on each mixture.
4. **Score** the base and the tuned models zero-shot by rank classification (``lmlab.icl``:
   the summed ``log p(option | prompt)`` of each option named in the instruction; the larger one
   is the answer) on 1,000 of MRPC's 1,500 evaluation pairs (the five templates in turn) and on the
   trained tasks' held-out templates. Reported: accuracy; ROC AUC of the margin
   ``log p(positive word) - log p(negative word)`` (mean over templates; threshold-free, so a
   shift towards one answer word does not count as a gain) with a paired bootstrap 95% interval
   of the change; the majority class; and the AUC of plain word overlap (Jaccard) of the pair.

Everything derived (text, tokenizer, shards, mixtures, models) lives in ``--work`` (a temporary
directory by default; a finished stage found there is reused); only the table goes to
``docs/results/instruct-zero-shot.md`` (and ``.json``).

    OMP_NUM_THREADS=2 python benchmarks/instruct_zero_shot.py --work /tmp/zs     # ~1 hour, 2 busy cores
    python benchmarks/instruct_zero_shot.py --quick --no-write                    # smoke run
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

RESULTS = common.REPO / "docs" / "results"
HELD_OUT = "mrpc"
MIXTURES = {"all": ("sst2", "cola", "rte", "stsb"), "no-paraphrase": ("sst2", "cola", "rte")}
CAPS = {"sst2": 400, "cola": 400, "rte": 1244, "stsb": 4248}  # training examples per task (RTE, STS-B: all)
POSITIVE = {"rte": "entailment"}                                 # the positive label (default "1")
TUNE_BATCH, TUNE_LENGTH = 8, 192                               # packed rows of tokens
IMDB_BYTES = 12_000_000
TOKENIZER_CHARS = 4_000_000


def corpus(work: Path, quick: bool) -> Path:
    """Unlabelled pretraining text, one file per source, under ``work/text``."""
    text = work / "text"
    if text.is_dir():
        return text
    tmp = work / "text.partial"
    tmp.mkdir(parents=True, exist_ok=True)
    pre = common.DATA / "pretrain"
    for f in sorted((pre / "english-mix").glob("*.txt")):
        try:
            body = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:          # two Gutenberg files are Latin-1: left out
            continue
        (tmp / f.name).write_text(body[:50_000] if quick else body, encoding="utf-8")
    for name in ("valid", "test"):
        body = (pre / "wikitext-2" / f"wiki.{name}.tokens").read_text(encoding="utf-8")
        (tmp / f"wiki_{name}.txt").write_text(body[:50_000] if quick else body, encoding="utf-8")
    with gzip.open(pre / "imdb-unsup" / "imdb_unsup.txt.gz", "rb") as fh:
        raw = fh.read(50_000 if quick else IMDB_BYTES)
    (tmp / "imdb_part.txt").write_text(raw.decode("utf-8", errors="ignore"), encoding="utf-8")
    tmp.rename(text)
    return text


def pretrain_base(work: Path, steps: int, quick: bool, log) -> tuple[Path, dict]:
    """A small GPT pretrained on unlabelled text; returns its checkpoint and the run's numbers."""
    from lmlab.data.prepare import prepare_shards
    from lmlab.tasks.instruct import DEFAULT_TEMPLATE
    from lmlab.tokenizers import train_tokenizer
    from lmlab.train import pretrain

    base = work / "base"
    done = base / "result.json"
    if done.is_file():
        info = json.loads(done.read_text(encoding="utf-8"))
        log(f"base model reused from {base}")
        return Path(info["checkpoint"]), info
    text = corpus(work, quick)
    if not (work / "tokenizer").is_dir():
        lines = [ln for p in sorted(text.iterdir()) for ln in p.read_text(encoding="utf-8").splitlines()
                 if ln.strip()]
        random.Random(0).shuffle(lines)
        sample, n = [], 0
        for ln in lines:
            sample.append(ln)
            n += len(ln)
            if n > TOKENIZER_CHARS:
                break
        tok = train_tokenizer("bytelevel", sample + [DEFAULT_TEMPLATE] * 50,
                              vocab_size=512 if quick else 4096)
        tok.save(work / "tokenizer")
    if not (work / "shards").is_dir():
        prepare_shards(work / "tokenizer", sorted(str(p) for p in text.iterdir()), work / "shards",
                       val_fraction=0.005, workers=2, doc_separator="blank-line", progress=False)
    width, layers = (64, 2) if quick else (128, 4)
    config = {
        "model": {"preset": "gpt2-tiny", "d_model": width, "n_layers": layers, "n_heads": max(1, width // 64),
                  "d_ff": 4 * width, "max_positions": 256, "dropout": 0.0, "attn_dropout": 0.0},
        "objective": {"name": "clm"},
        "data": {"train": [str(work / "shards")]},  # shards, cut into documents when prepared
        "train": {"max_steps": steps, "batch_size": 8, "seq_len": 128, "lr": 2e-3, "min_lr": 2e-4,
                  "warmup_steps": max(1, steps // 20), "decay_steps": steps, "schedule": "cosine",
                  "weight_decay": 0.1, "clip": 1.0, "eval_every": 100, "eval_batches": 4,
                  "checkpoint_every": steps, "keep_checkpoints": 1, "log_every": 25, "seed": 0,
                  "precision": "fp32", "device": "cpu", "progress": "off", "threads": 2},
    }
    t0 = time.perf_counter()
    summary = pretrain(config, base, log=lambda m: None)
    info = {"checkpoint": str(summary["checkpoint"]), "parameters": summary["parameters"],
            "tokens": summary["tokens"], "val_loss": summary["val_loss"], "steps": steps,
            "width": width, "layers": layers,
            "seconds": round(time.perf_counter() - t0)}
    done.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    log(f"pretrained {steps} steps in {info['seconds']} s, val loss {info['val_loss']:.3f}")
    return Path(info["checkpoint"]), info


def positive_word(record: dict) -> str:
    """The answer word of the record's positive class under its template."""
    from lmlab.tasks.instruct_mixture import SPECS

    spec = SPECS[record["task"]]
    words = spec.answer_words(record["template"])
    return words[POSITIVE.get(record["task"], "1")]


def option_scores(model, records: list[dict]) -> list[dict[str, float]]:
    """Rank classification: the summed ``log p(option | prompt)`` of every option of each record."""
    from lmlab.icl import continuation_logprobs
    from lmlab.tasks.instruct import DEFAULT_TEMPLATE, render_prompt

    model.eval()
    out = []
    with torch.no_grad():
        for r in records:
            prompt = render_prompt(DEFAULT_TEMPLATE, r["instruction"], r["input"])
            scores = continuation_logprobs(model, model.tokenizer, prompt, r["options"])
            out.append({o: s for o, (s, _) in zip(r["options"], scores)})
    return out


def margins(records: list[dict], scores: list[dict[str, float]]) -> list[float]:
    """``log p(positive word) - log p(the other word)`` per record (binary tasks)."""
    out = []
    for r, s in zip(records, scores):
        pos = positive_word(r)
        (neg,) = [o for o in r["options"] if o != pos]
        out.append(s[pos] - s[neg])
    return out


def overlap(record: dict) -> float:
    """Jaccard overlap of the word sets of a pair's two lines."""
    a, b = (set(line.lower().split()) for line in record["input"].split("\n", 1))
    return len(a & b) / max(1, len(a | b))


def template_auc(records: list[dict], values: list[float], pick=None) -> float:
    """Mean over templates of the ROC AUC of ``values`` (rows ``pick`` of each template, default all)."""
    from lmlab.tasks.metrics import roc_auc

    groups: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(r["template"], []).append(i)
    aucs = []
    for t, rows in sorted(groups.items()):
        rows = [rows[j] for j in pick[t]] if pick else rows
        aucs.append(roc_auc([values[i] for i in rows], [records[i]["label"] == positive_label(records[i])
                                                        for i in rows]))
    return sum(aucs) / len(aucs)


def positive_label(record: dict) -> str:
    return POSITIVE.get(record["task"], "1")


def paired_bootstrap(records: list[dict], before: list[float], after: list[float], reps: int,
                     seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of ``AUC(after) - AUC(before)`` over examples resampled (with
    replacement, within each template) the same way for both models."""
    rng = random.Random(seed)
    sizes = Counter(r["template"] for r in records)
    diffs = []
    for _ in range(reps):
        pick = {t: [rng.randrange(n) for _ in range(n)] for t, n in sizes.items()}
        try:
            diffs.append(template_auc(records, after, pick) - template_auc(records, before, pick))
        except Exception:               # a resample with one class only: skipped
            continue
    diffs.sort()
    return diffs[int(0.025 * len(diffs))], diffs[int(0.975 * len(diffs)) - 1]


def evaluate(records: list[dict], scores: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Accuracy (rank classification) and template-mean AUC of the margin, per task."""
    out = {}
    for task in sorted({r["task"] for r in records}):
        rows = [i for i, r in enumerate(records) if r["task"] == task]
        recs, sc = [records[i] for i in rows], [scores[i] for i in rows]
        right = sum(max(s, key=s.get) == r["output"] for r, s in zip(recs, sc))
        out[task] = {"accuracy": right / len(recs), "auc": template_auc(recs, margins(recs, sc)),
                     "margins": margins(recs, sc)}
    return out


def majority(train: list[dict], records: list[dict], task: str) -> float:
    """Accuracy of always answering the most frequent training class (the held-out task has no
    training data: its own evaluation set's most frequent class, an upper bound for a constant)."""
    pool = ([r["label"] for r in train if r["task"] == task]
            or [r["label"] for r in records if r["task"] == task])
    top = Counter(pool).most_common(1)[0][0]
    rows = [r for r in records if r["task"] == task]
    return sum(r["label"] == top for r in rows) / len(rows)


def first_per_task(records: list[dict], n: int) -> list[dict]:
    """The first ``n`` records of each task, in their order."""
    seen: Counter = Counter()
    out = []
    for r in records:
        seen[r["task"]] += 1
        if seen[r["task"]] <= n:
            out.append(r)
    return out


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def tag(name: str, seed: int) -> str:
    """The working-directory name of mixture ``name`` tuned with ``seed``."""
    return name if seed == 0 else f"{name}-seed{seed}"


def tune(work: Path, base_dir: Path, name: str, seed: int, args, log) -> dict:
    """Build mixture ``name`` and instruction-tune the base on it with ``seed`` (reused when found)."""
    from lmlab.finetune import finetune
    from lmlab.tasks.instruct_mixture import build_mixture

    mix, out = work / f"mixture-{name}", work / f"tuned-{tag(name, seed)}"
    done = out / "tuning.json"
    if done.is_file():
        log(f"{tag(name, seed)}: tuned model reused from {out}")
        return json.loads(done.read_text(encoding="utf-8"))
    caps = {t: (40 if args.quick else CAPS[t]) for t in MIXTURES[name]}
    if (mix / "mixture.json").is_file():        # the same mixture for every tuning seed
        manifest = json.loads((mix / "mixture.json").read_text(encoding="utf-8"))
    else:
        manifest = build_mixture(common.DATA, mix, HELD_OUT, tasks=MIXTURES[name], per_task=caps,
                                 eval_per_task=args.eval_per_task)
    small = first_per_task(read(mix / "dev.jsonl"), 40)     # the dev loss during tuning: 40 per task
    dev = work / f"dev-{tag(name, seed)}.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in small), encoding="utf-8")
    t0 = time.perf_counter()
    res = finetune(base_dir, "instruct", mix / "train.jsonl", dev, out, epochs=args.epochs,
                   batch_size=TUNE_BATCH, lr=args.lr, max_length=TUNE_LENGTH, max_target_length=4,
                   seed=seed, progress=False, log=lambda m: None)
    info = {"manifest": manifest, "steps": res.steps, "dev": res.metrics,
            "seconds": round(time.perf_counter() - t0)}
    done.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    log(f"{tag(name, seed)}: tuned {res.steps} steps in {info['seconds']} s")
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary one)")
    p.add_argument("--pretrain-steps", type=int, default=400)
    p.add_argument("--mixtures", nargs="+", default=list(MIXTURES), choices=list(MIXTURES))
    p.add_argument("--eval-per-task", type=int, default=1000,
                   help="evaluation examples per task (of MRPC's 1,500 dev pairs)")
    p.add_argument("--seen-eval", type=int, default=60,
                   help="of those, examples per trained task scored on its held-out template")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="instruction-tuning seeds")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the intervals")
    p.add_argument("--tune-only", action="store_true", help="pretrain and tune, skip the evaluation")
    p.add_argument("--quick", action="store_true", help="tiny budgets: checks the pipeline, not the claim")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    args = p.parse_args(argv)
    if args.quick:
        args.pretrain_steps, args.eval_per_task, args.seen_eval = 10, 24, 12
        args.epochs, args.bootstrap = 1, 20
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = run(work, args)
    if result is None:
        return 0
    table = render(result)
    print(table)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        out = json.dumps(result, indent=2) + "\n"
        (RESULTS / "instruct-zero-shot.json").write_text(out, encoding="utf-8")
        (RESULTS / "instruct-zero-shot.md").write_text(table, encoding="utf-8")
    return 0


def run(work: Path, args) -> dict | None:
    base_dir, pre = pretrain_base(work, args.pretrain_steps, args.quick, print)
    runs = []
    for name in args.mixtures:
        for seed in args.seeds:
            info = tune(work, base_dir, name, seed, args, print)
            if not args.tune_only:
                runs.append(evaluate_mixture(work, base_dir, name, seed, info, args, print))
    if args.tune_only:
        return None
    return {"base": pre, "held_out": HELD_OUT, "caps": CAPS,
            "tuning": {"epochs": args.epochs, "lr": args.lr, "seeds": args.seeds, "batch_size": TUNE_BATCH,
                       "max_length": TUNE_LENGTH},
            "bootstrap": args.bootstrap, "runs": runs}


def evaluate_mixture(work: Path, base_dir: Path, name: str, seed: int, info: dict, args, log) -> dict:
    """Zero-shot scores of the base and of the model tuned on mixture ``name`` with ``seed`` (reused
    when found)."""
    from lmlab.finetune import load_finetuned
    from lmlab.loading import load_model

    done = work / f"eval-{tag(name, seed)}.json"
    if done.is_file():
        log(f"{tag(name, seed)}: evaluation reused from {done}")
        return json.loads(done.read_text(encoding="utf-8"))
    t0 = time.perf_counter()
    mix = work / f"mixture-{name}"
    train = read(mix / "train.jsonl")
    base, (tuned, _) = load_model(base_dir), load_finetuned(work / f"tuned-{tag(name, seed)}")
    rows = []
    for split in ("heldout_task", "heldout_templates"):
        recs = read(mix / f"{split}.jsonl")
        if split == "heldout_templates":
            recs = first_per_task(recs, args.seen_eval)
        before, after = evaluate(recs, option_scores(base, recs)), evaluate(recs, option_scores(tuned, recs))
        for task in sorted(before):
            sub = [r for r in recs if r["task"] == task]
            lo, hi = paired_bootstrap(sub, before[task]["margins"], after[task]["margins"], args.bootstrap)
            rows.append({
                "split": split, "task": task, "n": len(sub), "majority": majority(train, recs, task),
                "accuracy_before": before[task]["accuracy"], "accuracy_after": after[task]["accuracy"],
                "auc_before": before[task]["auc"], "auc_after": after[task]["auc"],
                "auc_change_ci95": [lo, hi],
                "overlap_auc": template_auc(sub, [overlap(r) for r in sub]) if "\n" in sub[0]["input"]
                else None})
    out = {"mixture": name, "seed": seed, "trained": list(MIXTURES[name]),
           "counts": info["manifest"]["counts"],
           "tuning_steps": info["steps"], "tuning_seconds": info["seconds"], "rows": rows,
           "eval_seconds": round(time.perf_counter() - t0)}
    done.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    log(f"{tag(name, seed)}: evaluated in {out['eval_seconds']} s")
    return out


def render(r: dict) -> str:
    b, t = r["base"], r["tuning"]
    lines = [
        "# Instruction tuning: zero-shot rank classification before and after "
        "(benchmarks/instruct_zero_shot.py)",
        "",
        f"Base: GPT, {b['parameters']:,} parameters ({b['layers']} layers x {b['width']}, byte-level BPE), "
        f"pretrained {b['steps']} steps ({b['tokens']:,} tokens of english-mix, WikiText-2 valid/test and "
        f"unlabelled IMDB reviews), val loss {b['val_loss']:.3f}. Held out: **{r['held_out'].upper()}** (no "
        f"example, no template trained on). Instruction tuning: {t['epochs']} epochs, lr {t['lr']:g}, batch "
        f"{t['batch_size']}, packed rows of {t['max_length']} tokens, response-only loss, tuning seeds "
        f"{', '.join(map(str, t['seeds']))} (one pretraining seed); 4 of 5 templates per trained task. "
        "Scoring: rank classification (summed log-probability of each option named in the instruction). "
        "AUC: ROC AUC of log p(positive word) - log p(negative word), mean over templates; the interval is "
        f"a paired bootstrap 95% interval of the change ({r['bootstrap']} resamples of the evaluation "
        "examples: evaluation-sample noise only; the spread over tuning seeds is in the summary). "
        "Word-overlap AUC: the Jaccard overlap of the pair's words as the score, a trivial lexical baseline.",
        "",
        "Summary, held-out task (AUC change per tuning seed; accuracy after, per seed):",
        "",
    ]
    by_mix: dict[str, list] = {}
    for run in r["runs"]:
        row = next(x for x in run["rows"] if x["split"] == "heldout_task")
        by_mix.setdefault(run["mixture"], []).append((run["seed"], row))
    for mix, seeds in by_mix.items():
        changes = [x["auc_after"] - x["auc_before"] for _, x in seeds]
        first = seeds[0][1]
        lines.append(f"* {mix} ({first['task']}): AUC {first['auc_before']:.3f} before; change "
                     + ", ".join(f"{c:+.3f}" for c in changes)
                     + f" (mean {sum(changes) / len(changes):+.3f}); "
                     "accuracy " + ", ".join(f"{x['accuracy_after']:.3f}" for _, x in seeds)
                     + f" (before {first['accuracy_before']:.3f}, majority class {first['majority']:.3f})")
    lines += [
        "",
        "| mixture (trained tasks; seed; steps) | evaluation | task | examples | majority class | accuracy "
        "before | accuracy after | AUC before | AUC after | AUC change (95% CI) | word-overlap AUC |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    names = {"heldout_task": "**held-out task**", "heldout_templates": "trained task, held-out template"}
    for run in r["runs"]:
        trained = "+".join(run["trained"])
        mixture = f"{run['mixture']} ({trained}; seed {run['seed']}; {run['tuning_steps']} steps)"
        for row in run["rows"]:
            lo, hi = row["auc_change_ci95"]
            ov = "" if row["overlap_auc"] is None else f"{row['overlap_auc']:.3f}"
            lines.append(f"| {mixture} | {names[row['split']]} | {row['task']} | {row['n']} | "
                         f"{row['majority']:.3f} | {row['accuracy_before']:.3f} | "
                         f"{row['accuracy_after']:.3f} | "
                         f"{row['auc_before']:.3f} | {row['auc_after']:.3f} | "
                         f"{row['auc_after'] - row['auc_before']:+.3f} ({lo:+.3f} .. {hi:+.3f}) | {ov} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
