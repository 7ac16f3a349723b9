"""`lmlab evaluate`: score a fine-tuned checkpoint on a data file (see lmlab.finetune.evaluate), or
any language model on lm-evaluation-harness tasks (--harness; see lmlab.icl.harness)."""

from __future__ import annotations

import json

from lmlab.cli.common import add_command
from lmlab.cli.finetune import add_data_arguments, data_settings
from lmlab.values import batch_flag, count_flag, device_flag, path_flag, seed_flag, size_flag, text_flag

DESCRIPTION = """\
Score a checkpoint written by `lmlab finetune` on a data file of its task and print the
metrics as JSON, in the same form as the eval.json that fine-tuning wrote (e.g.
{"accuracy": 0.81, "matthews_corr": 0.52}). The task, its label set and its input settings
(max length, SQuAD stride...) come from the checkpoint's task.json; --task, when given, must
match it. The file is read as the training files were (format, header, columns: task.json);
the data flags below override that for a file laid out differently. Labels in the data that
the model never saw in training are an error (file, line, label). --predictions writes every
prediction, as a label name for classification. Beside the metrics stands the task's trivial
baseline on the same examples (their majority class, no model; none for tags or spans), under
"baseline" in the JSON, and a score at (or below) it is flagged with a warning.

--harness TASKS scores a language model (a decoder or LSTM LM checkpoint, or a pretraining run's
newest checkpoint) with EleutherAI's lm-evaluation-harness instead: TASKS is a comma-separated
list of harness task names (hellaswag, lambada_openai...) and local task YAML files or folders of
them. The results are written as JSON beside the checkpoint (CHECKPOINT.harness.json, or --out),
never over an existing file unless --overwrite, and then only over a results file lmlab wrote;
never over or into an input (the checkpoint, a task file). A multiple-choice task's accuracy
stands beside its chance level (the mean of 1/choices over its documents; "baseline" in the JSON),
and one at chance is flagged; other kinds of task get no baseline. A local task file that brings Python code
(`!function`, e.g. a utils.py beside the YAML) is refused, naming that file, unless --allow-code:
only pass it for task files you trust. Needs pip install 'lmlab[eval]'.

--variant NAME=DIR (repeatable) scores several LoRA, prefix- or prompt-tuned variants of one task
in one pass: --checkpoint is then the base they were fine-tuned from, each DIR an `lmlab finetune
--method lora|prefix|prompt` output, and every batch runs all variants' rows together (each with
its own weights and task head). Prints {NAME: metrics}; --predictions rows also name the
variant. See docs/peft.md ("Many variants in one batch")."""

EXAMPLES = """\
  lmlab evaluate --checkpoint ft/sst2 --task sst2 --data glue/sst2/dev.tsv
  lmlab evaluate --checkpoint ft/squad --task squad --data squad/dev.json --max-examples 500
  lmlab evaluate --checkpoint ft/news --data news/test.csv --predictions news/test.predictions.jsonl
  lmlab evaluate --checkpoint runs/gpt --harness lambada_openai,hellaswag --max-examples 200
  lmlab evaluate --checkpoint runs/gpt --harness my_tasks/quiz.yaml --num-fewshot 5 --out quiz.json
  lmlab evaluate --checkpoint bert/ --variant lora=ft/lora --variant pt=ft/prompt --data sst2/dev.tsv"""


def register(sub) -> None:
    p = add_command(sub, "evaluate", "score a fine-tuned checkpoint on a data file, or a language model "
                    "on lm-evaluation-harness tasks", DESCRIPTION, EXAMPLES)
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="directory written by lmlab finetune (--harness: a language model checkpoint)")
    p.add_argument("--task", type=text_flag, default=None, metavar="TASK",
                   help="the checkpoint's task (checked)")
    p.add_argument("--data", type=path_flag, metavar="FILE", help="data file in the task's format")
    p.add_argument("--batch-size", type=batch_flag, default=None, metavar="N",
                   help="default 64 (--harness: 16)")
    p.add_argument("--max-examples", type=count_flag, default=None, metavar="N",
                   help="score the first N only (--harness: per task)")
    h = p.add_argument_group("lm-evaluation-harness")
    h.add_argument("--harness", type=text_flag, metavar="TASKS",
                   help="comma-separated harness task names and task YAML files or folders")
    h.add_argument("--num-fewshot", type=size_flag, default=None, metavar="K",
                   help="default: each task's own")
    h.add_argument("--out", type=path_flag, metavar="FILE",
                   help="results JSON (default CHECKPOINT.harness.json)")
    h.add_argument("--overwrite", action="store_true",
                   help="replace an existing results file (only one lmlab wrote, unchanged since)")
    h.add_argument("--log-samples", action="store_true", help="also write every example's prompt and scores")
    h.add_argument("--seed", type=seed_flag, default=None,
                   help="few-shot sampling and generation seed (default 0)")
    h.add_argument("--allow-code", action="store_true",
                   help="let local task files run their Python code (`!function`: a utils.py beside the "
                        "YAML...); refused without it, naming the file. Only for task files you trust")
    p.add_argument("--variant", type=text_flag, action="append", default=[], metavar="NAME=DIR",
                   help="score this fine-tuned variant of the --checkpoint base (repeat: all in one pass)")
    p.add_argument("--device", type=device_flag, default="auto", help="auto, cpu, cuda, cuda:1, mps")
    p.add_argument("--predictions", type=path_flag, metavar="FILE", default=None,
                   help='also write one JSON line per example: {"where", "prediction", "label"} '
                        "(label names)")
    add_data_arguments(p)
    p.set_defaults(func=run, out_is_file=True)  # --out: the harness's results file, not a folder


def run(args) -> int:
    from lmlab.errors import LmlabError
    from lmlab.finetune import evaluate

    if args.harness is not None:  # options of one mode given in the other: lmlab.cli.flag_rules
        return _run_harness(args)
    if args.data is None:
        raise LmlabError("lmlab evaluate needs --data FILE (a fine-tuned checkpoint) or --harness TASKS",
                         "pass one of them")
    if args.variant:
        return _run_variants(args)
    metrics = evaluate(args.checkpoint, args.data, args.task, on_bad_line=args.on_bad_line,
                       max_bad_fraction=args.max_bad_fraction, batch_size=args.batch_size or 64,
                       max_examples=args.max_examples, device=args.device, predictions=args.predictions,
                       with_baseline=True, **data_settings(args))
    print(json.dumps(metrics, indent=2))
    return 0


def _run_harness(args) -> int:
    import sys

    from lmlab.icl.harness import run_harness

    record = run_harness(args.checkpoint, args.harness, out=args.out, overwrite=args.overwrite,
                         num_fewshot=args.num_fewshot, limit=args.max_examples,
                         batch_size=args.batch_size or 16, device=args.device, seed=args.seed or 0,
                         log_samples=args.log_samples, allow_code=args.allow_code,
                         log=lambda m: print(m, file=sys.stderr, flush=True))
    printed = dict(record["results"])
    if record.get("baseline"):  # the multiple-choice tasks' chance levels, beside the tasks' results
        printed["baseline"] = record["baseline"]
    print(json.dumps(printed, indent=2))
    return 0


def _run_variants(args) -> int:
    import sys
    import time

    from lmlab.adapt.multi import parse_variants
    from lmlab.finetune.variants import evaluate_variants
    from lmlab.tasks.baseline import at_baseline_text, baseline_text
    from lmlab.train.estimate import duration

    variants = parse_variants(args.variant)  # bad names or folders: before any model is loaded
    start = time.perf_counter()  # (nothing said before: a refused input is one line)
    metrics, baseline = evaluate_variants(
        args.checkpoint, variants, args.data, args.task, on_bad_line=args.on_bad_line,
        max_bad_fraction=args.max_bad_fraction, batch_size=args.batch_size or 64,
        max_examples=args.max_examples, device=args.device, predictions=args.predictions, with_baseline=True,
        **data_settings(args))
    scores = "; ".join(f"{name} " + ", ".join(f"{k} {v:.4f}" for k, v in m.items())
                       for name, m in metrics.items())
    # the trivial baseline beside the scores, as for one checkpoint; the JSON stays {NAME: metrics}
    # (a "baseline" key there could be a variant's name)
    trivial = None if baseline is None else (baseline["answer"], baseline["metrics"])
    print(f"evaluated {len(metrics)} variant(s) in {duration(time.perf_counter() - start)}: {scores}"
          + ("" if trivial is None else f"; {baseline_text(trivial)}"), file=sys.stderr, flush=True)
    for name, m in metrics.items():
        flagged = trivial and at_baseline_text(m, trivial, baseline["metric"])
        if flagged:
            print(f"warning: variant {name}: {flagged}: it does no better on these examples than that answer "
                  "without a model", file=sys.stderr, flush=True)
    print(json.dumps(metrics, indent=2))
    return 0
