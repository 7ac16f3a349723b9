"""Zero-shot gains of instruction tuning on a held-out task (FLAN's evaluation, Wei et al. 2022).

1. **Pretrain** a tiny GPT (``lmlab.train.pretrain``, CLM) on unlabelled English text from
   ``$LMLAB_DATA``: the SST-2 training sentences **without their labels** (in-domain text for the
   held-out task, as a web-scale LM would have seen reviews) and WikiText-2 valid/test.
2. **Build the mixture** (``lmlab.tasks.instruct_mixture``): CoLA, RTE and STS-B (binarised at
   score 3) phrased by five templates each, four trained and one held out; SST-2 is held out
   entirely.
3. **Instruction-tune** it with ``lmlab.finetune.finetune(..., task="instruct")`` (packing on,
   loss on responses only; the shared training engine).
4. **Score** the base and the tuned model zero-shot by label likelihood (``lmlab.icl``:
   ``log p(option | prompt)`` for every option named in the instruction, the larger one wins)
   on the held-out task (every template) and on the seen tasks' held-out templates, next to the
   majority class of each evaluation set.

The mixture and the models live in a temporary directory (derived data is never committed);
the table goes to ``docs/results/instruct-zero-shot.md`` (and ``.json``).

    OMP_NUM_THREADS=1 python benchmarks/instruct_zero_shot.py            # ~5 minutes, one core
    python benchmarks/instruct_zero_shot.py --quick --no-write           # smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

RESULTS = common.REPO / "docs" / "results"


def pretrain_base(work: Path, steps: int, quick: bool, log) -> Path:
    """A tiny GPT pretrained on unlabelled text; returns its checkpoint directory."""
    from lmlab.data.prepare import prepare_shards
    from lmlab.tasks import make_task
    from lmlab.tasks.instruct import DEFAULT_TEMPLATE
    from lmlab.tasks.instruct_mixture import SPECS
    from lmlab.tokenizers import train_tokenizer
    from lmlab.train import pretrain

    sentences = [e.text for e in make_task("sst2").read(common.DATA / "glue" / "sst2" / "train.tsv")]
    wiki = [(common.DATA / "pretrain" / "wikitext-2" / f).read_text(encoding="utf-8")
            for f in ("wiki.valid.tokens", "wiki.test.tokens")]
    if quick:
        sentences, wiki = sentences[:2000], [w[:100_000] for w in wiki]
    text = work / "text"
    text.mkdir()
    (text / "sst2_sentences.txt").write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    for i, w in enumerate(wiki):
        (text / f"wiki{i}.txt").write_text(w, encoding="utf-8")
    prompts = [DEFAULT_TEMPLATE] + [t for s in SPECS.values() for t in s.templates]
    lines = sentences + [line for w in wiki for line in w.split("\n")] + prompts * 20
    tok = train_tokenizer("bytelevel", lines, vocab_size=512 if quick else 2048)
    tok.save(work / "tokenizer")
    prepare_shards(work / "tokenizer", sorted(str(p) for p in text.iterdir()), work / "shards",
                   val_fraction=0.01, workers=1, doc_separator="blank-line", progress=False)
    config = {
        "model": {"preset": "gpt2-tiny", "d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512,
                  "max_positions": 256, "dropout": 0.0, "attn_dropout": 0.0},
        "objective": {"name": "clm"},
        "data": {"train": [str(work / "shards")], "doc_separator": "blank-line"},
        "train": {"max_steps": steps, "batch_size": 8, "seq_len": 128, "lr": 2e-3, "min_lr": 2e-4,
                  "warmup_steps": max(1, steps // 20), "decay_steps": steps, "schedule": "cosine",
                  "eval_every": steps, "checkpoint_every": steps, "keep_checkpoints": 1, "log_every": 50,
                  "seed": 0, "precision": "fp32", "device": "cpu", "progress": "off"},
    }
    t0 = time.perf_counter()
    summary = pretrain(config, work / "pretrain", log=lambda m: None)
    log(f"pretrained {steps} steps in {time.perf_counter() - t0:.0f} s, val loss {summary['val_loss']:.3f}")
    return Path(summary["checkpoint"]), summary


def zero_shot(model, records: list[dict]) -> dict[str, float]:
    """Label-likelihood accuracy per task over ``records`` (each names its ``options``)."""
    from lmlab.icl import continuation_logprobs
    from lmlab.tasks.instruct import DEFAULT_TEMPLATE, render_prompt

    tok = model.tokenizer
    right: Counter = Counter()
    total: Counter = Counter()
    model.eval()
    for r in records:
        prompt = render_prompt(DEFAULT_TEMPLATE, r["instruction"], r["input"])
        scores = continuation_logprobs(model, tok, prompt, r["options"])
        guess = r["options"][max(range(len(scores)), key=lambda i: scores[i][0])]
        right[r["task"]] += guess == r["output"]
        total[r["task"]] += 1
    return {t: right[t] / total[t] for t in total}


def option_rate(model, path: Path) -> dict[str, float]:
    """Share of greedy responses (3 tokens at most) whose first word is one of the options named in
    the instruction, per task: does the model answer the question at all?"""
    from lmlab.tasks import make_task

    task = make_task("instruct", "decoder", max_length=128, max_target_length=3)
    examples = task.read(path)
    with torch.no_grad():
        answers = task.generate_responses(model.eval(), examples, 64)
    hits: Counter = Counter()
    total: Counter = Counter()
    for e, a in zip(examples, answers):
        words = a.lower().replace(".", " ").split()
        hits[e.extra["task"]] += bool(words) and words[0] in e.extra["options"]
        total[e.extra["task"]] += 1
    return {t: hits[t] / total[t] for t in total}


def majority(train: list[dict], records: list[dict]) -> dict[str, float]:
    """Accuracy of always answering the most frequent training class of each task (the held-out
    task has no training data: its own evaluation set's most frequent class)."""
    out = {}
    for task in sorted({r["task"] for r in records}):
        pool = [r["label"] for r in train if r["task"] == task] or \
               [r["label"] for r in records if r["task"] == task]
        top = Counter(pool).most_common(1)[0][0]
        rows = [r for r in records if r["task"] == task]
        out[task] = sum(r["label"] == top for r in rows) / len(rows)
    return out


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pretrain-steps", type=int, default=1200)
    p.add_argument("--held-out", nargs="+", default=["sst2", "stsb"],
                   help="held-out task of each mixture (one tuning run per task, same base model)")
    p.add_argument("--per-task", type=int, default=600, help="mixture: training examples per task")
    p.add_argument("--eval-per-task", type=int, default=200)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--quick", action="store_true", help="tiny budgets: checks the pipeline, not the claim")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    args = p.parse_args(argv)
    if args.quick:
        args.pretrain_steps, args.per_task, args.eval_per_task, args.epochs = 20, 40, 12, 1
    torch.manual_seed(0)
    from lmlab.finetune import finetune, load_finetuned
    from lmlab.loading import load_model
    from lmlab.tasks.instruct_mixture import build_mixture

    t0 = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base_dir, pre = pretrain_base(work, args.pretrain_steps, args.quick, print)
        base = load_model(base_dir)
        for held in args.held_out:
            mix = work / f"mixture-{held}"
            manifest = build_mixture(common.DATA, mix, held, per_task=args.per_task,
                                     eval_per_task=args.eval_per_task)
            train = read(mix / "train.jsonl")
            res = finetune(base_dir, "instruct", mix / "train.jsonl", mix / "dev.jsonl",
                           work / f"tuned-{held}", epochs=args.epochs, batch_size=16, lr=args.lr,
                           max_length=128, max_target_length=4, progress=False, log=lambda m: None)
            tuned, _ = load_finetuned(work / f"tuned-{held}")
            rows = {}
            for name in ("heldout_task", "heldout_templates"):
                recs = read(mix / f"{name}.jsonl")
                rows[name] = {"n": Counter(r["task"] for r in recs), "majority": majority(train, recs),
                              "before": zero_shot(base, recs), "after": zero_shot(tuned, recs),
                              "options_before": option_rate(base, mix / f"{name}.jsonl"),
                              "options_after": option_rate(tuned, mix / f"{name}.jsonl")}
            runs.append({"held_out": held, "trained": manifest["trained_tasks"],
                         "mixture": manifest["counts"],
                         "tuning": {"steps": res.steps, "dev": res.metrics}, "zero_shot": rows})
            print(f"held out {held}: done ({time.perf_counter() - t0:.0f} s)")
    result = {
        "base": {"parameters": pre["parameters"], "pretrain_steps": args.pretrain_steps,
                 "pretrain_tokens": pre["tokens"], "val_loss": pre["val_loss"]},
        "tuning": {"epochs": args.epochs, "lr": args.lr, "per_task": args.per_task},
        "runs": runs, "seconds": round(time.perf_counter() - t0),
    }
    table = render(result)
    print(table)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        out = json.dumps(result, indent=2) + "\n"
        (RESULTS / "instruct-zero-shot.json").write_text(out, encoding="utf-8")
        (RESULTS / "instruct-zero-shot.md").write_text(table, encoding="utf-8")
    return 0


def render(r: dict) -> str:
    b, t = r["base"], r["tuning"]
    lines = [
        "# Instruction tuning: zero-shot accuracy before and after (benchmarks/instruct_zero_shot.py)",
        "",
        f"Base: tiny GPT, {b['parameters']:,} parameters, pretrained {b['pretrain_steps']} steps "
        f"({b['pretrain_tokens']:,} tokens; unlabelled SST-2 train sentences + WikiText-2 valid/test), "
        f"val loss {b['val_loss']:.3f}. Each mixture: the other GLUE tasks, {t['per_task']} examples each, "
        f"4 of 5 templates; instruction tuning {t['epochs']} epochs at lr {t['lr']:g}, packed, "
        f"response-only loss. Accuracy = label likelihood over the options named in the instruction; "
        f"answers with an option = share of greedy responses whose first word is one of them. "
        f"Run time {r['seconds']} s (CPU).",
        "",
        "| mixture (held-out task) | evaluation | task | examples | majority class | accuracy before tuning "
        "| accuracy after tuning | answers with an option, before | after |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    names = {"heldout_task": "**held-out task**", "heldout_templates": "seen task, held-out template"}
    for run in r["runs"]:
        mixture = f"{'+'.join(run['trained'])} ({run['held_out']} held out; {run['tuning']['steps']} steps)"
        for key, row in run["zero_shot"].items():
            for task in sorted(row["before"]):
                lines.append(f"| {mixture} | {names[key]} | {task} | {row['n'][task]} | "
                             f"{row['majority'][task]:.3f} | {row['before'][task]:.3f} | "
                             f"{row['after'][task]:.3f} | {row['options_before'][task]:.3f} | "
                             f"{row['options_after'][task]:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
