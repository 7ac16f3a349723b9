"""The fine-tuning loop: ``finetune(checkpoint, task, train, dev, out)``.

One run (Devlin et al. 2019 sec. 4; Howard & Ruder 2018 for the warmup/decay schedule):

1. load the pretrained model and its tokenizer; read train/dev, learn the label set from train
   and reject dev labels never seen in training;
2. swap the pretraining head for the task head (:meth:`Task.prepare_model`), then let the
   *method* adapt the model: ``full`` trains every weight; other methods (LoRA, adapters,
   prefix/prompt tuning of :mod:`lmlab.adapt`, listed in :data:`METHODS`) freeze the body and add
   their own small modules;
3. encode the training set once (:meth:`Task.features`); every epoch visit it in a new random
   order (seeded) in batches padded to their longest member, grouped by length
   (:func:`epoch_batches`);
4. each step: forward, task loss, backward, clip the global gradient norm, AdamW step with the
   learning rate of this step (linear warmup to ``lr``, then linear decay to 0 at the last step);
5. evaluate on dev at the end of every epoch (and every ``eval_every`` steps); keep the weights
   with the best ``select_metric`` (the task's main metric);
6. write ``out``: the best model (``load_model``-able, with its task head and tokenizer),
   ``task.json``, ``eval.json`` (the best dev metrics), ``metrics.jsonl``, ``finetune.json``.

``out`` is replaced atomically at the end (an existing model there stays valid until then);
``metrics.jsonl`` is written into ``out`` as the run goes, one JSON object per line.

Methods: ``METHODS`` maps a name to a class or to ``"module:Class"``. A method is constructed as
``cls(**method_options)`` and then asked to

* ``apply(model, task) -> model``: wrap/freeze the model that already has its task head
  (trainable parameters are those with ``requires_grad``);
* ``snapshot(model)`` / ``restore(model, snap)``: keep and bring back the best weights;
* ``save(model, directory, tokenizer)``: write a directory that ``load(directory)`` (a
  classmethod) reads back; ``full`` uses the ordinary lmlab checkpoint and ``load_model``.
* optionally ``loss(task, model, batch)``: the training loss of one batch, used instead of
  ``task.loss(model, batch)`` (AdaMix: two stochastic passes and a consistency term).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab import ownership
from lmlab.errors import LmlabError
from lmlab.fileio import (
    atomic_dir,
    check_replaceable_dir,
    directory_lock,
    read_json,
    replace_dir,
    write_json,
    write_output_file,
)
from lmlab.finetune import resume as resume_state
from lmlab.finetune.config import FinetuneConfig
from lmlab.finetune.selection import ROW_PREFIX, carve_selection, selection_record
from lmlab.runtime import pick_device, resolve
from lmlab.tasks import Task, check_tokenizer, collate, load_task, make_task
from lmlab.tasks.base import pad_id_of
from lmlab.tasks.readers import BadLines, Example, limit
from lmlab.train import distributed as dist
from lmlab.train.checkpoint import restore_rng, rng_tensors
from lmlab.train.engine import Engine
from lmlab.train.estimate import Estimate, duration
from lmlab.train.loggers import logger_dirs, open_loggers
from lmlab.train.optim import warmup_decay_lr
from lmlab.train.preempt import StopRequests
from lmlab.train.progress import LINES_PER_RUN, Progress

TASK_FILE = "task.json"
EVAL_FILE = "eval.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "finetune.json"
GROUP_BATCHES = 4


# --------------------------------------------------------------------------- methods


class FullFineTuning:
    """Train every parameter of the model and its task head (the BERT/GPT recipe)."""

    name = "full"

    def __init__(self, **options):
        if options:
            raise LmlabError(f"method 'full' takes no options, got {sorted(options)}", "drop --method-option")

    def apply(self, model: nn.Module, task: Task) -> nn.Module:
        for p in model.parameters():
            p.requires_grad_(True)
        return model

    def snapshot(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def restore(self, model: nn.Module, snap: dict[str, torch.Tensor]) -> None:
        model.load_state_dict(snap)

    def save(self, model: nn.Module, directory: Path, tokenizer) -> None:
        from lmlab.models import save_checkpoint

        save_checkpoint(model, directory, tokenizer=tokenizer)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> nn.Module:
        from lmlab.loading import load_model

        return load_model(directory)


#: method name -> class, or "module:Class" imported on first use; the parameter-efficient methods of
#: lmlab.adapt (see docs/peft.md) come after ``full``
METHODS: dict[str, Any] = {
    "full": FullFineTuning,
    "lora": "lmlab.adapt.peft_io:LoRAFineTuning",
    "adapter": "lmlab.adapt.peft_io:AdapterFineTuning",
    "prefix": "lmlab.adapt.peft_io:PrefixFineTuning",
    "prompt": "lmlab.adapt.peft_io:PromptFineTuning",
    "adamix": "lmlab.adapt.peft_io:AdaMixFineTuning",
}


def method_class(name: str):
    if name not in METHODS:
        raise LmlabError(f"unknown fine-tuning method {name!r}", f"choose one of: {', '.join(METHODS)}")
    target = METHODS[name]
    if isinstance(target, str):
        module, attr = target.split(":")
        target = getattr(importlib.import_module(module), attr)
    return target


# --------------------------------------------------------------------------- result


@dataclass
class FinetuneResult:
    metrics: dict[str, float]                 # the chosen model's dev metrics (= eval.json)
    model: nn.Module                          # the model with the best weights
    task: Task
    out: Path | None
    best_step: int
    steps: int
    trainable_parameters: int
    total_parameters: int
    history: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, float] | None = None  # the trivial answer's dev metrics (majority class...)
    at_baseline: bool = False                 # the best dev score is no better than that
    selected_on: str = "dev"                  # the data that chose the step (and the --lr auto rate)
    selection: dict[str, float] | None = None  # the chosen step's scores on that data


# --------------------------------------------------------------------------- helpers


def make_optimizer(model: nn.Module, cfg: FinetuneConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (:func:`lmlab.train.optim.adamw`: no decay on biases,
    norms, embeddings; the fused kernel where it exists)."""
    from lmlab.train.optim import adamw

    return adamw([model], lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def epoch_batches(lengths: Sequence[int], batch_size: int, gen: torch.Generator,
                  group_by_length: bool = True) -> list[list[int]]:
    """One epoch of batches (lists of feature indices) in a random order.

    With ``group_by_length`` the shuffled features are cut into pools of ``GROUP_BATCHES``
    batches, each pool sorted by length before being cut into batches, and the batches are
    shuffled again: batches still mix random examples, but each holds similar lengths, so
    padding to the longest member wastes less (SST-2, 500 sentences, batch 32: 10,340 padded
    tokens instead of 19,776). Small pools keep batches varied (with pools of 16 batches, a small
    run's batches were sorted almost perfectly by length, and results varied more).
    """
    order = torch.randperm(len(lengths), generator=gen).tolist()
    if group_by_length:
        pool = batch_size * GROUP_BATCHES
        order = [i for k in range(0, len(order), pool)
                 for i in sorted(order[k:k + pool], key=lambda j: -lengths[j])]
    out = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    if group_by_length:
        out = [out[i] for i in torch.randperm(len(out), generator=gen).tolist()]
    return out


def rank_of_launch() -> int:
    """This process's rank under torchrun (0 otherwise), before the process group exists."""
    return int(os.environ.get("RANK", "0"))


def share_of_batch(idx: list[int], info) -> tuple[list[int], float]:
    """This process's examples of the global batch ``idx`` and the weight of its mean loss.

    With N processes, process r takes ``idx[r::N]``; its per-example mean loss is weighted by
    ``len(share) * N / len(idx)``, so that the gradients averaged over processes equal the
    gradient of the mean over the whole batch, as on one process, also when the batch does not
    divide evenly. A process left without an example (a last batch smaller than N) runs the first
    one with weight 0: it must still join the gradient all-reduce.
    """
    if not info.enabled:
        return idx, 1.0
    mine = idx[info.rank::info.world_size]
    if not mine:
        return idx[:1], 0.0
    return mine, len(mine) * info.world_size / len(idx)


def at_trivial_baseline(metrics: dict[str, float], baseline, select: str, margin: float = 0.005) -> bool:
    """True when the selected dev metric is no better than the trivial answer's (within ``margin``)."""
    if baseline is None or select not in baseline[1] or select not in metrics:
        return False
    return bool(metrics[select] <= baseline[1][select] + margin)


def _read(task: Task, data, what: str, bad: BadLines) -> list[Example]:
    if isinstance(data, (str, os.PathLike)):
        return task.read(data, bad)
    if isinstance(data, Sequence) and all(isinstance(e, Example) for e in data):
        return list(data)
    raise LmlabError(f"{what} must be a file path or a list of Examples", "pass e.g. glue/sst2/train.tsv")


def load_trainable_model(checkpoint, tokenizer):
    """The model to fine-tune or align: a checkpoint path or module, with ``tokenizer`` attached."""
    if isinstance(checkpoint, nn.Module):
        model = checkpoint
    else:
        from lmlab.loading import load_model

        model = load_model(checkpoint)
    if tokenizer is not None:
        if isinstance(tokenizer, (str, os.PathLike)):
            from lmlab.tokenizers import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        model.tokenizer = tokenizer
    if getattr(model, "architecture", "") not in ("encoder", "decoder", "seq2seq"):
        raise LmlabError(f"cannot fine-tune a {getattr(model, 'architecture', type(model).__name__)} model",
                         "use an encoder, decoder or encoder-decoder Transformer checkpoint")
    check_tokenizer(model)
    return model


# --------------------------------------------------------------------------- the loop


def finetune(checkpoint, task: str | Task, train, dev, out: str | os.PathLike | None,
             method: str = "full", method_options: dict[str, Any] | None = None, *,
             tokenizer=None, log: Callable[[str], None] | None = None, resume: bool = False,
             _resumable: bool = True, **hparams) -> FinetuneResult:
    """Fine-tune ``checkpoint`` (a directory or a model) on ``task`` and write the result to ``out``.

    ``train``/``dev``: file paths (or lists of :class:`~lmlab.tasks.readers.Example`).
    ``hparams``: :class:`FinetuneConfig` fields (``lr``, ``epochs``, ``max_steps``,
    ``batch_size``, ``max_length``...). ``out=None`` writes nothing (the result holds the model).
    ``resume``: continue the interrupted run that was writing ``out`` (:mod:`lmlab.finetune.resume`).
    Returns the best dev metrics, the model and the run's numbers.
    """
    cfg = FinetuneConfig.from_dict(hparams)
    if cfg.loggers and out is None:  # before any work
        raise LmlabError("loggers write beside the fine-tuned model, but there is no output directory",
                         "pass an output directory (--out)")
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    meth = method_class(method)(**(method_options or {}))  # bad method options fail before any work
    if cfg.lr == "auto":
        if dist.launched_world_size() > 1:
            raise LmlabError("--lr auto runs one fine-tuning per rate and cannot run under torchrun",
                             "sweep on one process, then fine-tune with the chosen --lr under torchrun")
        if resume:
            raise LmlabError("--resume cannot continue an --lr auto sweep (each rate is its own run)",
                             "rerun the sweep, or fine-tune with the chosen --lr and --resume that")
        return _lr_sweep(checkpoint, task, train, dev, out, method, method_options, tokenizer, say, hparams,
                         cfg)
    if out is None or not _resumable or rank_of_launch() != 0:
        return _finetune_run(checkpoint, task, train, dev, out, method, method_options, tokenizer, say,
                             resume, _resumable, cfg, meth)
    # one run at a time per output: a second would clear or overwrite the first's resume state and logs
    rdir = resume_state.claim(check_replaceable_dir(out, SUMMARY_FILE, "fine-tuned model"))
    try:
        with directory_lock(rdir, "fine-tuning output"):
            return _finetune_run(checkpoint, task, train, dev, out, method, method_options, tokenizer, say,
                                 resume, _resumable, cfg, meth)
    finally:
        resume_state.remove_if_only_lock(rdir)


def _finetune_run(checkpoint, task, train, dev, out, method, method_options, tokenizer, say, resume,
                  _resumable, cfg: FinetuneConfig, meth) -> FinetuneResult:
    out_dir = Path(out) if out is not None else None
    resumable = out_dir is not None and _resumable
    resume_from = None
    if out_dir is not None:
        out_dir = check_replaceable_dir(out_dir, SUMMARY_FILE, "fine-tuned model")  # before any work
        if resumable:
            resume_from = resume_state.check_start(out_dir, resume, clear=rank_of_launch() == 0)
    machine = resolve(cfg.device, cfg.threads, cfg.precision, int(os.environ.get("LOCAL_RANK", "0")),
                      int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    device, dtype = machine.device, machine.dtype
    owns_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    info = dist.init(device.type)  # torchrun: every process takes its share of each batch
    if not info.is_main:  # one voice and one writer: rank 0
        say = lambda msg: None  # noqa: E731
    torch.manual_seed(cfg.seed)

    model = load_trainable_model(checkpoint, tokenizer)
    if not isinstance(task, Task):
        task = make_task(task, model.architecture, **cfg.task_options())
    bad = BadLines(cfg.on_bad_line, say, cfg.max_bad_fraction)
    train_ex = limit(_read(task, train, "train", bad), cfg.max_train_examples)
    task.fit(train_ex)  # the label set, before dev is read: a dev file's header is told from its labels
    dev_ex = limit(_read(task, dev, "dev", bad), cfg.max_eval_examples)
    task.check(dev_ex, "dev")
    train_ex, choose_ex = _selection_data(train_ex, dev_ex, cfg)

    model = task.prepare_model(model)
    model = meth.apply(model, task).to(device)
    tok = model.tokenizer
    feats = task.features(train_ex, tok)
    pad = pad_id_of(tok, model)

    optimizer = make_optimizer(model, cfg)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total_params = sum(p.numel() for p in model.parameters())
    steps_per_epoch = math.ceil(len(feats) / cfg.batch_size)
    total = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * steps_per_epoch
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(cfg.warmup_ratio * total)
    select = cfg.select_metric or task.main_metric
    identity = resume_state.run_identity(cfg.to_dict(), task.name, method, method_options or {}, checkpoint,
                                         train, dev)
    saved = None if resume_from is None else resume_state.load_state(resume_from, identity, model, optimizer,
                                                                     len(feats))
    chooser = "dev" if cfg.select_on == "dev" else f"a {len(choose_ex)}-example slice of train (held out)"
    say(f"finetune: task {task.name} ({type(task).__name__}), method {method}, {len(train_ex)} train / "
        f"{len(dev_ex)} dev examples, the best step chosen on {chooser}, "
        f"{_planned_steps(cfg, total, steps_per_epoch)}, device {device} "
        f"({'bf16 autocast' if dtype is not None else 'fp32'}, {machine.threads} thread(s)), trainable "
        f"parameters {trainable:,} of {total_params:,} ({100 * trainable / max(1, total_params):.2f}%)")

    baseline = task.baseline(train_ex, dev_ex)
    if baseline is not None:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in baseline[1].items())
        say(f"baseline ({baseline[0]}, no model): {shown}")
    # what the scores that choose are compared with (on the slice: the same answer scored there)
    choose_baseline = baseline if choose_ex is dev_ex else task.baseline(train_ex, choose_ex)
    prefix = ROW_PREFIX[cfg.select_on]

    log_path = None
    writes = out_dir is not None and info.is_main
    if writes:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        # the live log sits beside the output (tail it while training; in the resume directory when
        # the run can be resumed); it moves into the output at the end
        if resumable:
            log_path = resume_state.resume_dir(out_dir) / METRICS_FILE
            log_path.parent.mkdir(exist_ok=True)
        else:  # a marked temporary folder beside the output: the next run removes it if this one dies
            live_dir = ownership.make_temporary(out_dir.parent, out_dir.name, "fine-tuning logs", "live-")
            log_path = live_dir / METRICS_FILE
        log_path.write_text("", encoding="utf-8")
    # TensorBoard & co. write beside the output too (in the resume directory when the run can be
    # resumed, so a resumed run continues them), and move into it at the end
    live_logs = None
    live_dir = None if not writes or resumable else log_path.parent
    if not writes:
        pass
    elif resumable:
        live_logs = resume_state.resume_dir(out_dir) / resume_state.LOGS
    else:
        live_logs = live_dir / resume_state.LOGS
    loggers = (open_loggers(cfg.loggers, live_logs, resume_after=saved["step"] if saved else None,
                            name=out_dir.name, config={"task": task.name, "method": method, **cfg.to_dict()})
               if cfg.loggers and writes else [])
    finished = False
    exits = contextlib.ExitStack()  # the stop-signal handlers, while the loop runs
    try:
        history: list[dict[str, Any]] = []

        def record(row: dict[str, Any]) -> None:
            history.append(row)
            if log_path is not None:
                with open(log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
            for logger in loggers:
                logger.log(row, row["step"])

        best: dict[str, Any] = {"score": -math.inf, "metrics": None, "step": 0, "snap": None}

        def evaluate(step: int, epoch: float) -> None:
            with machine.autocast():
                metrics = task.evaluate(model, choose_ex, cfg.eval_batch_size)
            if select not in metrics:
                raise LmlabError(f"select_metric {select!r} is not a metric of task {task.name}",
                                 f"choose one of: {', '.join(metrics)}")
            record({"step": step, "epoch": round(epoch, 3),
                    **{f"{prefix}_{k}": v for k, v in metrics.items()}})
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            if choose_baseline and select in choose_baseline[1]:
                shown += f" (baseline {select} {choose_baseline[1][select]:.4f})"
            progress.write(f"step {step} epoch {epoch:.2f}: {'' if prefix == 'dev' else prefix + ' '}{shown}")
            if metrics[select] > best["score"]:
                best.update(score=metrics[select], metrics=metrics, step=step, snap=meth.snapshot(model))

        progress = Progress(total, desc=f"finetune {task.name}", log=say,
                            show="auto" if cfg.progress and info.is_main else "off")
        gen = torch.Generator().manual_seed(cfg.seed)
        lengths = [len(f["input_ids"]) for f in feats]
        model.train()
        step, t0, seen, run_loss, n_loss = 0, time.perf_counter(), 0, 0.0, 0
        order: list[list[int]] = []  # this epoch's batches, last first (pop() is O(1))
        if saved is not None:  # continue the interrupted run where its state was saved
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            gen.set_state(saved["generator"])
            restore_rng(saved["rng"])
            step, seen, order = saved["step"], saved["seen"], saved["order"]
            run_loss, n_loss = saved["run_loss"], saved["n_loss"]
            t0 -= saved["elapsed_s"]
            best.update(saved["best"])
            history.extend(saved["history"])
            if log_path is not None:
                log_path.write_text("".join(json.dumps(r) + "\n" for r in history), encoding="utf-8")
            say(f"resumed at step {step} of {total} (best {prefix} {select} so far "
                f"{best['score']:.4f}, step {best['step']})")
            progress.update(step, [])
        estimate = Estimate(total, step, say=say, note=_evaluations_note(cfg, total, steps_per_epoch,
                                                                         len(choose_ex)),
                            hint=lambda rate: _shorter_run_hint(rate, cfg))

        def save_resume_state() -> None:
            if not info.is_main:
                return
            resume_state.save_state(out_dir, {
                "identity": identity, "step": step, "seen": seen, "order": order,
                "run_loss": run_loss, "n_loss": n_loss, "elapsed_s": time.perf_counter() - t0,
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "generator": gen.get_state(), "rng": rng_tensors(), "best": best, "history": history})

        engine = Engine(optimizer, lambda s: warmup_decay_lr(s, lr=cfg.lr, warmup=warmup, end=total),
                        clip=cfg.grad_clip, autocast=machine.autocast,
                        reduce=(lambda ps: dist.average_gradients(ps, info)) if info.enabled else None,
                        fix="lower the learning rate (--lr)")
        stop = exits.enter_context(StopRequests()) if resumable else None
        step_loss = getattr(meth, "loss", None) or (lambda t, m, b: t.loss(m, b))
        while step < total:
            if not order:
                order = epoch_batches(lengths, cfg.batch_size, gen, cfg.group_by_length)[::-1]
            idx = order.pop()
            mine, weight = share_of_batch(idx, info)
            batch = collate([feats[i] for i in mine], pad, device)
            done = engine.step(step, [lambda b=batch, w=weight: step_loss(task, model, b) * w])
            lr, loss_v, grad_norm = done.lr, done.loss, done.grad_norm
            step += 1
            seen += len(idx)
            run_loss, n_loss = run_loss + loss_v, n_loss + 1
            progress.update(step, [f"loss {loss_v:.4f}"], loss=f"{loss_v:.4f}")
            estimate.update(step)
            epoch = seen / len(feats)
            if step % cfg.log_every == 0 or step == total:
                elapsed = time.perf_counter() - t0
                record({"step": step, "epoch": round(epoch, 3), "loss": run_loss / n_loss, "lr": lr,
                        "grad_norm": float(grad_norm), "examples_per_s": seen / elapsed,
                        "elapsed_s": elapsed})
                run_loss, n_loss = 0.0, 0
            epoch_end = not order
            evaluated = epoch_end or step == total or bool(cfg.eval_every and step % cfg.eval_every == 0)
            if evaluated:
                evaluate(step, epoch)
                model.train()
                estimate.pause()
            if resumable and step < total:
                requested = stop.requested
                if info.enabled and dist.any_across(requested is not None, info, device):
                    requested = requested or "a stop on another process"
                if requested or (evaluated if cfg.save_every is None else step % cfg.save_every == 0):
                    save_resume_state()
                if requested:
                    progress.close()
                    say(f"stopped by {requested} at step {step}; continue with the same command and --resume")
                    raise KeyboardInterrupt
        exits.close()
        progress.close()

        meth.restore(model, best["snap"])
        model.eval()
        metrics = best["metrics"]
        if choose_ex is not dev_ex:  # the dev file's first and only use: scoring the chosen model
            with machine.autocast():
                metrics = task.evaluate(model, dev_ex, cfg.eval_batch_size)
            record({"step": total, "epoch": round(seen / len(feats), 3), "chosen_step": best["step"],
                    **{f"dev_{k}": v for k, v in metrics.items()}})
            say(f"the step chosen on the slice ({best['step']}) scores on dev: "
                + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        at_baseline = at_trivial_baseline(metrics, baseline, select)
        if at_baseline:
            say(f"warning: the best dev {select} {metrics[select]:.4f} is at the trivial baseline "
                f"({baseline[0]}: {baseline[1][select]:.4f}): the model learned nothing usable; try another "
                f"learning rate (--lr auto picks one on {cfg.select_on}), more steps, or check the labels")
        summary = {"task": task.name, "method": method, "method_options": method_options or {},
                   "best_step": best["step"], "steps": total, "select_metric": select, "dev": metrics,
                   "baseline": None if baseline is None else {"answer": baseline[0], "dev": baseline[1]},
                   "at_baseline": at_baseline,
                   "selection": selection_record(cfg.select_on, cfg.select_fraction, len(choose_ex), select,
                                                 best["metrics"]),
                   "trainable_parameters": trainable, "total_parameters": total_params,
                   "train_examples": len(train_ex), "dev_examples": len(dev_ex),
                   "elapsed_s": time.perf_counter() - t0, "config": cfg.to_dict(),
                   "machine": machine.record()}
        for logger in loggers:
            logger.close()
        if writes:
            rows = log_path.read_text(encoding="utf-8")
            with atomic_dir(out_dir, marker=SUMMARY_FILE, what="fine-tuned model") as tmp:
                meth.save(model, tmp, tok)
                write_json(tmp / TASK_FILE, task.state())
                write_json(tmp / EVAL_FILE, metrics)
                write_json(tmp / SUMMARY_FILE, summary)
                (tmp / METRICS_FILE).write_text(rows, encoding="utf-8")
                for folder in logger_dirs(cfg.loggers):
                    os.replace(live_logs / folder, tmp / folder)
            log_path.unlink(missing_ok=True)
            finished = True
        say(_done_line(total, best, metrics, select, prefix, baseline, time.perf_counter() - t0,
                       out_dir if writes else None))
        dist.barrier(info)  # the other processes return once the output is in place
    finally:  # also when training fails: no open event files, nothing left beside the output
        for logger in loggers:
            logger.close()
        exits.close()
        state_file = resume_state.resume_dir(out_dir) / resume_state.STATE_FILE if resumable else None
        if resumable and (finished or not state_file.exists()):
            # done, or failed before a state worth resuming was written (a non-finite loss at the start)
            resume_state.discard(out_dir)
        elif live_dir is not None:
            shutil.rmtree(live_dir, ignore_errors=True)
        if owns_group:
            dist.shutdown(info)
    return FinetuneResult(metrics, model, task, out_dir, best["step"], total, trainable, total_params,
                          history, None if baseline is None else baseline[1], at_baseline, cfg.select_on,
                          best["metrics"])


def _selection_data(train_ex: list[Example], dev_ex: list[Example],
                    cfg: FinetuneConfig) -> tuple[list[Example], list[Example]]:
    """``(what is trained on, what chooses the step)``: all of train and the dev file, or train less a
    validation slice and that slice (:mod:`lmlab.finetune.selection`)."""
    if cfg.select_on == "dev":
        return train_ex, dev_ex
    return carve_selection(train_ex, cfg.select_fraction, cfg.seed)


def _planned_steps(cfg: FinetuneConfig, total: int, steps_per_epoch: int) -> str:
    """The plan line's steps: ``6,315 steps (3 epochs of 2,105 batches of 32)``."""
    if cfg.max_steps is None:
        epochs = f"{cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''}"
        return f"{total:,} steps ({epochs} of {steps_per_epoch:,} batches of {cfg.batch_size})"
    return (f"{total:,} steps (max_steps: {total / steps_per_epoch:.2f} epochs of {steps_per_epoch:,} "
            f"batches of {cfg.batch_size})")


def _evaluations_note(cfg: FinetuneConfig, total: int, steps_per_epoch: int, examples: int) -> str:
    """What the estimate leaves out: the evaluations (at every epoch's end, every ``eval_every``
    steps and at the last step)."""
    at = {total, *range(steps_per_epoch, total + 1, steps_per_epoch)}
    if cfg.eval_every:
        at.update(range(cfg.eval_every, total + 1, cfg.eval_every))
    return f" (plus {len(at)} evaluation{'s' if len(at) > 1 else ''} of {examples:,} examples)"


#: the length of run the hint of a long one offers
SHORT_RUN_S = 10 * 60


def _shorter_run_hint(seconds_per_step: float, cfg: FinetuneConfig) -> str:
    """Said after an estimate over half an hour: the flags that shorten the run."""
    steps = max(1, int(SHORT_RUN_S / seconds_per_step))
    fewer_epochs = "" if cfg.max_steps is not None or cfg.epochs <= 1 else ", --epochs 1"
    return (f"hint: that is long; --max-steps {steps:,} would take about {duration(SHORT_RUN_S)}, and "
            f"--max-train-examples N{fewer_epochs} shorten the run too")


def _done_line(total: int, best: dict[str, Any], metrics: dict[str, float], select: str, prefix: str,
               baseline, elapsed: float, saved_to: Path | None) -> str:
    """The run in one line: time, steps, the chosen step's score (and the baseline's), where it went."""
    if prefix == "dev":
        score = f"best dev {select} {best['score']:.4f} at step {best['step']:,}"
    else:
        score = (f"step {best['step']:,} chosen on the slice ({select} {best['score']:.4f}), dev {select} "
                 f"{metrics[select]:.4f}")
    if baseline is not None and select in baseline[1]:
        score += f" (baseline {baseline[1][select]:.4f})"
    where = f"; saved to {saved_to}" if saved_to is not None else ""
    return f"finetune done in {duration(elapsed)} ({total:,} steps): {score}{where}"


def _lr_sweep(checkpoint, task, train, dev, out, method, method_options, tokenizer, say, hparams,
              cfg: FinetuneConfig) -> FinetuneResult:
    """``lr = "auto"``: one full fine-tuning run per rate of ``cfg.lr_sweep`` (each written to a
    temporary sibling of ``out``), the best on the selection data kept (``select_on``: the dev file,
    or the validation slice of train, the same slice for every rate; ties: the smaller rate) and
    renamed into ``out``; the others are deleted. Every arm of a comparison gets the same sweep."""
    target = None if out is None else check_replaceable_dir(out, SUMMARY_FILE, "fine-tuned model")
    runs: list[tuple[float, FinetuneResult, Path | None]] = []
    try:
        for i, lr in enumerate(cfg.lr_sweep):
            say(f"lr auto: run {i + 1}/{len(cfg.lr_sweep)}, lr {lr:g}")
            # a marked temporary: if the sweep is killed, the next run into ``out`` removes it
            tmp = None if target is None else ownership.make_temporary(target.parent, target.name,
                                                                         "fine-tuned model", f"lr-{lr:g}-")
            start = checkpoint if isinstance(checkpoint, (str, os.PathLike)) else copy.deepcopy(checkpoint)
            res = finetune(start, task, train, dev, tmp, method, method_options, tokenizer=tokenizer, log=say,
                           _resumable=False, **{**hparams, "lr": lr})
            runs.append((lr, res, tmp))
        select = cfg.select_metric or runs[0][1].task.main_metric
        best_lr, best, best_dir = max(runs, key=lambda r: (r[1].selection[select], -r[0]))
        scores = {f"{lr:g}": r.selection[select] for lr, r, _ in runs}
        shown = ", ".join(f"{k} -> {v:.4f}" for k, v in scores.items())
        say(f"lr auto: {ROW_PREFIX[cfg.select_on]} {select} {shown}; keeping lr {best_lr:g}")
        if target is not None:
            summary = read_json(best_dir / SUMMARY_FILE, "fine-tuning summary")
            summary["lr_sweep"] = {"select_metric": select, "selected_on": cfg.select_on, "scores": scores,
                                   "chosen": best_lr}
            write_json(best_dir / SUMMARY_FILE, summary)
            ownership.seal(best_dir, "fine-tuned model")
            replace_dir(best_dir, target, "fine-tuned model")
            best.out = target
        return best
    finally:
        for _, _, d in runs:
            if d is not None and d.exists():
                shutil.rmtree(d, ignore_errors=True)
        if target is not None:  # the arms never run (a failure before the first)
            ownership.remove_leftovers(target.parent, target.name)


# --------------------------------------------------------------------------- evaluation


def load_finetuned(checkpoint: str | os.PathLike) -> tuple[nn.Module, Task]:
    """A fine-tuned model and its task, from a directory written by :func:`finetune`."""
    d = Path(checkpoint)
    if not d.is_dir():
        raise LmlabError(f"checkpoint {d} does not exist", "pass a directory written by `lmlab finetune`")
    if not (d / TASK_FILE).is_file():
        raise LmlabError(f"{d} is not a fine-tuned checkpoint (no {TASK_FILE})",
                         "fine-tune it first with `lmlab finetune ... --out DIR`")
    task = load_task(read_json(d / TASK_FILE, "task file"))
    method = "full"
    if (d / SUMMARY_FILE).is_file():
        method = read_json(d / SUMMARY_FILE, "fine-tuning summary").get("method", "full")
    model = method_class(method).load(d)
    check_tokenizer(model)
    return model, task


def evaluate(checkpoint: str | os.PathLike, data, task: str | None = None, *, on_bad_line: str = "error",
             max_bad_fraction: float = 0.01, batch_size: int = 64, max_examples: int | None = None,
             device: str = "auto", predictions: str | os.PathLike | None = None,
             log: Callable[[str], None] | None = None, progress: bool = True, **reading) -> dict[str, float]:
    """Score a fine-tuned checkpoint on ``data``; the same metrics as its ``eval.json``.

    The data is read as the training files were (format, header, columns and label set saved in
    ``task.json``); ``reading`` (``format``, ``header``, ``delimiter``, ``fields``) overrides that
    for a file laid out differently. ``predictions``: also write one JSON line per example,
    ``{"where", "prediction", "label"}``, labels as their names.

    ``log`` (default: stderr) hears what will be scored, the progress over the batches (a bar on a
    terminal, a line every ~5% otherwise; none with ``progress=False``) and a one-line summary.
    """
    if batch_size < 1:
        raise LmlabError(f"batch size must be at least 1, got {batch_size}", "pass e.g. batch_size=64")
    if predictions is not None:
        check_predictions_file(predictions, {"--data": data, "--checkpoint": checkpoint})
    model, saved = load_finetuned(checkpoint)
    if task is not None and task != saved.name:
        raise LmlabError(f"{checkpoint} was fine-tuned for task {saved.name!r}, not {task!r}",
                         f"pass --task {saved.name} or another checkpoint")
    reread(saved, **reading)
    model.to(pick_device(device))
    bad = BadLines(on_bad_line, log, max_bad_fraction)
    examples = limit(_read(saved, data, "data", bad), max_examples)
    saved.check(examples, "data")
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    preds, metrics = _score_and_report(saved, model, examples, batch_size, say, progress)
    if predictions is not None:
        rows = [{"where": e.where, "prediction": p, "label": e.label} for p, e in zip(preds, examples)]
        write_output_file(predictions, "".join(json.dumps(r) + "\n" for r in rows), PREDICTIONS_KIND,
                          "--predictions")
    return metrics


PREDICTIONS_KIND = "predictions"


def _score_and_report(task: Task, model: nn.Module, examples: list[Example], batch_size: int,
                      say: Callable[[str], None], progress: bool) -> tuple[list, dict[str, float]]:
    """``task.predict_and_score``, saying first what it scores, then its progress, then the result."""
    n_batches = math.ceil(len(examples) / batch_size)
    on = next(model.parameters()).device
    threads = f" ({torch.get_num_threads()} thread(s))" if on.type == "cpu" else ""
    say(f"evaluate: {len(examples):,} examples of task {task.name} in {n_batches:,} batch(es) of "
        f"{batch_size}, device {on}{threads}")
    start = time.perf_counter()
    bar = Progress(n_batches, desc=f"evaluate {task.name}", show="auto" if progress else "off", log=say,
                   unit="batch")
    with _predicting_in_chunks(task, bar, batch_size):
        preds, metrics = task.predict_and_score(model, examples, batch_size)
    elapsed = time.perf_counter() - start
    say(f"evaluated {len(examples):,} examples in {duration(elapsed)} "
        f"({len(examples) / max(elapsed, 1e-9):,.1f} examples/s): "
        + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return preds, metrics


@contextlib.contextmanager
def _predicting_in_chunks(task: Task, progress: Progress, batch_size: int):
    """While inside, ``task.predict`` works through its examples a few batches at a time and moves
    ``progress`` (counted in batches) after each chunk; the predictions are the same.

    The task's own ``predict`` sorts what it is given by length before batching; here the
    examples are first sorted by a rough length (their characters), so each chunk's batches still
    hold similar lengths. A chunk is ~5% of the batches (those between two progress lines).
    """
    predict = task.predict
    batches = progress.every if progress.every > 1 else math.ceil(progress.total / LINES_PER_RUN)
    chunk = max(1, batches) * batch_size

    def predict_by_chunks(model, examples, size=batch_size):
        examples = list(examples)
        order = sorted(range(len(examples)), key=lambda i: _rough_length(examples[i]))
        out: list[Any] = [None] * len(examples)
        for k in range(0, len(order), chunk):
            idx = order[k:k + chunk]
            for i, p in zip(idx, predict(model, [examples[i] for i in idx], size)):
                out[i] = p
            progress.update(min(progress.total, math.ceil((k + len(idx)) / size)))
        return out

    task.predict = predict_by_chunks
    try:
        yield
    finally:
        del task.predict  # the class's own again
        progress.close()


def _rough_length(example: Example) -> int:
    """The characters of an example's input texts (its question, context...)."""
    texts = [example.text, example.pair or "", *(v for v in example.extra.values() if isinstance(v, str))]
    return sum(len(t) for t in texts)


def check_predictions_file(path: str | os.PathLike, inputs: dict[str, object]) -> None:
    """Before any work: ``path`` may receive predictions unless that would lose a file: it is one
    of the inputs (or inside one), or it exists and lmlab did not write it there as predictions
    (:mod:`lmlab.ownership`: the folder's manifest records every predictions file lmlab wrote)."""
    p = Path(path)
    for flag, value in inputs.items():
        if isinstance(value, (str, os.PathLike)) and str(value):
            given = Path(value).resolve()
            if p.resolve() == given or given in p.resolve().parents:
                raise LmlabError(f"--predictions {p} would replace the input {flag} {value}; nothing was "
                                 "written", "write the predictions to another file")
    if p.is_dir():
        raise LmlabError(f"--predictions {p} is a directory", "name a file, e.g. dev.predictions.jsonl")
    ownership.check_replaceable_file(p, PREDICTIONS_KIND, "--predictions")


def reread(task: Task, format: str | None = None, header: bool | None = None, delimiter: str | None = None,
           fields: dict[str, str | int] | None = None) -> None:
    """Read the next files of ``task`` (and of the task it wraps) with other reading settings."""
    changes: dict[str, Any] = {k: v for k, v in (("format", format), ("header", header),
                                                  ("delimiter", delimiter)) if v is not None}
    if fields:
        changes["fields"] = {**task.options.fields, **fields}
    if not changes:
        return
    options = dataclasses.replace(task.options, **changes).validate()
    while task is not None:
        task.options = options
        task = getattr(task, "base", None)
