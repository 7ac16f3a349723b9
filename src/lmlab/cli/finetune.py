"""`lmlab finetune`: adapt a pretrained checkpoint to a task (see lmlab.finetune)."""

from __future__ import annotations

import argparse
import json

from lmlab.adapt import METHODS as ADAPT_METHODS
from lmlab.cli.common import add_command, is_main_process
from lmlab.config.finetune import FinetuneConfig
from lmlab.config.flags import (
    MACHINE_FLAGS,
    add_config_flags,
    add_section_flags,
    section_names,
    section_settings,
)
from lmlab.values import lr_flag, path_flag, text_flag

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
dropout, same result as an uninterrupted run).

Settings from a file: --config F.toml reads its [finetune] table (any setting below, by its field
name: lr, epochs, max_length...); flags given on the command line win over the file, and
--set finetune.KEY=VALUE wins over both (docs/finetuning.md)."""

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
      --out ft/gpt-instruct --template my_template.txt
  lmlab finetune --checkpoint ck/minilm --task sst2 --train sst2/train.tsv --dev sst2/dev.tsv \\
      --out ft/sst2 --config sst2.toml --set finetune.lr=3e-5"""


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
#: FinetuneConfig field -> its flag's help (and argparse settings); type, range, choices and default
#: come from the field itself (lmlab.config.flags)
TRAINING_FLAGS: dict[str, str | dict] = {
    "lr": {"help": "peak learning rate, or 'auto': fine-tune once per rate of --lr-sweep and keep the best "
                   "on dev (costs one run per rate)", "metavar": "LR"},
    "lr_sweep": {"help": "the rates --lr auto tries", "type": lr_flag, "nargs": "+", "metavar": "LR"},
    "batch_size": {"help": "training examples per step", "metavar": "N"},
    "eval_batch_size": {"help": "examples per batch when scoring --dev", "metavar": "N"},
    "epochs": {"help": "passes over --train", "metavar": "N"},
    "max_steps": {"help": "stop after N optimizer steps", "metavar": "N"},
    "warmup_ratio": {"help": "share of steps spent warming up", "metavar": "F"},
    "weight_decay": {"help": "AdamW's decoupled weight decay", "metavar": "W"},
    "grad_clip": {"help": "max gradient norm (0 = off)", "metavar": "NORM"},
    "seed": {"help": "seed of the task head's initialisation, the shuffling and dropout", "metavar": "N"},
    "eval_every": {"help": "also evaluate every N steps", "metavar": "N"},
    "select_metric": {"help": "the metric that picks the best checkpoint (default: the task's main one)",
                      "metavar": "NAME"},
    "select_on": "the data that picks the best checkpoint and the --lr auto rate: the --dev file, or a slice "
                 "held out of --train (never trained on); with train-slice --dev only scores the chosen "
                 "model, so its score is not a maximum over the candidates",
    "select_fraction": {"help": "--select-on train-slice: the share of --train held out, drawn by --seed",
                        "metavar": "F"},
    "max_train_examples": {"help": "use the first N only", "metavar": "N"},
    "max_eval_examples": {"help": "use the first N only", "metavar": "N"},
    **MACHINE_FLAGS,
    "save_every": {"help": "write the resume state every N steps (default: after each evaluation)",
                   "metavar": "N"},
    "loggers": {"flag": "--logger", "action": "append", "choices": ("tensorboard", "wandb"),
                "help": "also write the metrics there (OUT/tensorboard/, OUT/wandb/ offline unless "
                        "WANDB_MODE says otherwise; may be repeated)"},
}
TASK_FLAGS: dict[str, str | dict] = {
    "max_length": {"help": "tokens per input (default 128; squad 384)", "metavar": "N"},
    "doc_stride": {"help": "squad: tokens shared by consecutive context windows (default 128)",
                   "metavar": "N"},
    "max_answer_length": {"help": "squad: longest answer", "metavar": "N"},
    "lm_weight": {"help": "decoder classification: weight of the auxiliary LM loss (default 0.5)",
                  "metavar": "W"},
    "decoder_style": "decoder classification: [START] a [DELIM] b [EXTRACT] (gpt) or last token",
    "max_target_length": {"help": "text-to-text: tokens generated at most (default 32)", "metavar": "N"},
    "prefix": {"help": "text2text: text put before every source", "metavar": "TEXT"},
    "rouge_stemmer": {"action": "store_true", "help": "text2text: ROUGE with Porter stemming, as published "
                      "summarisation scores (pip install 'lmlab[metrics]')"},
    "packing": {"action": argparse.BooleanOptionalAction, "help": "instruct: pack several examples per "
                "row, attention kept inside each (default: on for decoders; --no-packing pads one example "
                "per row)"},
}
DATA_FLAGS: dict[str, str | dict] = {
    "format": "file format (default: from the extension; .tsv is unquoted, .csv RFC 4180)",
    "header": {"action": argparse.BooleanOptionalAction, "help": "TSV/CSV: the first row names the columns "
               "(default: decided; columns by index need no header, names need one)"},
    "delimiter": {"help": "CSV field separator (default ','; 'tab' reads quoted TSV, e.g. pandas' to_csv)",
                  "metavar": "CHAR"},
    "on_bad_line": "a malformed row stops the run (error) or is reported and left out (skip)",
    "max_bad_fraction": {"help": "with --on-bad-line skip: stop when more than this share of a file's rows "
                         "is malformed: a misread file must not shrink silently", "metavar": "F"},
}
#: FinetuneConfig fields without a flag of their own, and why
NO_FLAG = {
    "group_by_length": "a speed setting with no effect on the result; set it in --config or --set",
    "warmup_steps": "--warmup-ratio says the same in the usual way; set it in --config or --set",
    "betas": "AdamW's betas rarely change; set them in --config or --set",
    "log_every": "how often a metrics row is written; set it in --config or --set",
    "template": "--template names a file, whose text is the field's value",
    "fields": "one --ROLE-field flag per role (--text-field, --label-field...)",
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
                   help="the tokenizer, for a checkpoint saved without one (checked against the model: "
                        "see docs/generate.md)")
    add_config_flags(p, "finetune", "[finetune] lr = 3e-5")
    add_section_flags(p.add_argument_group("training"), FinetuneConfig, TRAINING_FLAGS)
    t = p.add_argument_group("task")
    add_section_flags(t, FinetuneConfig, TASK_FLAGS)
    t.add_argument("--template", type=path_flag, default=None, metavar="FILE", dest="template_file",
                   help="instruct: prompt template file with {instruction} and {input} (default: "
                        "'### Instruction:' / '### Input:' / '### Response:' blocks); saved with the model")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run that was writing --out (stopped by Ctrl-C, SIGTERM or "
                        "a crash), exactly where its last resume state left it")
    add_data_arguments(p, given_only=True)
    p.set_defaults(func=run, out_kind=("finetune.json", "fine-tuned model"))


def add_data_arguments(p, given_only: bool = False) -> None:
    """The flags that say how data files are read (shared by `lmlab finetune` and `lmlab evaluate`);
    ``given_only``: only the flags given reach the namespace (finetune layers them over --config)."""
    d = p.add_argument_group("data files", "how --train/--dev/--data are read (lmlab.tasks.tables); e.g. "
                             "--format csv --no-header --text-field 2 --label-field 0")
    add_section_flags(d, FinetuneConfig, DATA_FLAGS)
    if not given_only:
        d.set_defaults(format=None, header=None, delimiter=None, on_bad_line="error", max_bad_fraction=0.01)
    for role, text in FIELD_FLAGS.items():
        d.add_argument(f"--{role.replace('_', '-')}-field", type=text_flag, dest=f"field_{role}",
                       default=None, metavar="NAME|INDEX", help=f"{text}; a header name or 0-based index")


def data_settings(args) -> dict:
    """The reading settings of ``args`` (for finetune and evaluate); only what was given."""
    fields = {role: getattr(args, f"field_{role}") for role in FIELD_FLAGS
              if getattr(args, f"field_{role}") is not None}
    out = {k: getattr(args, k, None) for k in ("format", "header", "delimiter")}
    return {k: v for k, v in {**out, "fields": fields or None}.items() if v is not None}


def settings_of(args) -> dict:
    """The fine-tuning settings of ``args``: --config's [finetune] table, the flags given, --set; all
    checked here, before any model is read."""
    template = None
    if args.template_file is not None:
        from lmlab.tasks.instruct import read_template

        template = read_template(args.template_file)
    fields = data_settings(args).get("fields")
    return section_settings(FinetuneConfig, "finetune", args, {"fields": fields, "template": template})


#: FinetuneConfig fields whose flag is not --field-name (messages name the flag the user types)
SHOWN_FLAGS = {"template": "--template", "loggers": "--logger", "progress": "--no-progress",
               "fields": "--ROLE-field", "packing": "--packing/--no-packing"}


def setting_names(args, hparams: dict):
    """How this command names a fine-tuning setting in a message: its flag, or where --config/--set
    wrote it (lmlab.config.rules.SettingNames); the settings' rules are the section's own
    (lmlab.config.finetune.RULES), checked by lmlab.finetune.finetune before any model loads."""
    return section_names(FinetuneConfig, "finetune", args, hparams,
                         {"template": "--template"} if args.template_file is not None else {}, SHOWN_FLAGS)


def run(args) -> int:
    hparams = settings_of(args)
    from lmlab.finetune import finetune
    from lmlab.finetune.methods import method_options_from_text

    options = method_options_from_text(args.method, args.method_option)
    result = finetune(args.checkpoint, args.task, args.train, args.dev, args.out, method=args.method,
                      method_options=options, tokenizer=args.tokenizer,
                      resume=args.resume, _names=setting_names(args, hparams), **hparams)
    if is_main_process():  # torchrun: rank 0 says it
        print(json.dumps(result.metrics, indent=2))
    return 0
