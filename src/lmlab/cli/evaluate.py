"""`lmlab evaluate`: score a fine-tuned checkpoint on a data file (see lmlab.finetune.evaluate)."""

from __future__ import annotations

import json

from lmlab.cli.common import add_command
from lmlab.cli.finetune import add_data_arguments, data_settings

DESCRIPTION = """\
Score a checkpoint written by `lmlab finetune` on a data file of its task and print the
metrics as JSON, in the same form as the eval.json that fine-tuning wrote (e.g.
{"accuracy": 0.81, "matthews_corr": 0.52}). The task, its label set and its input settings
(max length, SQuAD stride...) come from the checkpoint's task.json; --task, when given, must
match it. The file is read as the training files were (format, header, columns: task.json);
the data flags below override that for a file laid out differently. Labels in the data that
the model never saw in training are an error (file, line, label). --predictions writes every
prediction, as a label name for classification."""

EXAMPLES = """\
  lmlab evaluate --checkpoint ft/sst2 --task sst2 --data glue/sst2/dev.tsv
  lmlab evaluate --checkpoint ft/squad --task squad --data squad/dev.json --max-examples 500
  lmlab evaluate --checkpoint ft/news --data news/test.csv --predictions news/test.predictions.jsonl"""


def register(sub) -> None:
    p = add_command(sub, "evaluate", "score a fine-tuned checkpoint on a data file", DESCRIPTION, EXAMPLES)
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="directory written by lmlab finetune")
    p.add_argument("--task", default=None, metavar="TASK", help="the checkpoint's task (checked)")
    p.add_argument("--data", required=True, metavar="FILE", help="data file in the task's format")
    p.add_argument("--batch-size", type=int, default=64, metavar="N")
    p.add_argument("--max-examples", type=int, default=None, metavar="N", help="score the first N only")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda...")
    p.add_argument("--predictions", metavar="FILE", default=None,
                   help='also write one JSON line per example: {"where", "prediction", "label"} '
                        "(label names)")
    add_data_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from lmlab.errors import LmlabError
    from lmlab.finetune import evaluate

    for name in ("batch_size", "max_examples"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise LmlabError(f"--{name.replace('_', '-')} must be positive, got {v}", "pass e.g. 64")
    metrics = evaluate(args.checkpoint, args.data, args.task, on_bad_line=args.on_bad_line,
                       max_bad_fraction=args.max_bad_fraction, batch_size=args.batch_size,
                       max_examples=args.max_examples, device=args.device, predictions=args.predictions,
                       **data_settings(args))
    print(json.dumps(metrics, indent=2))
    return 0
