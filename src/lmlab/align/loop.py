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

The policy runs with dropout off by default (``dropout=False``), as TRL does, so that policy and
reference differ only in their weights.
"""

from __future__ import annotations

import contextlib
import copy
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
from lmlab.fileio import atomic_dir, check_replaceable_dir, write_json
from lmlab.finetune.loop import epoch_batches, load_trainable_model
from lmlab.loading import model_facts
from lmlab.models.config import max_length_for
from lmlab.runtime import Machine, resolve
from lmlab.tasks import collate
from lmlab.tasks.base import pad_id_of
from lmlab.tasks.readers import BadLines, limit
from lmlab.train.components import Evaluator, FitLoop
from lmlab.train.engine import Engine
from lmlab.train.metrics import MetricsLog
from lmlab.train.optim import adamw, warmup_decay_lr
from lmlab.train.progress import Progress

SUMMARY_FILE = "align.json"
EVAL_FILE = "eval.json"
METRICS_FILE = "metrics.jsonl"


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

    def batch_order(self, lengths: list[int]) -> Callable[[], list[list[int]]]:
        """A function giving the ``grad_accum`` micro-batches (lists of item indices) of the next
        step: every epoch visits the items in a new seeded order, in batches of similar lengths."""
        gen = torch.Generator().manual_seed(self.cfg.seed)
        order: list[list[int]] = []

        def take() -> list[list[int]]:
            out = []
            for _ in range(self.cfg.grad_accum):
                if not order:
                    order.extend(epoch_batches(lengths, self.cfg.batch_size, gen)[::-1])
                out.append(order.pop())
            return out
        return take

    def eval_points(self, total: int) -> set[int]:
        every = self.cfg.eval_every or max(1, total // 10)
        return {s for s in range(every, total + 1, every)} | {total}

    def progress(self, total: int, desc: str) -> Progress:
        return Progress(total, desc=desc, show="auto" if self.cfg.progress else "off", log=self.say)

    def fit(self, engine: Engine, total: int, micro_batches: Callable[[int], list], after_step: Callable,
            evaluate: Callable[[int], dict] | None = None) -> None:
        """``total`` steps of ``engine`` through the one fit loop; ``micro_batches(step)`` gives what
        the engine runs, ``after_step(step, done, seconds)`` the bookkeeping, ``evaluate(step)`` the
        dev numbers at :meth:`eval_points`."""
        evals = self.eval_points(total)
        evaluator = None if evaluate is None else Evaluator(evaluate, at_end=False, also=lambda s: s in evals)
        FitLoop(engine, total, micro_batches=micro_batches, after_step=after_step, report=lambda *_: None,
                evaluator=evaluator).run(0)

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
              extra: Callable[[Path], None] | None = None) -> None:
        """Write the output directory in one rename (nothing when there is no ``out``)."""
        if self.out is None:
            return
        from lmlab.models import save_checkpoint

        rows = self.log.path.read_text(encoding="utf-8")
        with atomic_dir(self.out, marker=SUMMARY_FILE, what="aligned model") as tmp:
            save_checkpoint(model, tmp, tokenizer=model.tokenizer)
            write_json(tmp / EVAL_FILE, metrics)
            write_json(tmp / SUMMARY_FILE, {**summary, "machine": self.machine.record()})
            (tmp / METRICS_FILE).write_text(rows, encoding="utf-8")
            if extra is not None:
                extra(tmp)
        self.log.path.unlink(missing_ok=True)
        self.say(f"saved the aligned model to {self.out}")


def setup(checkpoint, train, dev, out, hparams: dict[str, Any], tokenizer, log,
          check: Callable[[Any, AlignConfig, Any], None] | None = None) -> Setup:
    """Everything a run needs, each input checked before the model loads: ``check(facts, cfg,
    device)`` is the method's own check of the checkpoint's facts (its sizes, its kind)."""
    cfg = AlignConfig.from_dict(hparams)
    facts = model_facts(checkpoint)  # the kind of model and its positions, before any data or weight is read
    if facts is not None:
        check_generative(facts)
        # a max_length given beyond the positions is refused; the default is cut down to them
        cfg.max_length = max_length_for(facts.config, hparams.get("max_length"), cfg.max_length)
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out_dir = None if out is None else check_replaceable_dir(out, SUMMARY_FILE, "aligned model")
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
    metrics_log, live = None, contextlib.ExitStack()
    if out_dir is not None:  # the live log sits beside the output (tail it); it moves inside at the end
        folder = live.enter_context(ownership.live_dir(out_dir, "alignment log"))
        metrics_log = MetricsLog(folder / METRICS_FILE)
        metrics_log.path.write_text("", encoding="utf-8")
    return Setup(cfg, model, train_pairs, dev_pairs, machine, out_dir, metrics_log, say, live)


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
        return [lambda idx=idx: self.loss(idx) for idx in self.next_batches()]

    def after_step(self, step: int, done, seconds: float) -> dict:
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
    run.record({"step": 0, **{f"dev_{k}": v for k, v in start.items()}})
    say(f"step 0 (the reference itself): {shown(start, DEV_SHOWN)}; the reference prefers the chosen "
        f"response in {start['ref_accuracy']:.1%} of the dev pairs")
    engine = run.engine([model], cfg.lr, total)
    steps.progress = run.progress(total, "align dpo")
    model.train(cfg.dropout)
    run.fit(engine, total, steps.micro_batches, steps.after_step, steps.evaluate)
    steps.progress.close()
    model.eval()
    final = steps.final
    summary = {"method": "dpo", "steps": total, "train_pairs": len(train_set), "dev_pairs": len(dev_set),
               "start": start, "dev": final, "elapsed_s": time.perf_counter() - t0, "config": cfg.to_dict()}
    run.write(model, final, summary)
    return AlignResult(final, start, model, run.out, total, run.history, reference)
