"""The fine-tuning loop: ``finetune(checkpoint, task, train, dev, out)``.

One run (Devlin et al. 2019 sec. 4; Howard & Ruder 2018 for the warmup/decay schedule):

1. load the pretrained model and its tokenizer; read train/dev, learn the label set from train
   and reject dev labels never seen in training;
2. swap the pretraining head for the task head (:meth:`Task.prepare_model`), then let the
   *method* adapt the model (:mod:`lmlab.finetune.methods`): ``full`` trains every weight; other
   methods (LoRA, adapters, prefix/prompt tuning of :mod:`lmlab.adapt`) freeze the body and add
   their own small modules;
3. encode the training set once (:meth:`Task.features`); every epoch visit it in a new random
   order (seeded) in batches padded to their longest member, grouped by length
   (:func:`lmlab.finetune.run.epoch_batches`);
4. train through the one fit loop (:class:`lmlab.train.components.FitLoop`, driven by
   :class:`lmlab.finetune.run.FinetuneRun`): each step the engine's update (linear warmup to
   ``lr``, then linear decay to 0 at the last step), dev evaluation at the end of every epoch (and
   every ``eval_every`` steps) keeping the weights with the best ``select_metric``, the resume
   state in the one resume format (:mod:`lmlab.finetune.resume`);
5. write ``out``: the best model (``load_model``-able, with its task head and tokenizer),
   ``task.json``, ``eval.json`` (the best dev metrics), ``metrics.jsonl``, ``finetune.json``.

``out`` is replaced atomically at the end (an existing model there stays valid until then);
``metrics.jsonl`` is written beside it as the run goes, one JSON object per line.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab import ownership
from lmlab.config.rules import KEYWORDS, SettingNames
from lmlab.errors import LmlabError
from lmlab.fileio import (
    atomic_dir,
    atomic_write_text,
    check_input_file,
    check_replaceable_dir,
    directory_lock,
    read_json,
    replace_dir,
    write_json,
)
from lmlab.finetune import resume as resume_state
from lmlab.finetune.config import FinetuneConfig
from lmlab.finetune.methods import METHODS, FullFineTuning, method_class  # noqa: F401 - public here too
from lmlab.finetune.run import FinetuneRun, RunData, epoch_batches, selection_data, share_of_batch  # noqa: F401
from lmlab.finetune.scoring import (  # noqa: F401 - lmlab.finetune.loop's public names before the split
    PREDICTIONS_KIND,
    _predicting_in_chunks,
    _rough_length,
    _score_and_report,
    check_predictions_file,
    evaluate,
    load_finetuned,
    read_examples,
    reread,
)
from lmlab.finetune.selection import ROW_PREFIX, selection_record
from lmlab.models.checkpoint import refuse_int8
from lmlab.models.config import max_length_for
from lmlab.progress import Progress
from lmlab.runtime import resolve
from lmlab.stopping import RESUME, StopRequests
from lmlab.tasks import ARCHITECTURES, Task, check_fields, check_tokenizer, make_task
from lmlab.tasks.baseline import (  # noqa: F401 - at_trivial_baseline: public here before it moved
    at_baseline_text,
    at_trivial_baseline,
    baseline_note,
    baseline_text,
    trivial_baseline,
)
from lmlab.tasks.readers import BadLines, limit
from lmlab.train import distributed as dist
from lmlab.train.components import RunLogger
from lmlab.train.engine import Engine  # noqa: F401 - the step every loop takes (tests patch it here)
from lmlab.train.estimate import Estimate, duration
from lmlab.train.loggers import logger_dirs, open_loggers
from lmlab.train.metrics import MetricsLog

_read = read_examples  # its name before the split (lmlab.finetune.variants imports it)

TASK_FILE = "task.json"
EVAL_FILE = "eval.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "finetune.json"


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


def rank_of_launch() -> int:
    """This process's rank under torchrun (0 otherwise), before the process group exists."""
    return int(os.environ.get("RANK", "0"))


def load_trainable_model(checkpoint, tokenizer, purpose: str = "fine-tuning"):
    """The model to fine-tune or align (``purpose``, for messages): a checkpoint path or module,
    with ``tokenizer`` attached. The one place a model is opened to be trained: int8 weights (which
    cannot be trained) are refused here, a directory's from its ``config.json`` before any weight is
    read (:func:`lmlab.models.refuse_int8`)."""
    from lmlab.loading import attach_tokenizer, load_model

    refuse_int8(checkpoint, purpose)
    model = checkpoint if isinstance(checkpoint, nn.Module) else load_model(checkpoint)
    if tokenizer is not None:
        model = attach_tokenizer(model, tokenizer)  # checked against the embedding table
    if getattr(model, "architecture", "") not in ("encoder", "decoder", "seq2seq"):
        raise LmlabError(f"cannot fine-tune a {getattr(model, 'architecture', type(model).__name__)} model",
                         "use an encoder, decoder or encoder-decoder Transformer checkpoint")
    check_tokenizer(model)
    return model


def check_model_fits(checkpoint, cfg: FinetuneConfig, task, given=(), meth=None,
                     names: SettingNames = KEYWORDS) -> None:
    """What ``checkpoint`` (a directory or a model) must be for the settings, told from its config
    before any weight is read: a setting of ``given`` its architecture would ignore
    (:meth:`FinetuneConfig.check_architecture`: ``lm_weight`` on an encoder); a ``max_length``
    given and the virtual tokens of the method ``meth`` (a soft prompt, a prefix) must fit its
    positions (:func:`lmlab.models.config.max_length_for`). Errors name the setting as the user
    wrote it (``names``: ``--max-length``, ``max_length``)."""
    from lmlab.loading import model_facts

    facts = model_facts(checkpoint)
    if facts is None:
        return
    if facts.architecture in ARCHITECTURES:  # any other is refused as it loads (load_trainable_model)
        model = "" if isinstance(checkpoint, nn.Module) else str(checkpoint)
        name = task if isinstance(task, str) else getattr(task, "name", None)
        cfg.check_architecture(facts.architecture, name, given, names, model)
    reserved = method_positions(meth, facts.config)
    if cfg.max_length is not None:
        max_length_for(facts.config, cfg.max_length, cfg.max_length, flag=names.of("max_length"),
                       reserved=reserved)


def method_positions(meth, config) -> int:
    """The positions ``meth``'s virtual tokens take in front of every input of a model of ``config``
    (0 for a method without any); virtual tokens that leave no room are refused here."""
    check = getattr(meth, "positions", None)
    return check(config) if check is not None else 0


def task_for_model(task: str, model, cfg: FinetuneConfig, reserved: int = 0) -> Task:
    """The task ``task`` for ``model`` with ``cfg``'s options; its input length is the one given,
    else the task's default cut down to the model's positions (:func:`max_length_for`), less the
    ``reserved`` positions a method's virtual tokens take."""
    options = cfg.task_options()
    built = make_task(task, model.architecture, **options)
    fitted = max_length_for(model.config, cfg.max_length, built.options.max_length, reserved=reserved)
    if fitted != built.options.max_length:
        built = make_task(task, model.architecture, **{**options, "max_length": fitted})
    return built


# --------------------------------------------------------------------------- the loop


def finetune(checkpoint, task: str | Task, train, dev, out: str | os.PathLike | None,
             method: str = "full", method_options: dict[str, Any] | None = None, *,
             tokenizer=None, log: Callable[[str], None] | None = None, resume: bool = False,
             _resumable: bool = True, _names: SettingNames = KEYWORDS, **hparams) -> FinetuneResult:
    """Fine-tune ``checkpoint`` (a directory or a model) on ``task`` and write the result to ``out``.

    ``train``/``dev``: file paths (or lists of :class:`~lmlab.tasks.readers.Example`).
    ``hparams``: :class:`FinetuneConfig` fields (``lr``, ``epochs``, ``max_steps``,
    ``batch_size``, ``max_length``...). ``out=None`` writes nothing (the result holds the model).
    ``resume``: continue the interrupted run that was writing ``out`` (:mod:`lmlab.finetune.resume`).
    Returns the best dev metrics, the model and the run's numbers.
    """
    from lmlab.arguments import callable_argument, describe, flag_argument, path_argument, tokenizer_argument
    from lmlab.train.checkpoint import run_checkpoint

    if not isinstance(checkpoint, nn.Module):  # a pretraining run: its newest checkpoint, as the CLI reads it
        given = path_argument(checkpoint, "finetune's checkpoint (a directory or a model)")
        checkpoint = run_checkpoint(given)
    train, dev = (data if isinstance(data, (list, tuple)) else path_argument(data, f"finetune's {name}")
                  for data, name in ((train, "train"), (dev, "dev")))
    if out is not None:
        out = path_argument(out, "finetune's out")
    if tokenizer is not None:
        tokenizer_argument(tokenizer, "finetune's tokenizer", path=True)
    if method_options is not None and not isinstance(method_options, dict):
        from lmlab.adapt import METHODS as ADAPT_METHODS
        from lmlab.adapt import options_example

        example = options_example(method) if method in ADAPT_METHODS else '{"rank": 8} with method="lora"'
        raise LmlabError(f"finetune's method_options must be a dict, got {describe(method_options)}",
                         f"pass a dict of option -> value, e.g. {example}")
    if log is not None:
        callable_argument(log, "finetune's log")
    flag_argument(resume, "finetune's resume")
    # the settings' rules (lmlab.config.finetune.RULES, TASK_RULES), named as the caller wrote them
    # (``_names``: the keywords; lmlab finetune's flags): before any work
    cfg = FinetuneConfig.from_dict(hparams, names=_names)
    if isinstance(task, str):
        cfg.check_task(task, hparams, _names)  # --doc-stride with sst2...
        check_fields(task, cfg.fields)  # a --ROLE-field the task would not read: before the model loads
    cfg.check_files([train, dev], _names)  # a CSV delimiter for a .tsv file
    refuse_int8(checkpoint, "fine-tuning")  # before any work (an --lr auto sweep, the output's lock)
    if cfg.loggers and out is None:  # before any work
        raise LmlabError("loggers write beside the fine-tuned model, but there is no output directory",
                         "pass an output directory (--out)")
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    meth = method_class(method)(**(method_options or {}))  # bad method options fail before any work
    check_model_fits(checkpoint, cfg, task, hparams, meth, _names)  # before any work: the config is enough
    if cfg.lr == "auto":
        if dist.launched_world_size() > 1:
            raise LmlabError("--lr auto runs one fine-tuning per rate and cannot run under torchrun",
                             "sweep on one process, then fine-tune with the chosen --lr under torchrun")
        if resume:
            raise LmlabError("--resume cannot continue an --lr auto sweep (each rate is its own run)",
                             "rerun the sweep, or fine-tune with the chosen --lr and --resume that")
        return _lr_sweep(checkpoint, task, train, dev, out, method, method_options, tokenizer, say, hparams,
                         cfg, _names)
    if out is None or not _resumable or rank_of_launch() != 0:
        return _finetune_run(checkpoint, task, train, dev, out, method, method_options, tokenizer, say,
                             resume, _resumable, cfg, meth, _names)
    # one run at a time per output: a second would clear or overwrite the first's resume state and logs
    # (given back when the run ends with nothing there: it finished, or failed before saving a state)
    target = check_replaceable_dir(out, SUMMARY_FILE, "fine-tuned model", resume_state.output_fix(out))
    with resume_state.claimed(target) as rdir, \
            directory_lock(rdir, "fine-tuning output"):
        return _finetune_run(checkpoint, task, train, dev, out, method, method_options, tokenizer, say,
                             resume, _resumable, cfg, meth, _names)


def _finetune_run(checkpoint, task, train, dev, out, method, method_options, tokenizer, say, resume,
                  _resumable, cfg: FinetuneConfig, meth, names: SettingNames = KEYWORDS) -> FinetuneResult:
    out_dir = Path(out) if out is not None else None
    resumable = out_dir is not None and _resumable
    resume_from = None
    if out_dir is not None:
        out_dir = check_replaceable_dir(out_dir, SUMMARY_FILE, "fine-tuned model",  # before any work
                                        resume_state.output_fix(out_dir) if resumable else None)
        if resumable:
            resume_from = resume_state.check_start(out_dir, resume, clear=rank_of_launch() == 0, say=say)
    machine = resolve(cfg.device, cfg.threads, cfg.precision, int(os.environ.get("LOCAL_RANK", "0")),
                      int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    owns_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    info = dist.init(machine.device.type)  # torchrun: every process takes its share of each batch
    if not info.is_main:  # one voice and one writer: rank 0
        say = lambda msg: None  # noqa: E731
    # what the run reads, by content: checked on a resume before any work, saved with every state
    identity = _identity(cfg, task, method, method_options, checkpoint, tokenizer, train, dev, resume_from,
                         say, names) if resumable else None
    torch.manual_seed(cfg.seed)
    run = _build_run(checkpoint, task, train, dev, tokenizer, cfg, meth, machine, info, say, names)
    saved = None if resume_from is None else resume_state.load(resume_from, run.model, run.optimizer,
                                                               len(run.feats))
    baseline = _announce(run, method, say)
    writes = out_dir is not None and info.is_main
    finished = False
    exits = contextlib.ExitStack()  # the stop-signal handlers, while the loop runs
    live = contextlib.ExitStack()  # the live files beside the output, removed when the run ends
    run.log = RunLogger(None, say)
    try:
        log_path, live_logs = _live_files(out_dir, resumable, live) if writes else (None, None)
        loggers = (open_loggers(cfg.loggers, live_logs, resume_after=saved[1]["step"] if saved else None,
                                name=out_dir.name,
                                config={"task": run.task.name, "method": method, **cfg.to_dict()})
                   if cfg.loggers and writes else [])
        run.log = RunLogger(MetricsLog(log_path) if log_path is not None else None, say, loggers=loggers)
        _train(run, saved, say, exits, out_dir if resumable else None, identity)
        trained = list(run.log.history)  # the rows of the training; _finish adds the chosen model's
        metrics, summary, at_baseline = _finish(run, baseline, method, method_options, say)
        run.log.close()
        if writes:
            # the output taken meanwhile: the state at the last step is kept, which --resume turns into
            # the output (the weights saved are the chosen ones, the training is over)
            keep = (lambda: resume_state.save(resume_state.checkpointer(out_dir, None), run, identity,
                                              history=trained)) if resumable else None
            _write_output(out_dir, run, metrics, summary, log_path, live_logs, keep)
            finished = True
        # (an --lr auto arm writes a temporary, renamed or deleted after the sweep: not named)
        say(_done_line(run.total, run.best, metrics, run.select, run.prefix, baseline, run.elapsed(),
                       out_dir if writes and resumable else None))
        dist.barrier(info)  # the other processes return once the output is in place
    finally:  # also when training fails: no open event files, nothing left beside the output
        run.log.close()
        exits.close()
        if resumable and writes and (finished or not resume_state.holds_state(out_dir)):
            # done, or failed before a state worth resuming was written (a non-finite loss at the start);
            # rank 0 alone writes the resume folder, so it alone clears it (another rank clearing it
            # too would race rank 0's clearing, or delete the live files of a run still going)
            resume_state.discard(out_dir)
        live.close()
        if owns_group:
            dist.shutdown(info)
    trainable, total_params = run.parameters()
    return FinetuneResult(metrics, run.model, run.task, out_dir, run.best["step"], run.total, trainable,
                          total_params, run.log.history, None if baseline is None else baseline[1],
                          at_baseline, cfg.select_on, run.best["metrics"])


def _identity(cfg: FinetuneConfig, task, method, method_options, checkpoint, tokenizer, train, dev,
              resume_from: Path | None, say, names: SettingNames = KEYWORDS) -> dict[str, Any]:
    """The run's identity (:meth:`lmlab.train.components.output_resume.ResumeFolder.identity`);
    resuming, the saved state's must be the same (one line naming what differs, before the model
    loads)."""
    inputs = {"checkpoint": checkpoint, "tokenizer": tokenizer, "train": train, "dev": dev}
    return resume_state.FOLDER.identity(cfg.to_dict(), task if isinstance(task, str) else task.name, method,
                                        method_options or {}, inputs, resume_from, say, names)


def _build_run(checkpoint, task, train, dev, tokenizer, cfg: FinetuneConfig, meth, machine, info,
               say, names: SettingNames = KEYWORDS) -> FinetuneRun:
    """Load the model, read the data, put the task head and the method on: the run, before training."""
    model = load_trainable_model(checkpoint, tokenizer)
    if not isinstance(task, Task):
        task = task_for_model(task, model, cfg, method_positions(meth, model.config))
    bad = BadLines(cfg.on_bad_line, say, cfg.max_bad_fraction)
    train_ex = limit(read_examples(task, train, "train", bad), cfg.max_train_examples)
    task.fit(train_ex)  # the label set, before dev is read: a dev file's header is told from its labels
    dev_ex = limit(read_examples(task, dev, "dev", bad), cfg.max_eval_examples)
    task.check(dev_ex, "dev")
    cfg.check_select_metric(task.metric_names(dev_ex), task.name, names)  # before any step, named as written
    train_ex, choose_ex = selection_data(train_ex, dev_ex, cfg)
    model = task.prepare_model(model)
    model = meth.apply(model, task).to(machine.device)
    return FinetuneRun(cfg, task, model, meth, RunData(train_ex, choose_ex, dev_ex), machine, info, say,
                       names)


def _announce(run: FinetuneRun, method: str, say: Callable[[str], None]):
    """The plan line and the trivial baseline (returned: ``(answer, dev metrics)`` or None)."""
    cfg, machine, data = run.cfg, run.machine, run.data
    trainable, total_params = run.parameters()
    chooser = "dev" if cfg.select_on == "dev" else f"a {len(data.choose)}-example slice of train (held out)"
    precision = "bf16 autocast" if machine.dtype is not None else "fp32"
    say(f"finetune: task {run.task.name} ({type(run.task).__name__}), method {method}, {len(data.train)} "
        f"train / {len(data.dev)} dev examples, the best step chosen on {chooser}, "
        f"{_planned_steps(cfg, run.total, run.steps_per_epoch)}, device {machine.device} "
        f"({precision}, {machine.threads} thread(s)), trainable "
        f"parameters {trainable:,} of {total_params:,} ({100 * trainable / max(1, total_params):.2f}%)")
    baseline = trivial_baseline(run.task, data.dev, data.train)
    if baseline is not None:
        say(baseline_text(baseline))
    # what the scores that choose are compared with (on the slice: the same answer scored there)
    run.choose_baseline = baseline if data.choose is data.dev else trivial_baseline(run.task, data.choose,
                                                                                     data.train)
    return baseline


def _live_files(out_dir: Path, resumable: bool, live: contextlib.ExitStack) -> tuple[Path, Path]:
    """``(metrics log, loggers' folder)`` beside the output while the run goes (in the resume folder
    when the run can be resumed, so a resumed run continues them; else in the output's live folder,
    :func:`lmlab.ownership.live_dir`, removed when ``live`` closes, or at the next start if this run
    is killed); they move into the output at the end."""
    if resumable:
        rdir = resume_state.resume_dir(out_dir)
        rdir.mkdir(exist_ok=True)
        log_path, live_logs = rdir / METRICS_FILE, rdir / resume_state.LOGS
    else:
        folder = live.enter_context(ownership.live_dir(out_dir, "fine-tuning logs"))
        log_path, live_logs = folder / METRICS_FILE, folder / resume_state.LOGS
    atomic_write_text(log_path, "")  # in the resume folder: stamped as lmlab's (ownership.record_file)
    return log_path, live_logs


def _train(run: FinetuneRun, saved, say, exits: contextlib.ExitStack, resume_out: Path | None,
           identity: dict[str, Any]) -> None:
    """From the start (or the saved state) to the last step, through the fit loop; with ``resume_out``
    (the run can be resumed) the state is saved there and a stop signal ends the run after its step."""
    cfg, log = run.cfg, run.log
    log.progress = Progress(run.total, desc=f"finetune {run.task.name}", log=say,
                            show="auto" if cfg.progress and run.info.is_main else "off")
    run.model.train()
    if saved is not None:  # continue the interrupted run where its state was saved
        run.restore(*saved)
        log.history.extend(saved[1]["finetune"]["history"])
        if log.metrics is not None:
            atomic_write_text(log.metrics.path, "".join(json.dumps(r) + "\n" for r in log.history))
        say(f"resumed at step {run.step} of {run.total} (best {run.prefix} {run.select} so far "
            f"{run.best['score']:.4f}, step {run.best['step']})")
        log.progress.update(run.step, [])
    log.estimate = Estimate(run.total, run.step, say=say,
                            note=_evaluations_note(cfg, run.total, run.steps_per_epoch, len(run.data.choose)),
                            hint=lambda rate: _shorter_run_hint(rate, cfg))
    saver = resume_state.checkpointer(resume_out, cfg.save_every) if resume_out is not None else None
    stop = exits.enter_context(StopRequests()) if resume_out is not None else None

    def stopped(requested: str, step: int) -> str:
        log.close_progress()
        return f"{RESUME} (its state at step {step} is saved)"  # the fix of the stop's one line

    def save(step: int) -> None:
        if run.info.is_main:  # one writer
            resume_state.save(saver, run, identity)

    loop = run.fit_loop(stop=(lambda: run.stop_requested(stop)) if stop is not None else None,
                        on_stop=stopped, checkpointer=saver, save=save)
    loop.run(run.step)
    exits.close()
    log.close_progress()


def _finish(run: FinetuneRun, baseline, method: str, method_options, say) -> tuple[dict, dict, bool]:
    """The chosen weights back in the model, scored on dev when the slice chose them; the summary."""
    cfg, data, select = run.cfg, run.data, run.select
    run.meth.restore(run.model, run.best["snap"])
    run.model.eval()
    metrics = run.best["metrics"]
    if data.choose is not data.dev:  # the dev file's first and only use: scoring the chosen model
        with run.machine.autocast():
            metrics = run.task.evaluate(run.model, data.dev, cfg.eval_batch_size)
        run.log.record({"step": run.total, "epoch": round(run.seen / len(run.feats), 3),
                        "chosen_step": run.best["step"], **{f"dev_{k}": v for k, v in metrics.items()}})
        say(f"the step chosen on the slice ({run.best['step']}) scores on dev: "
            + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    flagged = at_baseline_text(metrics, baseline, select)
    at_baseline = flagged is not None
    if at_baseline:
        say(f"warning: the best dev {flagged}: the model learned nothing "
            f"usable; try another learning rate (--lr auto picks one on {cfg.select_on}), more steps, or "
            "check the labels")
    trainable, total_params = run.parameters()
    summary = {"task": run.task.name, "method": method, "method_options": method_options or {},
               "best_step": run.best["step"], "steps": run.total, "select_metric": select, "dev": metrics,
               "baseline": None if baseline is None else {"answer": baseline[0], "dev": baseline[1]},
               "at_baseline": at_baseline,
               "selection": selection_record(cfg.select_on, cfg.select_fraction, len(data.choose), select,
                                             run.best["metrics"]),
               "trainable_parameters": trainable, "total_parameters": total_params,
               "train_examples": len(data.train), "dev_examples": len(data.dev),
               "elapsed_s": run.elapsed(), "config": cfg.to_dict(), "machine": run.machine.record()}
    return metrics, summary, at_baseline


def _write_output(out_dir: Path, run: FinetuneRun, metrics: dict, summary: dict, log_path: Path,
                  live_logs: Path, keep: Callable[[], Any] | None) -> None:
    """``out`` in one rename: the chosen model, task.json, eval.json, finetune.json, the logs.

    With ``keep`` (the run can be resumed: it saves the run's state) an ``out`` taken by something
    else (made while the run trained) keeps the work: the state at the last step is saved in the
    resume folder, the logs stay there, and the one line says to move the other thing away and run
    again with ``--resume``, which then only writes the output (another ``--out`` would start over)."""
    rows = log_path.read_text(encoding="utf-8")
    fix = None if keep is None else resume_state.output_fix(out_dir, kept=True)
    try:
        with atomic_dir(out_dir, marker=SUMMARY_FILE, what="fine-tuned model", fix=fix) as tmp:
            run.meth.save(run.model, tmp, run.model.tokenizer)
            write_json(tmp / TASK_FILE, run.task.state())
            write_json(tmp / EVAL_FILE, metrics)
            write_json(tmp / SUMMARY_FILE, summary)
            (tmp / METRICS_FILE).write_text(rows, encoding="utf-8")
            for folder in logger_dirs(run.cfg.loggers):  # copied: they stay for a resume if the rename fails
                shutil.copytree(live_logs / folder, tmp / folder, symlinks=True)
    except LmlabError:
        if keep is not None:
            with contextlib.suppress(LmlabError, OSError):  # else the newest earlier state stays
                keep()
        raise
    log_path.unlink(missing_ok=True)


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
    score += baseline_note(baseline, select)
    where = f"; saved to {saved_to}" if saved_to is not None else ""
    return f"finetune done in {duration(elapsed)} ({total:,} steps): {score}{where}"


def _check_sweep_inputs(checkpoint, train, dev) -> None:
    """What every run of a sweep reads by name: the starting model and the data files."""
    from lmlab.interop import check_model_dir

    if isinstance(checkpoint, (str, os.PathLike)):
        check_model_dir(checkpoint)
    for data in (train, dev):
        if isinstance(data, (str, os.PathLike)):
            check_input_file(data)


def _lr_sweep(checkpoint, task, train, dev, out, method, method_options, tokenizer, say, hparams,
              cfg: FinetuneConfig, names: SettingNames = KEYWORDS) -> FinetuneResult:
    """``lr = "auto"``: one full fine-tuning run per rate of ``cfg.lr_sweep`` (each written to a
    temporary sibling of ``out``), the best on the selection data kept (``select_on``: the dev file,
    or the validation slice of train, the same slice for every rate; ties: the smaller rate) and
    renamed into ``out``; the others are deleted. Every arm of a comparison gets the same sweep."""
    target = None if out is None else check_replaceable_dir(out, SUMMARY_FILE, "fine-tuned model")
    _check_sweep_inputs(checkpoint, train, dev)  # a missing input is one line, before any run starts
    # the folders made for ``out`` go again if the sweep fails (ownership.parents_made)
    parents = contextlib.nullcontext() if target is None else ownership.parents_made(target)
    with parents:
        return _sweep(target, checkpoint, task, train, dev, method, method_options, tokenizer, say, hparams,
                      cfg, names)


def _sweep(target, checkpoint, task, train, dev, method, method_options, tokenizer, say, hparams,
           cfg: FinetuneConfig, names: SettingNames = KEYWORDS) -> FinetuneResult:
    """:func:`_lr_sweep`'s runs, in the folder made for ``target`` (its parent exists)."""
    runs: list[tuple[float, FinetuneResult, Path | None]] = []
    tmp = None
    try:
        for i, lr in enumerate(cfg.lr_sweep):
            say(f"lr auto: run {i + 1}/{len(cfg.lr_sweep)}, lr {lr:g}")
            # a marked temporary: if the sweep is killed, the next run into ``out`` removes it
            tmp = None if target is None else ownership.make_temporary(target.parent, target.name,
                                                                         "fine-tuned model", f"lr-{lr:g}-")
            start = checkpoint if isinstance(checkpoint, (str, os.PathLike)) else copy.deepcopy(checkpoint)
            one = {k: v for k, v in hparams.items() if k != "lr_sweep"}  # one rate: no sweep
            res = finetune(start, task, train, dev, tmp, method, method_options, tokenizer=tokenizer, log=say,
                           _resumable=False, _names=names, **{**one, "lr": lr})
            runs.append((lr, res, tmp))
            tmp = None
        select = cfg.select_metric or runs[0][1].task.main_metric
        best_lr, best, best_dir = max(runs, key=lambda r: (r[1].selection[select], -r[0]))
        scores = {f"{lr:g}": r.selection[select] for lr, r, _ in runs}
        shown = ", ".join(f"{k} -> {v:.4f}" for k, v in scores.items())
        where = "" if target is None else f"; saved to {target}"
        say(f"lr auto: {ROW_PREFIX[cfg.select_on]} {select} {shown}; keeping lr {best_lr:g}{where}")
        if target is not None:
            summary = read_json(best_dir / SUMMARY_FILE, "fine-tuning summary")
            summary["lr_sweep"] = {"select_metric": select, "selected_on": cfg.select_on, "scores": scores,
                                   "chosen": best_lr}
            write_json(best_dir / SUMMARY_FILE, summary)
            ownership.seal(best_dir, "fine-tuned model")
            replace_dir(best_dir, target, "fine-tuned model")
            best.out = target
        return best
    finally:  # every rate's folder goes, the one of a run that failed too (this process made them)
        for d in [d for _, _, d in runs] + [tmp]:
            if d is not None and d.exists():
                ownership.remove_temporary(d)  # its marker last: a kill leaves a provable leftover
        if target is not None:  # the arms never run (a failure before the first)
            ownership.remove_leftovers(target.parent, target.name)


