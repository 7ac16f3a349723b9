"""`lmlab finetune`: adapt a pretrained checkpoint to a task (see lmlab.finetune)."""

from __future__ import annotations

import argparse
import json

from lmlab.adapt import METHODS as ADAPT_METHODS
from lmlab.cli.common import add_command, is_main_process
from lmlab.errors import LmlabError
from lmlab.finetune.config import SelectFraction
from lmlab.values import (
    Fraction,
    LearningRateOrAuto,
    batch_flag,
    count_flag,
    delimiter_flag,
    device_flag,
    flag,
    grad_clip_flag,
    loss_weight_flag,
    lr_flag,
    path_flag,
    probability_flag,
    seed_flag,
    size_flag,
    text_flag,
    threads_flag,
    weight_decay_flag,
)

DESCRIPTION = """\
Fine-tune a pretrained checkpoint (an lmlab checkpoint or a Hugging Face model directory) on a
task read directly from its usual files, and write the best model to --out.

Your own data: classification, pair-classification, regression, tagging, qa read TSV, CSV
(quoted fields may hold newlines), JSON Lines and Parquet files, with or without a header row,
columns chosen by name or 0-based index (--text-field, --label-field...); labels are any strings,
learned from --train, saved with the model and checked in every other file.
Presets: sst2, cola (one sentence), rte, mrpc (sentence pairs), stsb (regression) read GLUE TSV
files with their fixed label sets; squad (extractive QA, SQuAD v1.1 JSON); conll (NER, CoNLL-2003
files); text2text (source<TAB>target pairs, scored with ROUGE/BLEU); instruct (instruction tuning
of a decoder or encoder-decoder on JSON Lines {instruction, input, output} or {messages}, loss on
the responses only, see docs/instruct.md). The checkpoint's architecture picks the
formulation: an encoder gets a task head on [CLS] / tokens / spans, a decoder classifies
GPT-style ([START] a [DELIM] b [EXTRACT], auxiliary LM loss weighted by --lm-weight; or from the
last token with --decoder-style last), an encoder-decoder writes the answer as text.

Training: AdamW, linear warmup (--warmup-ratio) then linear decay, --epochs or --max-steps,
evaluation on --dev after each epoch; the best dev checkpoint is kept. With --select-on
train-slice the best checkpoint (and the --lr auto rate) is chosen on a slice held out of --train
instead, and --dev scores the chosen model once. --out receives the model (load_model-able, with
its task head and tokenizer), task.json, eval.json (the chosen model's dev metrics, also printed),
metrics.jsonl (training log) and finetune.json (run summary: which data chose, which scored).

Stopping and resuming: Ctrl-C or SIGTERM finishes the step in flight, saves the run's state
beside --out (.OUT.resume/, also saved after every evaluation or every --save-every steps) and
exits; the same command with --resume continues exactly where it stopped (same batches, same
dropout, same result as an uninterrupted run)."""

EXAMPLES = """\
  lmlab finetune --checkpoint ck/minilm --task classification --train news/train.csv \\
      --dev news/dev.csv --no-header --label-field 0 --text-field 2 --out ft/news
  lmlab finetune --checkpoint ck/minilm --task pair-classification --train nli/train.jsonl \\
      --dev nli/dev.jsonl --text-field premise --text-pair-field hypothesis --out ft/nli
  lmlab finetune --checkpoint ck/minilm --task sst2 --train glue/sst2/train.tsv \\
      --dev glue/sst2/dev.tsv --out ft/sst2 --epochs 2 --lr 5e-5
  lmlab finetune --checkpoint ck/bert --task squad --train squad/train.json --dev squad/dev.json \\
      --out ft/squad --max-length 384 --doc-stride 128
  lmlab finetune --checkpoint ck/gpt --task rte --train rte/train.tsv --dev rte/dev.tsv \\
      --out ft/rte-gpt --lm-weight 0.5
  lmlab finetune ... --out ft/sst2 --resume      # continue an interrupted run
  lmlab finetune --checkpoint ck/t5 --task sst2 --train sst2/train.tsv --dev sst2/dev.tsv --out ft/t5
  lmlab finetune --checkpoint ck/gpt --task instruct --train mix/train.jsonl --dev mix/dev.jsonl \\
      --out ft/gpt-instruct --template my_template.txt"""


#: --method: full fine-tuning, then the parameter-efficient methods of lmlab.adapt (lmlab.finetune.METHODS)
METHOD_NAMES = ("full", *ADAPT_METHODS)
TASK_NAMES = ("classification", "pair-classification", "regression", "tagging", "qa", "sst2", "cola", "rte",
              "mrpc", "stsb", "squad", "conll", "text2text", "instruct")
#: --ROLE-field flags: role -> help
FIELD_FLAGS = {
    "text": "the text column (classification, regression; the first text of a pair)",
    "text_pair": "the second text of a pair (pair-classification, regression)",
    "label": "the label (class name or number) column",
    "tokens": "tagging: the tokens column (a list, or space-separated text; CoNLL files: an index)",
    "tags": "tagging: the tags column (like --tokens-field)",
    "question": "qa: the question column",
    "context": "qa: the context column",
    "answer": "qa: the answer column (text, list of texts, or SQuAD answers)",
    "answer_start": "qa: the answer's character start (optional: else its first occurrence)",
}


def register(sub) -> None:
    p = add_command(sub, "finetune", "fine-tune a checkpoint on a task", DESCRIPTION, EXAMPLES)
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="pretrained checkpoint directory")
    p.add_argument("--task", type=text_flag, required=True, metavar="TASK",
                   help=f"task: {', '.join(TASK_NAMES)} (the first five read your own files)")
    p.add_argument("--train", type=path_flag, required=True, metavar="FILE", help="training data file")
    p.add_argument("--dev", type=path_flag, required=True, metavar="FILE",
                   help="dev data file (evaluated each epoch)")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR",
                   help="directory for the fine-tuned model")
    p.add_argument("--method", default="full", choices=METHOD_NAMES, metavar="METHOD",
                   help=f"full (every weight) or a parameter-efficient method: {', '.join(METHOD_NAMES[1:])} "
                        "(docs/peft.md)")
    p.add_argument("--method-option", type=text_flag, action="append", default=[], metavar="KEY=VALUE",
                   help="option of the method (may be repeated), e.g. rank=8")
    p.add_argument("--tokenizer", type=path_flag, metavar="PATH",
                   help="tokenizer to use instead of the checkpoint's own")
    g = p.add_argument_group("training")
    g.add_argument("--lr", type=flag(LearningRateOrAuto), default=5e-5,
                   help="peak learning rate, or 'auto': fine-tune once per rate of --lr-sweep and keep the "
                        "best on dev (costs one run per rate)")
    g.add_argument("--lr-sweep", type=lr_flag, nargs="+", default=argparse.SUPPRESS, metavar="LR",
                   help="the rates --lr auto tries (default: 1e-4 3e-4 1e-3)")
    g.add_argument("--batch-size", type=batch_flag, default=32, metavar="N",
                   help="training examples per step")
    g.add_argument("--eval-batch-size", type=batch_flag, default=64, metavar="N",
                   help="examples per batch when scoring --dev")
    g.add_argument("--epochs", type=count_flag, default=3, metavar="N", help="passes over --train")
    g.add_argument("--max-steps", type=count_flag, default=None, metavar="N",
                   help="stop after N optimizer steps")
    g.add_argument("--warmup-ratio", type=flag(Fraction), default=0.1, help="share of steps spent warming up")
    g.add_argument("--weight-decay", type=weight_decay_flag, default=0.01,
                   help="AdamW's decoupled weight decay")
    g.add_argument("--grad-clip", type=grad_clip_flag, default=1.0, help="max gradient norm (0 = off)")
    g.add_argument("--seed", type=seed_flag, default=0,
                   help="seed of the task head's initialisation, the shuffling and dropout")
    g.add_argument("--eval-every", type=count_flag, default=None, metavar="N",
                   help="also evaluate every N steps")
    g.add_argument("--select-metric", type=text_flag, default=None,
                   help="the metric that picks the best checkpoint (default: the task's main one)")
    g.add_argument("--select-on", choices=("dev", "train-slice"), default="dev",
                   help="the data that picks the best checkpoint and the --lr auto rate: the --dev file, or "
                        "a slice held out of --train (never trained on); with train-slice --dev only scores "
                        "the chosen model, so its score is not a maximum over the candidates")
    g.add_argument("--select-fraction", type=flag(SelectFraction), default=0.1, metavar="F",
                   help="--select-on train-slice: the share of --train held out, drawn by --seed")
    g.add_argument("--max-train-examples", type=count_flag, default=None, metavar="N",
                   help="use the first N only")
    g.add_argument("--max-eval-examples", type=count_flag, default=None, metavar="N",
                   help="use the first N only")
    g.add_argument("--device", type=device_flag, default="auto", help="auto, cpu, cuda, cuda:1...")
    g.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto: bf16 autocast on a CUDA GPU with bfloat16, fp32 elsewhere")
    g.add_argument("--threads", type=threads_flag, default=None, metavar="N", help="torch CPU threads")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--save-every", type=count_flag, default=None, metavar="N",
                   help="write the resume state every N steps (default: after each evaluation)")
    g.add_argument("--logger", action="append", default=[], choices=["tensorboard", "wandb"],
                   dest="loggers", help="also write the metrics there (OUT/tensorboard/, OUT/wandb/ offline "
                   "unless WANDB_MODE says otherwise; may be repeated)")
    t = p.add_argument_group("task")
    t.add_argument("--max-length", type=count_flag, default=None, metavar="N",
                   help="tokens per input (default 128; squad 384)")
    t.add_argument("--doc-stride", type=size_flag, default=None, metavar="N",
                   help="squad: tokens shared by consecutive context windows (default 128)")
    t.add_argument("--max-answer-length", type=count_flag, default=None, metavar="N",
                   help="squad: longest answer")
    t.add_argument("--lm-weight", type=loss_weight_flag, default=None,
                   help="decoder classification: weight of the auxiliary LM loss (default 0.5)")
    t.add_argument("--decoder-style", choices=("gpt", "last"), default=None,
                   help="decoder classification: [START] a [DELIM] b [EXTRACT] (gpt) or last token")
    t.add_argument("--max-target-length", type=count_flag, default=None, metavar="N",
                   help="text-to-text: tokens generated at most (default 32)")
    t.add_argument("--prefix", default=None, help="text2text: text put before every source")
    t.add_argument("--rouge-stemmer", action="store_true", default=None,
                   help="text2text: ROUGE with Porter stemming, as published summarisation scores "
                        "(pip install 'lmlab[metrics]')")
    t.add_argument("--template", type=path_flag, default=None, metavar="FILE",
                   help="instruct: prompt template file with {instruction} and {input} (default: "
                        "'### Instruction:' / '### Input:' / '### Response:' blocks); saved with the model")
    t.add_argument("--packing", action=argparse.BooleanOptionalAction, default=None,
                   help="instruct: pack several examples per row, attention kept inside each "
                        "(default: on for decoders; --no-packing pads one example per row)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run that was writing --out (stopped by Ctrl-C, SIGTERM or "
                        "a crash), exactly where its last resume state left it")
    add_data_arguments(p)
    p.set_defaults(func=run, out_kind=("finetune.json", "fine-tuned model"))


def add_data_arguments(p) -> None:
    """The flags that say how data files are read (shared by `lmlab finetune` and `lmlab evaluate`)."""
    d = p.add_argument_group("data files", "how --train/--dev/--data are read (lmlab.tasks.tables); e.g. "
                             "--format csv --no-header --text-field 2 --label-field 0")
    d.add_argument("--format", choices=("tsv", "csv", "jsonl", "parquet"), default=None,
                   help="file format (default: from the extension; .tsv is unquoted, .csv RFC 4180)")
    d.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                   help="TSV/CSV: the first row names the columns (default: decided; columns by index need "
                        "no header, names need one)")
    d.add_argument("--delimiter", type=delimiter_flag, default=None, metavar="CHAR",
                   help="CSV field separator (default ','; 'tab' reads quoted TSV, e.g. pandas' to_csv)")
    for role, text in FIELD_FLAGS.items():
        d.add_argument(f"--{role.replace('_', '-')}-field", type=text_flag, dest=f"field_{role}",
                       default=None,
                       metavar="NAME|INDEX", help=f"{text}; a header name or 0-based index")
    d.add_argument("--on-bad-line", choices=("error", "skip"), default="error",
                   help="a malformed row stops the run (error) or is reported and left out (skip)")
    d.add_argument("--max-bad-fraction", type=probability_flag, default=0.01, metavar="F",
                   help="with --on-bad-line skip: stop when more than this share of a file's rows is "
                        "malformed (default 0.01): a misread file must not shrink silently")


def data_settings(args) -> dict:
    """The reading settings of ``args`` (for finetune and evaluate); only what was given."""
    fields = {role: getattr(args, f"field_{role}") for role in FIELD_FLAGS
              if getattr(args, f"field_{role}") is not None}
    out = {"format": args.format, "header": args.header, "delimiter": args.delimiter,
           "fields": fields or None}
    return {k: v for k, v in out.items() if v is not None}


def parse_options(items: list[str]) -> dict:
    """``["rank=8", "targets=[\\"q\\"]"]`` -> ``{"rank": 8, "targets": ["q"]}`` (JSON, else string)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LmlabError(f"--method-option {item!r} is not KEY=VALUE",
                             "write e.g. --method-option rank=8")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def run(args) -> int:
    from lmlab.finetune import finetune

    hparams = {
        "lr": args.lr, "batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size,
        "epochs": args.epochs, "max_steps": args.max_steps, "warmup_ratio": args.warmup_ratio,
        "weight_decay": args.weight_decay, "grad_clip": args.grad_clip, "seed": args.seed,
        "eval_every": args.eval_every, "select_metric": args.select_metric, "select_on": args.select_on,
        "select_fraction": args.select_fraction,
        "max_train_examples": args.max_train_examples, "max_eval_examples": args.max_eval_examples,
        "device": args.device, "precision": args.precision, "threads": args.threads,
        "progress": not args.no_progress, "loggers": tuple(args.loggers), "save_every": args.save_every,
        "on_bad_line": args.on_bad_line, "max_bad_fraction": args.max_bad_fraction, **data_settings(args),
        "max_length": args.max_length, "doc_stride": args.doc_stride,
        "max_answer_length": args.max_answer_length, "lm_weight": args.lm_weight,
        "decoder_style": args.decoder_style, "max_target_length": args.max_target_length,
        "prefix": args.prefix, "rouge_stemmer": args.rouge_stemmer, "packing": args.packing,
    }
    if args.packing is not None and args.task != "instruct":
        raise LmlabError("--packing/--no-packing is for --task instruct", "drop the flag")
    if args.template is not None:
        if args.task != "instruct":
            raise LmlabError("--template is the prompt template of --task instruct", "drop --template")
        from lmlab.tasks.instruct import read_template

        hparams["template"] = read_template(args.template)
    if getattr(args, "lr_sweep", None):
        hparams["lr_sweep"] = tuple(args.lr_sweep)
    result = finetune(args.checkpoint, args.task, args.train, args.dev, args.out, method=args.method,
                      method_options=parse_options(args.method_option), tokenizer=args.tokenizer,
                      resume=args.resume, **hparams)
    if is_main_process():  # torchrun: rank 0 says it
        print(json.dumps(result.metrics, indent=2))
    return 0
