"""The DPO loop, and the pieces every preference-tuning method shares (:class:`Setup`,
:class:`PairSet`, the frozen reference). :func:`lmlab.align.align` runs it for ``method="dpo"``.

One run of DPO (:mod:`lmlab.align.dpo`; :mod:`lmlab.align.rlhf` is the other method):

1. load the checkpoint (a decoder or encoder-decoder with its LM head) and read the preference
   pairs (:mod:`lmlab.align.pairs`); tokenise every pair once (:mod:`lmlab.align.logprobs`);
2. keep a frozen copy of the starting model as the reference ``π_ref`` (eval mode, no gradients);
   its log-probabilities of a pair never change, so they are computed once per pair: the dev set's
   before training, a training pair's the first time a batch holds it;
3. each step: ``grad_accum`` micro-batches of ``batch_size`` pairs, chosen and rejected responses
   in one forward pass, the DPO loss, through the one fit loop (:class:`lmlab.train.components.FitLoop`)
   and its engine (:class:`lmlab.train.engine.Engine`: AdamW, linear warmup then linear decay,
   gradient clipping, the non-finite guard);
4. evaluate on the dev pairs at step 0 (margin 0, win rate 0, loss log 2: the starting point), every
   ``eval_every`` steps and at the end: loss, rewards, margin, win rate, accuracy;
5. write ``out`` atomically: the policy (``load_model``-able, with its tokenizer), ``eval.json``
   (the final dev numbers), ``metrics.jsonl`` (training and dev rows) and ``align.json`` (the run).

While a DPO run writes ``out`` it keeps a resume state beside it, in ``.OUT.resume/`` (after each
evaluation, every ``save_every`` steps, and when it is asked to stop: Ctrl-C, SIGTERM), in the one
resume format and folder fine-tuning keeps (:mod:`lmlab.train.components.output_resume`): the
policy, AdamW's moments, the global RNG and the batch order's generator (``rng.order``), the
reference's log-probabilities of the training pairs met so far (``align.train_ref``), and under
``align`` in ``train_state.json`` the run's identity, the batches left in the epoch, the running
sums of the next training row and the metrics rows. ``align(..., resume=True)`` (``--resume``)
continues from it exactly; the result equals the uninterrupted run's.

The policy runs with dropout off by default (``dropout=False``), as TRL does, so that policy and
reference differ only in their weights.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmlab import ownership
from lmlab.align.config import AlignConfig
from lmlab.align.dpo import dpo_loss, preference_metrics
from lmlab.align.logprobs import check_generative, encode_response, pair_rows, response_logprobs
from lmlab.align.pairs import PreferencePair, read_preferences
from lmlab.config.fits import batch_for_data, check_global_batch
from lmlab.errors import LmlabError
from lmlab.fileio import (
    atomic_dir,
    atomic_write_text,
    check_replaceable_dir,
    directory_lock,
    remove_leftovers,
    write_json,
)
from lmlab.finetune.loop import epoch_batches, load_trainable_model
from lmlab.loading import model_facts
from lmlab.models.config import max_length_for
from lmlab.progress import Progress
from lmlab.runtime import Machine, resolve
from lmlab.stopping import RESUME, StopRequests
from lmlab.tasks import collate
from lmlab.tasks.base import pad_id_of
from lmlab.tasks.readers import BadLines, limit
from lmlab.train.components import Evaluator, FitLoop
from lmlab.train.components import output_resume as resumes
from lmlab.train.components.checkpointer import restore_optimizer
from lmlab.train.components.resume_state import ResumeState, random_streams, restore_random_streams
from lmlab.train.engine import Engine
from lmlab.train.metrics import MetricsLog
from lmlab.train.optim import adamw, warmup_decay_lr

SUMMARY_FILE = "align.json"
EVAL_FILE = "eval.json"
METRICS_FILE = "metrics.jsonl"
#: preference tuning's resume folder (``.OUT.resume/``): its loop state under ``align``
RESUME_FOLDER = resumes.ResumeFolder("align", "alignment")
#: the methods whose runs save a resume state (RLHF's three phases, reward model and sampler do not)
RESUMABLE = ("dpo",)


@dataclass
class AlignResult:
    metrics: dict[str, float]                 # the final dev numbers (= eval.json)
    start: dict[str, float]                   # the dev numbers at step 0
    model: nn.Module                          # the tuned policy
    out: Path | None
    steps: int
    history: list[dict[str, Any]] = field(default_factory=list)
    reference: nn.Module | None = None        # the frozen starting model
    extra: dict[str, Any] = field(default_factory=dict)   # method-specific results (RLHF's reward model)


# --------------------------------------------------------------------------- pieces


def frozen_reference(model: nn.Module) -> nn.Module:
    """A copy of ``model`` that never trains: eval mode, no gradients."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class PairSet:
    """Tokenised preference pairs, batched on ``device``: chosen rows first, then rejected rows."""

    def __init__(self, pairs: Sequence[PreferencePair], model: nn.Module, cfg: AlignConfig):
        tok = model.tokenizer
        self.pairs = list(pairs)
        self.rows = [(encode_response(tok, model, p.prompt, p.chosen, cfg.max_length, cfg.eos),
                      encode_response(tok, model, p.prompt, p.rejected, cfg.max_length, cfg.eos))
                     for p in self.pairs]
        self.pad = pad_id_of(tok, model)
        self.device = next(model.parameters()).device

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> list[int]:
        return [max(len(c["input_ids"]), len(r["input_ids"])) for c, r in self.rows]

    def logprobs(self, model: nn.Module, idx: Sequence[int]) -> tuple[Tensor, Tensor]:
        """``log π(chosen|prompt)`` and ``log π(rejected|prompt)`` of pairs ``idx``, ``[len(idx)]`` each."""
        batch = collate(pair_rows([self.rows[i] for i in idx]), self.pad, self.device)
        both = response_logprobs(model, batch)
        return both[: len(idx)], both[len(idx):]

    @torch.no_grad()
    def all_logprobs(self, model: nn.Module, batch_size: int, autocast=None) -> Tensor:
        """``[N, 2]`` (chosen, rejected) log-probabilities of every pair, in eval mode."""
        was = model.training
        model.eval()
        out = []
        try:
            for k in range(0, len(self), batch_size):
                with (autocast() if autocast else contextlib.nullcontext()):
                    c, r = self.logprobs(model, range(k, min(k + batch_size, len(self))))
                out.append(torch.stack([c, r], 1).float())
        finally:
            model.train(was)
        return torch.cat(out)


def dev_numbers(policy_lp: Tensor, ref_lp: Tensor, cfg: AlignConfig) -> dict[str, float]:
    """The DPO loss and :func:`preference_metrics` over whole ``[N, 2]`` log-probability tables."""
    args = (policy_lp[:, 0], policy_lp[:, 1], ref_lp[:, 0], ref_lp[:, 1])
    loss = dpo_loss(*args, beta=cfg.beta, loss=cfg.loss, label_smoothing=cfg.label_smoothing)
    return {"loss": float(loss), **preference_metrics(*args, beta=cfg.beta)}


def load_policy(checkpoint, tokenizer=None) -> nn.Module:
    """The starting model (a directory or a model), as fine-tuning opens it, if it writes text."""
    if isinstance(checkpoint, nn.Module):
        check_generative(checkpoint)           # before fine-tuning's more general complaint
    model = load_trainable_model(checkpoint, tokenizer, "preference tuning")
    check_generative(model)
    return model


def read_pairs(data, what: str, bad: BadLines, task: str | None = None) -> list[PreferencePair]:
    """Pairs from a JSON Lines file, from a labelled ``task`` file (:mod:`lmlab.align.from_task`),
    or given as a list."""
    if isinstance(data, (str, os.PathLike)):
        if task is not None:
            from lmlab.align.from_task import task_pairs

            return task_pairs(task, data, bad)
        return read_preferences(data, bad)
    if isinstance(data, Sequence) and data and all(isinstance(p, PreferencePair) for p in data):
        return list(data)
    raise LmlabError(f"{what} must be a JSON Lines file or a non-empty list of PreferencePairs",
                     'pass e.g. prefs/train.jsonl with {"prompt", "chosen", "rejected"} per line')


class BatchOrder:
    """The micro-batches of each step: ``grad_accum`` lists of item indices, every epoch visiting the
    items in a new seeded order (``gen``), in batches of similar lengths; ``order`` holds the
    epoch's batches left, last first (saved and restored by a resume, with ``gen``'s state)."""

    def __init__(self, lengths: list[int], batch_size: int, grad_accum: int, seed: int):
        self.lengths, self.batch_size, self.grad_accum = lengths, batch_size, grad_accum
        self.gen = torch.Generator().manual_seed(seed)
        self.order: list[list[int]] = []

    def __call__(self) -> list[list[int]]:
        out = []
        for _ in range(self.grad_accum):
            if not self.order:
                self.order.extend(epoch_batches(self.lengths, self.batch_size, self.gen)[::-1])
            out.append(self.order.pop())
        return out


@dataclass
class Setup:
    """What every method starts from."""

    cfg: AlignConfig
    model: nn.Module
    train: list[PreferencePair]
    dev: list[PreferencePair]
    machine: Machine
    out: Path | None
    log: MetricsLog | None
    say: Callable[[str], None]
    #: closing it removes the live files beside ``out`` (lmlab.ownership.live_dir): the run's end
    live: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    history: list[dict[str, Any]] = field(default_factory=list)
    sums: dict[str, float] = field(default_factory=dict)      # training numbers since the last row
    t0: float = field(default_factory=time.perf_counter)
    #: the run can be resumed (it writes ``out`` with a resumable method): its identity, saved with
    #: every state; ``resume_from``, the checkpoint of the interrupted run it continues
    identity: dict[str, Any] | None = None
    resume_from: Path | None = None
    finished: bool = False

    def record(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        if self.log is not None:
            self.log.append(row)

    def log_train(self, step: int, total: int, done, **tags) -> None:
        """Add step ``step``'s (1-based) loss and metrics; every ``log_every`` steps and at ``total``,
        record their means as one training row (with ``tags``, e.g. the phase)."""
        for k, v in {"loss": done.loss, **done.metrics}.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.sums["_n"] = self.sums.get("_n", 0) + 1
        if step % self.cfg.log_every == 0 or step == total:
            n = self.sums.pop("_n")
            means = {k: v / n for k, v in self.sums.items() if k != "ref_accuracy"}
            self.record({**tags, "step": step, "lr": done.lr, "grad_norm": done.grad_norm, **means,
                         "elapsed_s": time.perf_counter() - self.t0})
            self.sums.clear()

    def total_steps(self, n_items: int) -> int:
        cfg = self.cfg
        per_epoch = math.ceil(n_items / (cfg.batch_size * cfg.grad_accum))
        return cfg.max_steps if cfg.max_steps is not None else cfg.epochs * per_epoch

    def engine(self, modules: Sequence[nn.Module], lr: float, total: int) -> Engine:
        cfg = self.cfg
        opt = adamw(modules, lr=lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        warmup = round(cfg.warmup_ratio * total)
        return Engine(opt, lambda s: warmup_decay_lr(s, lr=lr, warmup=warmup, end=total), clip=cfg.grad_clip,
                      autocast=self.machine.autocast, fix="lower the learning rate (--lr)")

    def batch_order(self, lengths: list[int]) -> BatchOrder:
        """A function giving the ``grad_accum`` micro-batches (lists of item indices) of the next
        step: every epoch visits the items in a new seeded order, in batches of similar lengths."""
        return BatchOrder(lengths, self.cfg.batch_size, self.cfg.grad_accum, self.cfg.seed)

    def eval_points(self, total: int) -> set[int]:
        every = self.cfg.eval_every or max(1, total // 10)
        return {s for s in range(every, total + 1, every)} | {total}

    def progress(self, total: int, desc: str) -> Progress:
        return Progress(total, desc=desc, show="auto" if self.cfg.progress else "off", log=self.say)

    def fit(self, engine: Engine, total: int, micro_batches: Callable[[int], list], after_step: Callable,
            evaluate: Callable[[int], dict] | None = None, start: int = 0,
            save: Callable[[int], None] | None = None) -> None:
        """``total`` steps of ``engine`` through the one fit loop, from ``start``; ``micro_batches(step)``
        gives what the engine runs, ``after_step(step, done, seconds)`` the bookkeeping,
        ``evaluate(step)`` the dev numbers at :meth:`eval_points`. With ``save(step)`` (the run can be
        resumed) the resume state is saved after each evaluation (or every ``save_every`` steps)
        and a stop signal (Ctrl-C, SIGTERM) ends the run after its step, its state saved."""
        evals = self.eval_points(total)
        evaluator = None if evaluate is None else Evaluator(evaluate, at_end=False, also=lambda s: s in evals)
        resumable = {}
        with contextlib.ExitStack() as stack:
            if save is not None:
                stop = stack.enter_context(StopRequests())
                resumable = dict(checkpointer=RESUME_FOLDER.checkpointer(self.out, self.cfg.save_every),
                                 save=save, stop=lambda: stop.requested,
                                 on_stop=lambda requested, step: f"{RESUME} (its state at step {step} is "
                                                                 "saved)")
            FitLoop(engine, total, micro_batches=micro_batches, after_step=after_step, report=lambda *_: None,
                    evaluator=evaluator, **resumable).run(start)

    def run_steps(self, engine: Engine, total: int, micro_batch: Callable, lengths: list[int], desc: str,
                  phase: str) -> None:
        """``total`` engine steps over batches of similar lengths (:meth:`batch_order`), with a
        progress display and training rows tagged ``phase``; ``micro_batch(indices)`` gives the
        function the engine runs for one micro-batch."""
        next_batches = self.batch_order(lengths)
        progress = self.progress(total, desc)

        def after_step(step: int, done, seconds: float) -> dict:
            progress.update(step, [f"loss {done.loss:.4f}"], loss=f"{done.loss:.4f}")
            self.log_train(step, total, done, phase=phase)
            return {}

        self.fit(engine, total, lambda step: [micro_batch(idx) for idx in next_batches()], after_step)
        progress.close()

    def write(self, model: nn.Module, metrics: dict[str, Any], summary: dict[str, Any],
              extra: Callable[[Path], None] | None = None, keep: Callable[[], Any] | None = None) -> None:
        """Write the output directory in one rename (nothing when there is no ``out``). With ``keep``
        (the run can be resumed: it saves the state at the last step) an ``out`` taken by something
        else meanwhile keeps the work in the resume folder, and the one line says to move the other
        thing away and ``--resume`` (which then only writes the output)."""
        if self.out is None:
            return
        from lmlab.models import save_checkpoint

        rows = self.log.path.read_text(encoding="utf-8")
        fix = None if keep is None else resumes.output_fix(self.out, kept=True)
        try:
            with atomic_dir(self.out, marker=SUMMARY_FILE, what="aligned model", fix=fix) as tmp:
                save_checkpoint(model, tmp, tokenizer=model.tokenizer)
                write_json(tmp / EVAL_FILE, metrics)
                write_json(tmp / SUMMARY_FILE, {**summary, "machine": self.machine.record()})
                (tmp / METRICS_FILE).write_text(rows, encoding="utf-8")
                if extra is not None:
                    extra(tmp)
        except LmlabError:
            if keep is not None:
                with contextlib.suppress(LmlabError, OSError):  # else the newest earlier state stays
                    keep()
            raise
        self.log.path.unlink(missing_ok=True)
        self.finished = True
        self.say(f"saved the aligned model to {self.out}")


def setup(checkpoint, train, dev, out, hparams: dict[str, Any], tokenizer, log,
          check: Callable[[Any, AlignConfig, Any], None] | None = None, resume: bool = False) -> Setup:
    """Everything a run needs, each input checked before the model loads: ``check(facts, cfg,
    device)`` is the method's own check of the checkpoint's facts (its sizes, its kind). ``resume``:
    continue the interrupted run that was writing ``out`` (checked to be that run before any work).
    Closing the setup's ``live`` stack ends the run's hold on ``out`` and its resume folder."""
    cfg = AlignConfig.from_dict(hparams)
    check_resume(resume, out, cfg.method)
    facts = model_facts(checkpoint)  # the kind of model and its positions, before any data or weight is read
    if facts is not None:
        check_generative(facts)
        # a max_length given beyond the positions is refused; the default is cut down to them
        cfg.max_length = max_length_for(facts.config, hparams.get("max_length"), cfg.max_length)
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    resumable = out is not None and cfg.method in RESUMABLE
    out_dir = None if out is None else check_replaceable_dir(out, SUMMARY_FILE, "aligned model",
                                                             resumes.output_fix(out))
    live = contextlib.ExitStack()
    try:
        return _setup(checkpoint, train, dev, out_dir, cfg, facts, tokenizer, say, check, resume,
                      resumable, live)
    except BaseException:
        live.close()
        raise


def check_resume(resume, out, method: str) -> None:
    """``resume`` is a flag that continues a run writing ``out`` with a method that saves its state."""
    from lmlab.arguments import flag_argument

    flag_argument(resume, "align's resume")
    if resume and out is None:
        raise LmlabError("--resume continues the interrupted run that was writing --out, but there is no "
                         "output directory", "pass the run's output directory (--out)")
    if resume and method not in RESUMABLE:
        raise LmlabError(f"--resume cannot continue a --method {method} run (its reward model, reference and "
                         "sampling state are not saved)", "run it again from the start without --resume")


def _identity(cfg: AlignConfig, checkpoint, tokenizer, train, dev, resume_from: Path | None,
              say) -> dict[str, Any]:
    """The run's identity (:meth:`lmlab.train.components.output_resume.ResumeFolder.identity`): its settings,
    and its inputs by content; resuming, the saved state's must be the same (one line naming what
    differs, before the model loads)."""
    from lmlab.train.checkpoint import run_checkpoint

    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = run_checkpoint(checkpoint)  # a pretraining run: the checkpoint it means
    inputs = {"checkpoint": checkpoint, "tokenizer": tokenizer, "train": train, "dev": dev}
    return RESUME_FOLDER.identity(cfg.to_dict(), cfg.task, cfg.method, {}, inputs, resume_from, say)


def _setup(checkpoint, train, dev, out_dir: Path | None, cfg: AlignConfig, facts, tokenizer, say,
           check, resume: bool, resumable: bool, live: contextlib.ExitStack) -> Setup:
    resume_from = identity = None
    if out_dir is not None:
        if resumable:  # one run at a time per output: a second would clear the first's resume state
            rdir = live.enter_context(RESUME_FOLDER.claimed(out_dir))
            live.enter_context(directory_lock(rdir, "alignment output"))
            remove_leftovers(out_dir.parent, out_dir.name, only_dead=True)  # what killed runs left beside it
            out_dir = check_replaceable_dir(out_dir, SUMMARY_FILE, "aligned model",
                                            resumes.output_fix(out_dir))
            resume_from = RESUME_FOLDER.check_start(out_dir, resume, say=say)
            identity = _identity(cfg, checkpoint, tokenizer, train, dev, resume_from, say)
        else:  # a run that saves no state still never starts over an interrupted one in silence
            RESUME_FOLDER.check_start(out_dir, False, clear=False, say=say, resumable=False)
    machine = resolve(cfg.device, cfg.threads, cfg.precision)
    device = machine.device
    if facts is not None and check is not None:
        check(facts, cfg, device)
    torch.manual_seed(cfg.seed)
    bad = BadLines(cfg.on_bad_line, say)
    train_pairs = limit(read_pairs(train, "train", bad, cfg.task), cfg.max_train_examples)
    dev_pairs = limit(read_pairs(dev, "dev", bad, cfg.task), cfg.max_eval_examples)
    # a step's batch larger than the training pairs (RLHF: prompts), refused before the model loads
    # (DPO cuts each epoch into -(-pairs // batch_size) batches, the last one short: a step repeats
    # pairs only when it takes more micro-batches than that; RLHF draws batch_size prompts a batch)
    flags = ("--batch-size", "--grad-accum")
    if cfg.method == "rlhf":
        check_global_batch(cfg.batch_size, cfg.grad_accum, 1, len({p.prompt for p in train_pairs}), "prompts",
                           flags)
    elif cfg.grad_accum > -(-len(train_pairs) // cfg.batch_size):
        check_global_batch(cfg.batch_size, cfg.grad_accum, 1, len(train_pairs), "pairs", flags)
    model = load_policy(checkpoint, tokenizer).to(device)
    if cfg.method != "rlhf":  # one batch a step: a batch beyond the pairs is all of them, every count says so
        # (said once the model has loaded: a refusal of the checkpoint is the command's one line)
        cfg.batch_size = batch_for_data(cfg.batch_size, len(train_pairs), "pairs", flags[0], say)
    metrics_log = None
    if out_dir is not None and resumable:  # in the resume folder: a resumed run continues it
        metrics_log = MetricsLog(resumes.resume_dir(out_dir) / METRICS_FILE)
        atomic_write_text(metrics_log.path, "")  # stamped as lmlab's (ownership.record_file)
    elif out_dir is not None:  # the live log sits beside the output (tail it); it moves inside at the end
        folder = live.enter_context(ownership.live_dir(out_dir, "alignment log"))
        metrics_log = MetricsLog(folder / METRICS_FILE)
        metrics_log.path.write_text("", encoding="utf-8")
    run = Setup(cfg, model, train_pairs, dev_pairs, machine, out_dir, metrics_log, say, live,
                identity=identity, resume_from=resume_from)
    if resumable:
        # done, or failed before a state worth resuming was written: what lmlab wrote there goes
        # (then the claim given back removes the folder); else the state stays for --resume
        live.callback(lambda: (run.finished or not resumes.holds_state(out_dir)) and
                      RESUME_FOLDER.discard(out_dir))
    return run


def shown(numbers: dict[str, float], keys: Sequence[str]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {numbers[k]:.4f}" for k in keys if k in numbers)


DEV_SHOWN = ("loss", "margin", "win_rate", "accuracy")


# --------------------------------------------------------------------------- DPO


class DpoSteps:
    """What the fit loop runs for DPO: the micro-batches (the reference's log-probabilities of a
    training pair computed the first time a batch holds it), the bookkeeping, the dev evaluation."""

    def __init__(self, run: Setup, reference: nn.Module, train_set: PairSet, dev_set: PairSet, total: int):
        self.run, self.reference, self.total = run, reference, total
        self.train_set, self.dev_set = train_set, dev_set
        self.train_ref = torch.full((len(train_set), 2), math.nan)
        self.dev_ref = dev_set.all_logprobs(reference, run.cfg.eval_batch_size, run.machine.autocast)
        self.start = self.final = dev_numbers(self.dev_ref, self.dev_ref, run.cfg)
        self.next_batches = run.batch_order(train_set.lengths())
        self.progress = None
        self.step, self.seen = 0, 0  # steps taken, pairs trained on

    def loss(self, idx: list[int]):
        """The DPO loss and metrics of the pairs ``idx`` (run by the engine, under autocast)."""
        cfg, train_set = self.run.cfg, self.train_set
        missing = [i for i in idx if math.isnan(self.train_ref[i, 0])]
        if missing:
            with torch.no_grad():
                c, r = train_set.logprobs(self.reference, missing)
            self.train_ref[missing] = torch.stack([c, r], 1).float().cpu()
        pc, pr = train_set.logprobs(self.run.model, idx)
        ref = self.train_ref[idx].to(pc.device)
        loss = dpo_loss(pc, pr, ref[:, 0], ref[:, 1], cfg.beta, cfg.loss, cfg.label_smoothing)
        return loss, preference_metrics(pc, pr, ref[:, 0], ref[:, 1], cfg.beta)

    def micro_batches(self, step: int) -> list:
        batches = self.next_batches()
        self.seen += sum(len(idx) for idx in batches)
        return [lambda idx=idx: self.loss(idx) for idx in batches]

    def after_step(self, step: int, done, seconds: float) -> dict:
        self.step = step
        self.progress.update(step, [f"loss {done.loss:.4f}", f"margin {done.metrics['margin']:.4f}"],
                             loss=f"{done.loss:.4f}", margin=f"{done.metrics['margin']:.3f}")
        self.run.log_train(step, self.total, done)
        return {}

    def evaluate(self, step: int) -> dict[str, float]:
        run = self.run
        policy = self.dev_set.all_logprobs(run.model, run.cfg.eval_batch_size, run.machine.autocast)
        self.final = dev_numbers(policy, self.dev_ref, run.cfg)
        run.record({"step": step, **{f"dev_{k}": v for k, v in self.final.items()}})
        self.progress.write(f"step {step}: dev {shown(self.final, DEV_SHOWN)}")
        run.model.train(run.cfg.dropout)
        return self.final

    # ------------------------------------------------------------------ resume
    def save(self, optimizer: torch.optim.Optimizer) -> Path:
        """Checkpoint the run at its step in its resume folder (``.OUT.resume/``)."""
        run = self.run
        tensors = {**random_streams({"order": self.next_batches.gen}),
                   "align.train_ref": self.train_ref.clone()}
        loop = {"identity": run.identity, "order": self.next_batches.order, "sums": run.sums,
                "final": self.final, "history": run.history}
        return RESUME_FOLDER.save(RESUME_FOLDER.checkpointer(run.out, run.cfg.save_every),
                                  ResumeState(self.step, self.seen, 0, time.perf_counter() - run.t0),
                                  model=run.model, optimizer=optimizer, epoch=self.seen / len(self.train_set),
                                  config=run.cfg.to_dict(), machine=run.machine, tensors=tensors, loop=loop)

    def restore(self, path: Path, optimizer: torch.optim.Optimizer) -> None:
        """Continue where the state saved in ``path`` left the run, after checking it fits."""
        run = self.run
        tensors, meta, weights = RESUME_FOLDER.read(path)
        resumes.check_fits(path, tensors, meta, weights, run.model, optimizer, ("order",))
        state = meta["align"]
        resumes.check_order(path, state["order"], len(self.train_set), "align.order", "training pairs")
        ref = tensors.get("align.train_ref")
        if ref is None or tuple(ref.shape) != tuple(self.train_ref.shape):
            raise LmlabError(f"{path}: align.train_ref: must hold the {len(self.train_set)} training pairs' "
                             "reference log-probabilities", resumes.fix_of(path))
        run.model.load_state_dict(weights)
        restore_optimizer(optimizer, tensors, meta["optimizer"])
        restore_random_streams(tensors, {"order": self.next_batches.gen})
        self.train_ref = ref.clone()
        self.next_batches.order = [list(b) for b in state["order"]]
        self.step, self.seen = meta["step"], meta["data_position"]
        self.final = state["final"]
        run.sums = dict(state["sums"])
        run.history[:] = state["history"]
        run.t0 -= meta.get("elapsed_s", 0.0)
        if run.log is not None:
            atomic_write_text(run.log.path, "".join(json.dumps(r) + "\n" for r in run.history))


def dpo(run: Setup) -> AlignResult:
    cfg, model, say = run.cfg, run.model, run.say
    t0 = time.perf_counter()
    reference = frozen_reference(model)
    train_set, dev_set = PairSet(run.train, model, cfg), PairSet(run.dev, model, cfg)
    total = run.total_steps(len(train_set))
    params = sum(p.numel() for p in model.parameters())
    say(f"align: DPO ({cfg.loss}, beta {cfg.beta}), {len(train_set)} train / {len(dev_set)} dev pairs, "
        f"{total} steps of {cfg.batch_size * cfg.grad_accum} pairs, {params:,} parameters, device "
        f"{run.machine.device} ({run.machine.precision})")
    steps = DpoSteps(run, reference, train_set, dev_set, total)
    start = steps.start
    engine = run.engine([model], cfg.lr, total)
    if run.resume_from is None:
        run.record({"step": 0, **{f"dev_{k}": v for k, v in start.items()}})
        say(f"step 0 (the reference itself): {shown(start, DEV_SHOWN)}; the reference prefers the chosen "
            f"response in {start['ref_accuracy']:.1%} of the dev pairs")
    else:  # continue the interrupted run where its state was saved
        steps.restore(run.resume_from, engine.optimizer)
        say(f"resumed from step {steps.step} of {total} (dev {shown(steps.final, DEV_SHOWN)})")
    steps.progress = run.progress(total, "align dpo")
    steps.progress.update(steps.step, [])
    model.train(cfg.dropout)
    save = None if run.identity is None else (lambda step: steps.save(engine.optimizer))
    try:
        run.fit(engine, total, steps.micro_batches, steps.after_step, steps.evaluate, start=steps.step,
                save=save)
    finally:
        steps.progress.close()
    model.eval()
    final = steps.final
    summary = {"method": "dpo", "steps": total, "train_pairs": len(train_set), "dev_pairs": len(dev_set),
               "start": start, "dev": final, "elapsed_s": time.perf_counter() - t0, "config": cfg.to_dict()}
    # the output taken meanwhile: the state at the last step is kept, which --resume turns into the output
    keep = None if run.identity is None else (lambda: steps.save(engine.optimizer))
    run.write(model, final, summary, keep=keep)
    return AlignResult(final, start, model, run.out, total, run.history, reference)
