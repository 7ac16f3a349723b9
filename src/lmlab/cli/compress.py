"""`lmlab compress {distill,quantize,prune}`: smaller models from a (fine-tuned) checkpoint.

Each command writes a checkpoint directory that ``load_model`` reads and, when the input was
fine-tuned for a task (it has ``task.json``), that ``lmlab evaluate`` scores; plus
``compress.json``: size on disk, parameters (all and nonzero), CPU inference speed and the task
score before and after. :func:`measure` makes those figures (the benchmark uses it too).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from lmlab.cli.common import add_group
from lmlab.errors import LmlabError
from lmlab.values import (
    Fraction,
    Layers,
    Probability,
    Text,
    batch_flag,
    comma_ints,
    count_flag,
    flag,
    lr_flag,
    path_flag,
    seed_flag,
    size_flag,
    temperature_flag,
    threads_flag,
)

REPORT_FILE = "compress.json"

DESCRIPTION = """\
Make a model smaller and faster, and report what it cost: size on disk, parameters (all and
nonzero), CPU inference speed (examples/s, tokens/s on --dev) and the task score before and after,
beside the task's trivial baseline on the dev examples (their majority class, no model), flagged
when a score is at (or below) it.

  distill   train a student with fewer layers on the teacher's soft targets + the hard labels
  quantize  int8 weights (per-channel scales) for every linear layer; int8 matmuls on the CPU
  prune     zero the smallest weights (or rows / attention heads) to a target sparsity, and
            optionally fine-tune further with the pruned weights held at zero

The input is a checkpoint from `lmlab finetune` (task.json present: the output can be scored with
`lmlab evaluate`) or, for quantize and prune, any lmlab/Hugging Face model directory."""


def register(sub) -> None:
    _, cmds = add_group(sub, "compress", "distil, quantize or prune a model", DESCRIPTION)
    from lmlab.cli import HelpFormatter

    def command(name, help_, description, examples):
        return cmds.add_parser(name, help=help_, description=f"{description}\n\nexamples:\n{examples}",
                               formatter_class=HelpFormatter)

    p = command("distill", "train a smaller student from a fine-tuned teacher",
                "Knowledge distillation (Hinton et al. 2015): the student (the teacher's architecture with\n"
                "fewer layers, initialised from every k-th teacher layer as DistilBERT, or fresh) minimises\n"
                "alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * cross-entropy(labels).",
                "  lmlab compress distill --teacher ft/minilm-sst2 --train glue/sst2/train.tsv \\\n"
                "      --dev glue/sst2/dev.tsv --layers 3 --steps 2000 --out small/sst2-3l")
    p.add_argument("--teacher", type=path_flag, required=True, metavar="DIR",
                   help="checkpoint written by lmlab finetune")
    p.add_argument("--train", type=path_flag, required=True, metavar="FILE",
                   help="training data of the teacher's task")
    p.add_argument("--dev", type=path_flag, metavar="FILE", help="dev data: score and speed before/after")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR", help="directory for the student")
    p.add_argument("--layers", type=count_flag, default=None, metavar="N",
                   help="student layers (default: half)")
    p.add_argument("--student-layers", type=flag(Layers, comma_ints), default=None, metavar="I,J,..",
                   help="teacher layers to copy into the student, e.g. 0,2,4 (overrides --layers)")
    p.add_argument("--init", choices=("teacher", "fresh"), default="teacher", help="student initialisation")
    p.add_argument("--temperature", type=temperature_flag, default=2.0,
                   help="softmax temperature T of the soft targets")
    p.add_argument("--alpha", type=flag(Probability), default=0.5,
                   help="weight of the soft loss (1 - alpha: hard loss)")
    p.add_argument("--steps", type=count_flag, default=1000, metavar="N",
                   help="training steps of the student")
    _training(p)
    _common(p)
    p.set_defaults(func=run_distill, out_kind=("model.safetensors", "model"))

    p = command("quantize", "int8 weights for the linear layers",
                "Symmetric per-output-channel int8 weights (int8 + one float32 scale per row) for every\n"
                "linear layer not tied to the embeddings; activations quantized per token at run time\n"
                "(--activations dynamic: int8 x int8 matmuls) or kept float (none: weight-only).\n"
                "The checkpoint stores the int8 tensors and scales in model.safetensors.",
                "  lmlab compress quantize --checkpoint ft/minilm-sst2 --dev glue/sst2/dev.tsv --out q/sst2\n"
                "  lmlab compress quantize --checkpoint ck/gpt --activations none --exclude 'heads.*' \\\n"
                "      --out q/gpt")
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="checkpoint to quantize: from lmlab finetune, or any model directory")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR",
                   help="directory for the quantized checkpoint")
    p.add_argument("--dev", type=path_flag, metavar="FILE",
                   help="dev data of the checkpoint's task: score and speed")
    p.add_argument("--activations", choices=("dynamic", "none"), default="dynamic",
                   help="dynamic: int8 activations per token (int8 x int8 matmuls); none: weight-only")
    p.add_argument("--exclude", type=flag(Text), action="append", default=[], metavar="PATTERN",
                   help="keep linear layers whose name matches (fnmatch) in float; may be repeated")
    _common(p)
    p.set_defaults(func=run_quantize, out_kind=("model.safetensors", "model"))

    p = command("prune", "zero the smallest weights to a target sparsity",
                "Magnitude pruning (Han et al. 2015) of the linear layers inside the Transformer blocks:\n"
                "single weights (unstructured), output rows or attention heads, ranked over all layers\n"
                "(global) or within each (layer). With --train and --steps the model is fine-tuned\n"
                "further and the pruned weights stay exactly zero.",
                "  lmlab compress prune --checkpoint ft/minilm-sst2 --sparsity 0.5 \\\n"
                "      --dev glue/sst2/dev.tsv --train glue/sst2/train.tsv --steps 300 --out pruned/sst2-50")
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="checkpoint to prune: from lmlab finetune, or any model directory")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR",
                   help="directory for the pruned checkpoint")
    p.add_argument("--sparsity", type=flag(Fraction), required=True, help="fraction to remove, in [0, 1)")
    p.add_argument("--scope", choices=("global", "layer"), default="global",
                   help="rank the weights over all layers (global) or within each layer")
    p.add_argument("--structure", choices=("unstructured", "rows", "heads"), default="unstructured",
                   help="what is removed: single weights, whole output rows or attention heads")
    p.add_argument("--dev", type=path_flag, metavar="FILE",
                   help="dev data of the checkpoint's task: score and speed")
    p.add_argument("--train", type=path_flag, metavar="FILE",
                   help="fine-tune on this after pruning (with --steps)")
    p.add_argument("--steps", type=size_flag, default=0, metavar="N", help="fine-tuning steps after pruning")
    _training(p, lr=5e-5)
    _common(p)
    p.set_defaults(func=run_prune, out_kind=("model.safetensors", "model"))


def _training(p, lr: float = 1e-4) -> None:
    p.add_argument("--batch-size", type=batch_flag, default=32, metavar="N",
                   help="training examples per step")
    p.add_argument("--lr", type=lr_flag, default=lr, help="peak learning rate")
    p.add_argument("--seed", type=seed_flag, default=0, help="seed of the initialisation and the batches")
    p.add_argument("--max-train-examples", type=count_flag, default=None, metavar="N",
                   help="use the first N training examples")


def _common(p) -> None:
    p.add_argument("--max-eval-examples", type=count_flag, default=None, metavar="N",
                   help="use the first N dev examples")
    p.add_argument("--eval-batch-size", type=batch_flag, default=32, metavar="N",
                   help="examples per batch when scoring --dev")
    p.add_argument("--threads", type=threads_flag, default=None, metavar="N",
                   help="torch threads (default, or 0: OMP_NUM_THREADS, else auto, as every command)")


# --------------------------------------------------------------------------- measuring


def weights_bytes(directory: str | Path) -> int:
    """Bytes on disk of a checkpoint's weights (``model.safetensors``, or all ``*.safetensors``)."""
    files = list(Path(directory).glob("*.safetensors"))
    return sum(f.stat().st_size for f in files)


def measure(model, task=None, examples=None, batch_size: int = 32,
            checkpoint: str | Path | None = None) -> dict:
    """Size, parameters and, given a task and examples, CPU speed and task score of ``model``.

    Speed: one pass of ``task.evaluate`` over ``examples`` in batches of ``batch_size`` (the
    predictions are the score's), wall clock, with the threads torch has; tokens counted without
    padding.
    """
    from lmlab.adapt.prune import nonzero_parameters
    from lmlab.adapt.quantize import linear_weight_bytes

    nonzero, total = nonzero_parameters(model)
    row: dict[str, Any] = {"parameters": total, "nonzero_parameters": nonzero,
                           "linear_weight_bytes": linear_weight_bytes(model)}
    if checkpoint is not None:
        row["size_bytes"] = weights_bytes(checkpoint)
    if task is not None and examples:
        tok = model.tokenizer
        n_tokens = sum(len(f["input_ids"]) for f in task.features(list(examples), tok))
        start = time.perf_counter()
        metrics = task.evaluate(model, list(examples), batch_size)
        elapsed = time.perf_counter() - start
        row.update({"examples_per_s": len(examples) / elapsed, "tokens_per_s": n_tokens / elapsed,
                    "eval_seconds": elapsed, "metrics": metrics})
    return row


def dev_baseline(task, examples, before: dict, after: dict) -> dict | None:
    """The task's trivial baseline on the dev ``examples`` (:mod:`lmlab.tasks.baseline`: their
    majority class, no model), judged on the task's main metric, with whether the model before and
    after is at (or below) it: compress.json's ``baseline`` (None without dev data or a baseline)."""
    from lmlab.tasks.baseline import at_trivial_baseline, baseline_record, trivial_baseline

    if task is None or not examples:
        return None
    baseline = trivial_baseline(task, examples)
    record = baseline_record(baseline, task.main_metric)
    if record is not None:
        metric = record["metric"]
        record["at_baseline"] = {when: at_trivial_baseline(row.get("metrics") or {}, baseline, metric)
                                 for when, row in (("before", before), ("after", after))}
    return record


# --------------------------------------------------------------------------- shared steps


def _load(path: str, float_only: str | None = None):
    """(model, task or None) from a fine-tuned checkpoint or any model directory. ``float_only``:
    the command that needs float weights (prune, quantize, distill --init teacher), so an int8
    checkpoint is refused before it is read (:func:`lmlab.models.refuse_int8`, export's and
    fine-tuning's refusal too)."""
    from lmlab.finetune.loop import TASK_FILE, load_finetuned
    from lmlab.loading import load_model
    from lmlab.models import refuse_int8

    if float_only:
        refuse_int8(path, float_only)
    if (Path(path) / TASK_FILE).is_file():
        return load_finetuned(path)
    return load_model(path), None


def _examples(task, path: str | None, limit_: int | None, what: str):
    from lmlab.tasks.readers import limit

    if path is None:
        return None
    if task is None:
        raise LmlabError(f"--{what} needs a checkpoint fine-tuned for a task (with task.json)",
                         "fine-tune it with `lmlab finetune` first, or drop --" + what)
    ex = limit(task.read(path), limit_)
    task.check(ex, what)
    return ex


def _save(model, out: str, task, report: dict, save_fn=None) -> None:
    """Write the model (+ task.json, eval.json, finetune.json for `lmlab evaluate`) and compress.json."""
    from lmlab.fileio import atomic_dir, write_json
    from lmlab.finetune.loop import EVAL_FILE, SUMMARY_FILE, TASK_FILE
    from lmlab.models import save_checkpoint

    with atomic_dir(out, marker="model.safetensors", what="model") as tmp:
        (save_fn or save_checkpoint)(model, tmp, tokenizer=getattr(model, "tokenizer", None))
        if task is not None:
            write_json(tmp / TASK_FILE, task.state())
            write_json(tmp / SUMMARY_FILE,
                       {"task": task.name, "method": "full", "compression": report["method"]})
            metrics = report["after"].get("metrics")
            if metrics:
                write_json(tmp / EVAL_FILE, metrics)
        report["after"]["size_bytes"] = weights_bytes(tmp)
        b, a = report["before"], report["after"]
        if b.get("size_bytes") and a.get("size_bytes"):
            report["size_ratio"] = b["size_bytes"] / a["size_bytes"]
        if b.get("examples_per_s") and a.get("examples_per_s"):
            report["speedup"] = a["examples_per_s"] / b["examples_per_s"]
        write_json(tmp / REPORT_FILE, report)


def _finish(report: dict, out: str | Path | None = None) -> int:
    """Say what the command did, before -> after, in a few lines; every figure is in compress.json."""
    print(summary_text(report, out))
    return 0


def _mb(n_bytes: float) -> str:
    return f"{n_bytes / 1e6:,.1f} MB"


def _millions(n: float) -> str:
    return f"{n / 1e6:,.2f}M" if n >= 1e5 else f"{n:,.0f}"


def _what(method: dict) -> str:
    name = method.get("name")
    if name == "distill":
        return (f"distilled {method['teacher_layers']} layers into {method['student_layers']} "
                f"({method['steps']:,} steps, T={method['temperature']}, alpha={method['alpha']})")
    if name == "quantize":
        return f"quantized {method['layers']} linear layers to int8 ({method['activations']} activations)"
    sparsity = method.get("measured_sparsity_after_finetune", method.get("measured_sparsity", 0.0))
    tuned = f", then fine-tuned {method['finetune_steps']:,} steps" if method.get("finetune_steps") else ""
    percent = f"{sparsity:.0%}" if sparsity < 0.995 else f"{sparsity:.4%}"  # not 100% when one is kept
    return f"pruned to {percent} sparsity ({method['structure']}, {method['scope']}){tuned}"


def _size_change(before: float, after: float) -> str:
    ratio = before / after
    if abs(ratio - 1) < 0.005:
        return "the same size"
    return f"{ratio:.2f}x smaller" if ratio > 1 else f"{1 / ratio:.2f}x larger"


def summary_text(report: dict, out: str | Path | None = None) -> str:
    """The human summary of a compress.json ``report``: size on disk, nonzero parameters, speed and
    every dev score, each as before -> after, then one line that says it all. A pruned model that is
    no smaller and no faster says why (its zeros are stored, and multiplied, like any weight)."""
    from lmlab.tasks.baseline import at_baseline_text, baseline_note, baseline_text

    b, a, method = report["before"], report["after"], report["method"]
    lines, short = [], []
    if b.get("size_bytes") and a.get("size_bytes"):
        change = _size_change(b["size_bytes"], a["size_bytes"])
        lines.append(f"  size on disk   {_mb(b['size_bytes'])} -> {_mb(a['size_bytes'])} ({change})")
        short.append(f"{_mb(b['size_bytes'])} -> {_mb(a['size_bytes'])}")
    if b.get("nonzero_parameters") != a.get("nonzero_parameters") or method.get("name") != "quantize":
        lines.append(f"  parameters     {_millions(b['nonzero_parameters'])} -> "
                     f"{_millions(a['nonzero_parameters'])} nonzero")
    if b.get("examples_per_s") and a.get("examples_per_s"):
        speedup = a["examples_per_s"] / b["examples_per_s"]
        lines.append(f"  speed          {b['examples_per_s']:,.1f} -> {a['examples_per_s']:,.1f} examples/s "
                     f"({speedup:.2f}x, one timed pass over the dev examples on this machine)")
        short.append(f"{speedup:.2f}x the speed")
    base = report.get("baseline") or {}
    trivial = (base.get("answer"), base.get("metrics") or {})
    for name, before in (b.get("metrics") or {}).items():
        after = (a.get("metrics") or {}).get(name)
        if isinstance(before, (int, float)) and isinstance(after, (int, float)):
            note = baseline_note(trivial, name)  # " (baseline 0.5092)", or "" with no baseline
            inside = f"; baseline {trivial[1][name]:.4f}" if note else ""
            lines.append(f"  dev {name:<10} {before:.4f} -> {after:.4f} ({after - before:+.4f}{inside})")
            short += [f"{name} {before:.4f} -> {after:.4f}{note}"] if len(short) < 4 else []
    if base:
        lines.append(f"  {baseline_text(trivial)}")
    flagged = [(when, text) for when, row in (("before", b), ("after", a))
               if (text := at_baseline_text(row.get("metrics") or {}, trivial, base.get("metric")))]
    if method.get("name") == "prune":
        lines.append("  (pruned weights are zeros kept in dense matrices: the file keeps its size and the "
                     "matmuls do the same work, so no speed-up is expected and a difference is the timing "
                     "of one pass on this machine; the gain is the nonzero count, for a sparse format or "
                     "kernel)")
    for when, text in flagged:
        lines.append(f"  warning: {when}, dev {text}: "
                     + ("the model was already no better than that answer before it was compressed"
                        if when == "before" else "the compressed model does no better than that answer, "
                        "which needs no model"))
    where = f"; written to {out}/ (every figure in {Path(out) / REPORT_FILE})" if out is not None else ""
    at = f"; at the trivial baseline {' and '.join(when for when, _ in flagged)}" if flagged else ""
    return "\n".join([f"{_what(method)}, before -> after:", *lines,
                      f"{_what(method)}: {', '.join(short) or 'no dev data to compare'}{at}{where}"])


def _setup(args) -> None:
    from lmlab.runtime import choose_threads, set_threads

    set_threads(choose_threads(args.threads)[0])  # the flag's range is checked as it is parsed (lmlab.values)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _say_estimate(before: dict, examples: int, passes: int) -> None:
    """A rough duration of training on ``examples`` examples, from the measured scoring speed: one
    training example costs about ``passes`` forward passes (backward = 2, plus a teacher's)."""
    from lmlab.train.estimate import duration

    speed = before.get("examples_per_s")
    if speed:
        _say(f"training: roughly {duration(examples * passes / speed)} at the measured scoring speed "
             f"({speed:,.1f} examples/s); timed after its first steps")


# --------------------------------------------------------------------------- commands


def run_quantize(args) -> int:
    from lmlab.adapt.quantize import linears_to_quantize, quantize_model, save_quantized

    _setup(args)
    model, task = _load(args.checkpoint, "lmlab compress quantize (it quantizes float weights once)")
    # the --exclude patterns checked against the model's layers before anything is said or scored
    linears_to_quantize(model, exclude=tuple(args.exclude), flags=("--include", "--exclude"))
    dev = _examples(task, args.dev, args.max_eval_examples, "dev")
    _say(f"quantizing {args.checkpoint} to int8" + (f"; scoring {len(dev):,} dev examples before and after"
                                                     if dev else ""))
    before = measure(model, task, dev, args.eval_batch_size, args.checkpoint)
    names = quantize_model(model, args.activations, exclude=tuple(args.exclude))
    _say(f"quantized {len(names)} linear layers to int8 ({args.activations} activations)")
    after = measure(model, task, dev, args.eval_batch_size)
    report = {"method": {"name": "quantize", "activations": args.activations, "layers": len(names),
                         "exclude": args.exclude}, "before": before, "after": after,
              "baseline": dev_baseline(task, dev, before, after)}
    _save(model, args.out, task, report, save_quantized)
    return _finish(report, args.out)


def run_prune(args) -> int:
    from lmlab.adapt.prune import prune_model, sparsity_note

    _setup(args)
    # --steps without --train/--dev, --train without --steps: refused by lmlab.cli.flag_rules
    model, task = _load(args.checkpoint, "lmlab compress prune")
    dev = _examples(task, args.dev, args.max_eval_examples, "dev")
    train = _examples(task, args.train, args.max_train_examples, "train") if args.steps else []
    if args.steps:  # its fine-tuning's batch, as lmlab.finetune will take it: the plan and estimate count it
        from lmlab.config.fits import batch_for_data

        args.batch_size = batch_for_data(args.batch_size, len(train), "examples", "--batch-size", _say)
    _say(f"pruning {args.checkpoint} to {args.sparsity:.0%} sparsity"
         + (f", then {args.steps:,} fine-tuning steps of {args.batch_size}" if args.steps else "")
         + (f"; scoring {len(dev):,} dev examples before and after" if dev else ""))
    before = measure(model, task, dev, args.eval_batch_size, args.checkpoint)
    if args.steps:
        _say_estimate(before, args.steps * args.batch_size, passes=3)
    masks = prune_model(model, args.sparsity, args.scope, args.structure)
    achieved = masks.sparsity(model)
    shown = f"{achieved:.4f}" if achieved < 0.99995 else f"{achieved:.7f}"  # not 1.0000 when one is kept
    _say(f"pruned to sparsity {shown} ({args.structure}, {args.scope})"
         + sparsity_note(masks, args.sparsity, args.structure, args.scope, model))
    method = {"name": "prune", "sparsity": args.sparsity, "scope": args.scope, "structure": args.structure,
              "measured_sparsity": masks.sparsity(model), "finetune_steps": args.steps}
    if args.steps:
        from lmlab.finetune import finetune

        masks.attach(model)
        res = finetune(model, task, train, dev, None, max_steps=args.steps, batch_size=args.batch_size,
                       lr=args.lr, seed=args.seed, eval_batch_size=args.eval_batch_size, log=_say)
        model = res.model
        masks.apply(model)  # already zero (gradient hooks); makes the invariant explicit
        masks.detach()
        method["measured_sparsity_after_finetune"] = masks.sparsity(model)
    after = measure(model, task, dev, args.eval_batch_size)
    report = {"method": method, "before": before, "after": after,
              "baseline": dev_baseline(task, dev, before, after)}
    _save(model, args.out, task, report)
    return _finish(report, args.out)


def run_distill(args) -> int:
    from lmlab.adapt.distill import distill, make_student
    from lmlab.finetune.loop import TASK_FILE

    _setup(args)
    if not (Path(args.teacher) / TASK_FILE).is_file():  # before its weights are read
        raise LmlabError(f"{args.teacher} is not a fine-tuned checkpoint (no task.json)",
                         "fine-tune the teacher with `lmlab finetune ... --out DIR` first")
    from lmlab.adapt.distill import TEACHER_INIT_READER, chosen_layers
    from lmlab.loading import model_facts
    from lmlab.setting_names import SettingNames

    flags = SettingNames("flag", flags={"n_layers": "--layers", "layers": "--student-layers"})
    facts = model_facts(args.teacher)  # the student's layers fit the teacher: before its weights load
    if facts is not None and getattr(facts.config, "n_layers", None):
        chosen_layers(facts.config.n_layers, args.layers, args.student_layers, flags)
    # an int8 teacher can give soft targets, but no float weights to copy into a student
    teacher, task = _load(args.teacher, TEACHER_INIT_READER if args.init == "teacher" else None)
    train = _examples(task, args.train, args.max_train_examples, "train")
    dev = _examples(task, args.dev, args.max_eval_examples, "dev")
    from lmlab.config.fits import batch_for_data

    student = make_student(teacher, args.layers, args.student_layers, args.init, args.seed, names=flags)
    # a batch beyond the training data is one batch of all of it: the plan and the estimate count it
    args.batch_size = batch_for_data(args.batch_size, len(train), "examples", "--batch-size", _say)
    _say(f"distilling {args.teacher} ({teacher.config.n_layers} layers) into {student.config.n_layers} "
         f"layers: {args.steps:,} steps of {args.batch_size} of {len(train):,} training examples"
         + (f"; scoring {len(dev):,} dev examples before and after" if dev else ""))
    before = measure(teacher, task, dev, args.eval_batch_size, args.teacher)
    _say_estimate(before, args.steps * args.batch_size, passes=4)
    res = distill(teacher, student, task, train, None, steps=args.steps, batch_size=args.batch_size,
                  lr=args.lr, temperature=args.temperature, alpha=args.alpha, seed=args.seed, log=_say)
    after = measure(res.student, task, dev, args.eval_batch_size)
    report = {"method": {"name": "distill", "teacher_layers": teacher.config.n_layers,
                         "student_layers": res.student.config.n_layers, "init": args.init,
                         "temperature": args.temperature, "alpha": args.alpha, "steps": args.steps},
              "before": before, "after": after, "baseline": dev_baseline(task, dev, before, after)}
    _save(res.student, args.out, task, report)
    return _finish(report, args.out)
