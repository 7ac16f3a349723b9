"""The pretraining loop: ``pretrain(config, out_dir)`` and what it writes into ``RUN_DIR``.

One optimizer step (nanoGPT's loop, with the pieces torchtitan keeps separate):

1. set the learning rate of this step (:func:`lmlab.train.optim.lr_at`);
2. for each of ``grad_accum`` micro-batches: read ``batch_size`` packed windows at the current
   data position (this process's slice of the global batch), let the objective turn them into
   model inputs (:meth:`Objective.prepare`: on the host, in the data path, for the objectives
   that say ``prepare_on_host``; on the device otherwise), run forward under autocast if
   enabled, and backpropagate ``loss / grad_accum`` (the gradient all-reduce of DDP runs on the
   last one);
3. clip the global gradient norm, take the AdamW step, advance the data position by the global
   batch;
4. log, evaluate every ``eval_every`` steps, checkpoint every ``checkpoint_every`` steps.

Determinism: every micro-batch re-seeds the torch RNG (dropout) and the objective's generator
(masking) from ``(seed, step, index of the micro-batch in the global batch)``. So a run is a pure
function of its config, a resumed run repeats the uninterrupted one exactly, and 2 processes with
``grad_accum=1`` compute exactly what 1 process computes with ``grad_accum=2``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab import ownership
from lmlab.arguments import trusted_inputs
from lmlab.config.fits import check_global_batch
from lmlab.data.batch import TokenBatch
from lmlab.data.packing import PackedWindows, eval_starts, window_count
from lmlab.errors import LmlabError
from lmlab.fileio import atomic_write_text, directory_lock, remove_leftovers, write_json
from lmlab.ownership import claimed_dir
from lmlab.progress import Progress
from lmlab.runtime import resolve
from lmlab.stopping import RESUME, StopRequests
from lmlab.train import distributed as dist_
from lmlab.train import pretrain_eval, pretrain_state
from lmlab.train.builder import build_run, check_run, model_config
from lmlab.train.checkpoint import CHECKPOINTS
from lmlab.train.components import Checkpointer, Evaluator, FitLoop, RunLogger
from lmlab.train.config import RunConfig, load_config, override_items, to_toml
from lmlab.train.data import check_data, prepare_run_data
from lmlab.train.engine import Engine
from lmlab.train.loggers import open_loggers
from lmlab.train.metrics import MetricsLog, plot_losses
from lmlab.train.optim import build_optimizer, lr_at
from lmlab.train.prefetch import Prefetcher
from lmlab.train.pretrain_eval import micro_seed
from lmlab.train.pretrain_state import RESUME_FREE_KEYS  # noqa: F401 - its old import path
from lmlab.train.speed_options import apply_speed_options


class TrainStep(nn.Module):
    """Model + objective as one module: DDP/FSDP wrap both (an objective may own parameters), and
    the objective's ``loss`` still receives the bare model."""

    def __init__(self, model: nn.Module, objective: nn.Module):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, inputs: dict[str, torch.Tensor]):
        return self.objective.loss(self.model, inputs)


#: what a pretraining run writes in its folder (lmlab.ownership.claim_dir): nothing else there is touched
RUN_KIND = "pretraining run"
RUN_ENTRIES = ("config.toml", "metrics.jsonl", "summary.json", "loss.png", CHECKPOINTS, "data",
               "tensorboard", "wandb")
#: the run's log that a resumed run continues (keeping its rows up to the checkpoint's step)
RUN_LOGS = ("metrics.jsonl",)


def pretrain(
    config: str | os.PathLike | dict | RunConfig | None,
    out_dir: str | os.PathLike,
    overrides: list[str] | dict[str, Any] | None = None,
    resume: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Pretrain a model as ``config`` says, writing the run into ``out_dir``; return its summary.

    ``config``: a recipe TOML path, a TOML-shaped dict or a :class:`RunConfig` (None with
    ``resume``: the run's own ``config.toml``). ``overrides``: ``["train.max_steps=100", ...]``
    or a ``{"train.max_steps": 100}`` dict. ``resume``: continue from the newest complete
    checkpoint in ``out_dir`` (starts from scratch when there is none).
    """
    from lmlab.arguments import callable_argument, flag_argument, path_argument

    run_dir = path_argument(out_dir, "pretrain's out_dir")
    flag_argument(resume, "pretrain's resume")
    if log is not None:
        callable_argument(log, "pretrain's log")
    if config is None:
        if not (resume and (run_dir / "config.toml").is_file()):
            raise LmlabError(
                "no config given", "pass --config FILE (or --resume on an existing run directory)"
            )
        config = run_dir / "config.toml"
    cfg = load_config(config, overrides)
    keys = {k for k, _ in override_items(overrides)}
    if "data.train" in keys and "data.val" not in keys and cfg.data.val and not resume:
        (log or (lambda m: print(m, file=sys.stderr, flush=True)))(
            f"warning: data.train was set but validation still reads the recipe's data.val "
            f"({', '.join(map(str, cfg.data.val[:3]))}{' ...' if len(cfg.data.val) > 3 else ''}); "
            "set data.val too (or data.val=[] with data.val_fraction) if that is not what you want")
    if int(os.environ.get("RANK", "0")) != 0:  # the ranks of one job share the run: rank 0 holds the lock
        return Trainer(cfg, run_dir, resume, log).run()
    # a new or empty folder becomes the run's; an earlier run's is continued; anything else is refused;
    # a run that fails before writing anything gives the folder back (no trace)
    with claimed_dir(run_dir, RUN_KIND, RUN_ENTRIES, logs=RUN_LOGS), \
            directory_lock(run_dir, "run directory"):  # two runs into one directory would mix their files
        # holding the lock, whatever an earlier, killed process left half-written here is dead
        for leftover_dir in (run_dir / "checkpoints", run_dir / "data", run_dir):
            remove_leftovers(leftover_dir)
        return Trainer(cfg, run_dir, resume, log).run()


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: Path, resume: bool, log: Callable[[str], None] | None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.resume = resume
        self._print = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.progress: Progress | None = None
        self.loggers: list = []
        self.prefetcher: Prefetcher | None = None
        self._held: list[str] | None = None  # setup's messages, printed once it succeeded
        self.t_start = time.perf_counter()

    # ------------------------------------------------------------------ reporting
    def log(self, msg: str) -> None:
        if not self.info.is_main:
            return
        if self._held is not None:
            self._held.append(msg)
            return
        if self.progress is not None:
            self.progress.write(msg)
        else:
            self._print(msg)

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg, t = self.cfg, self.cfg.train
        self._resolve_machine()
        objective_cls, arch = check_run(cfg)  # cheap checks first: nothing is tokenised for a bad recipe
        self.ckpt = pretrain_state.check_run_dir(self)  # a resume's own checks (its inputs' identity) first
        # no validation data, a missing file, a val_fraction that leaves no window...: before a
        # tokenizer is trained
        check_data(cfg.data, seq_len=t.seq_len)
        self._prepare_data()
        # a global batch larger than the training windows: refused before the model is built
        check_global_batch(t.batch_size, t.grad_accum, self.info.world_size,
                           window_count(self.data.train.num_tokens, t.seq_len, cfg.data.max_tokens),
                           f"windows of {t.seq_len} tokens", ("train.batch_size", "train.grad_accum"))
        tok = self.data.tokenizer

        # model and objective (lmlab.train.builder: the lab plans its runs with the same builder)
        built = build_run(cfg, tok, data_vocab_size=self.data.train.vocab_size)
        self.objective, self.model_config, self.model = built.objective, built.model_config, built.model
        for split in (self.data.train, self.data.val):
            split.check_token_ids(self.model_config.vocab_size)
        # what the rest of the setup reports is printed once it succeeded: a resume state that does
        # not fit the model built now is then the only line
        self._held = list(self.machine.notes)
        self.model.to(self.machine.device)
        self.objective.to(self.machine.device)
        apply_speed_options(self, objective_cls)
        self.step_module = dist_.parallelize(
            TrainStep(self.model, self.objective), self.info, t.distributed, self.machine.device
        )
        self.optimizer = build_optimizer([self.model, self.objective], t)
        self._build_loop()
        self._describe(arch)
        if self.ckpt is not None:
            pretrain_state.restore(self, self.ckpt)
        held, self._held = self._held, None
        for msg in held:
            self.log(msg)

    def _resolve_machine(self) -> None:
        """Join the processes and resolve device, threads and precision (a resumed run keeps the
        automatic choices it started with: numerics must not change mid-run)."""
        t = self.cfg.train
        cuda = t.device.startswith("cuda") or (t.device == "auto" and torch.cuda.is_available())
        dev_type = "cuda" if cuda else "cpu"
        self.info = dist_.init(dev_type)
        # names every rank agrees on (FSDP shards are written beside the checkpoint by all ranks)
        here = torch.device("cuda", self.info.local_rank) if dev_type == "cuda" else torch.device("cpu")
        self.rank0_pid = dist_.broadcast_int(os.getpid(), self.info, here)
        precision, kept = t.precision, None
        saved = pretrain_state.saved_machine(self.run_dir, self.resume, self.log)
        if saved:
            kept = saved.get("threads") or None  # below a count asked for (config, OMP_NUM_THREADS)
            precision = saved.get("precision", precision) if precision == "auto" else precision
        self.machine = resolve(t.device, t.threads, precision, self.info.local_rank,
                               self.info.local_world_size, keep_threads=kept)

    def _prepare_data(self) -> None:
        """The run's tokenizer and shards: rank 0 builds them, the others wait and open them."""
        ok = True
        if self.info.is_main:
            try:
                with ownership.preparing(self.run_dir):  # refused here: a new run folder goes whole
                    self.data = prepare_run_data(self.cfg.data, self.run_dir, self.log)
            except BaseException:
                ok = False
                dist_.broadcast_flag(False, self.info, self.machine.device)
                raise
        if dist_.broadcast_flag(ok, self.info, self.machine.device) and not self.info.is_main:
            self.data = prepare_run_data(self.cfg.data, self.run_dir, self.log, build=False)
        if not ok:
            raise LmlabError("data preparation failed on rank 0", "see its error")

    def _build_loop(self) -> None:
        """The engine, the data path, the evaluation windows and the fit loop with its components."""
        cfg, t = self.cfg, self.cfg.train
        half = self.machine.dtype is torch.float16 and self.machine.device.type == "cuda"
        self.scaler = torch.amp.GradScaler(self.machine.device.type) if half else None
        self.engine = Engine(self.optimizer, lambda step: lr_at(step, t), clip=t.clip,
                             autocast=self.machine.autocast, scaler=self.scaler, wrapped=self.step_module,
                             fix="lower train.lr, raise train.warmup_steps or use train.precision=fp32")
        self.windows = PackedWindows(self.data.train, t.seq_len, t.seed, cfg.data.max_tokens)
        self.device_generator: torch.Generator | None = None  # device-side preparation's, made once
        if t.prefetch:  # the next step's micro-batches are read (and prepared) on a background thread
            self.prefetcher = Prefetcher(self.load_micro_batch)
        self.eval_windows = eval_starts(self.data.val, t.seq_len, t.eval_batches * t.batch_size)
        self.val_starts = self.eval_windows[self.info.rank :: self.info.world_size]
        # every rank runs as many evaluation batches as rank 0 (which has the most windows): under
        # FSDP each forward gathers weights from all ranks, so a rank that stopped early would hang them
        self.val_batches = math.ceil(len(self.eval_windows[:: self.info.world_size]) / t.batch_size)
        self.rows_per_step = t.batch_size * t.grad_accum * self.info.world_size
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.step, self.tokens, self.position, self.initial_val = 0, 0, 0, None
        self.elapsed0 = 0.0
        self.checkpointer = Checkpointer(self.run_dir, keep=t.keep_checkpoints, every=t.checkpoint_every)
        self.fit = FitLoop(self.engine, t.max_steps, micro_batches=self._micro_batches,
                           after_step=self._after_step, report=self._report,
                           evaluator=Evaluator(lambda step: self.evaluate(), t.eval_every),
                           checkpointer=self.checkpointer, save=self._save_and_plot,
                           stop=lambda: self.stop.requested, on_stop=self._stopped,
                           step_context=trusted_inputs)  # ids and lengths were checked once, up front

    def _describe(self, arch: str) -> None:
        cfg, t = self.cfg, self.cfg.train
        n = self.model.num_parameters()
        self.log(f"model: {cfg.model.preset} ({arch}), {n:,} parameters, "
                 f"vocabulary {self.model_config.vocab_size:,}; objective: {cfg.objective.name}; "
                 f"{self.info.world_size} process(es), mode {self.info.mode}")
        self.log(f"data: train {self.windows.num_tokens:,} tokens "
                 f"{f'(the first of {self.data.train.num_tokens:,}) ' if cfg.data.max_tokens else ''}"
                 f"({self.windows.windows_per_epoch:,} windows of {t.seq_len}), "
                 f"val {self.data.val.num_tokens:,} tokens ({len(self.eval_windows)} eval windows) from "
                 f"{self.data.val_source}; "
                 f"global batch {self.rows_per_step} x {t.seq_len} = "
                 f"{self.rows_per_step * t.seq_len:,} tokens")
        from lmlab.config.run import schedule_note

        note = schedule_note(t)
        if note is not None:
            self.log(note)

    def _model_config(self, tok, vocab_size: int):
        return model_config(self.cfg.model.preset, self.cfg.model.overrides, tok, vocab_size)

    # ------------------------------------------------------------------ data path
    def host_inputs(self, batch: TokenBatch, seed: int) -> TokenBatch | dict[str, torch.Tensor]:
        """The host's part of a micro-batch: ``batch`` itself, or, for an objective that prepares
        on the host (``prepare_on_host``), its inputs prepared from ``batch`` with a CPU generator
        seeded by ``seed`` (as a data collator would); pinned for a CUDA device."""
        batch.single_document = batch.is_single_document()  # decided here, off the step's path
        item = batch
        if self.objective.prepare_on_host:
            item = self.objective.prepare(batch, torch.Generator().manual_seed(seed))
        if self.machine.device.type != "cuda":
            return item
        if isinstance(item, TokenBatch):
            return item.pin_memory()
        return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in item.items()}

    def device_inputs(self, item: TokenBatch | dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
        """The model inputs on the device: prepared inputs copied there (without blocking the host),
        or a batch copied there and prepared with a device generator seeded by ``seed``."""
        dev = self.machine.device
        if not isinstance(item, TokenBatch):
            return {k: v.to(dev, non_blocking=True) if isinstance(v, torch.Tensor) else v
                    for k, v in item.items()}
        if self.device_generator is None:
            self.device_generator = torch.Generator(device=dev)
        self.device_generator.manual_seed(seed)
        return self.objective.prepare(item.to(dev, non_blocking=True), self.device_generator)

    def load_micro_batch(self, key: tuple[int, int]) -> TokenBatch | dict[str, torch.Tensor]:
        """:meth:`host_inputs` of the training windows at data position ``key[0]``, seed ``key[1]``
        (what the prefetch thread runs a step ahead)."""
        position, seed = key
        return self.host_inputs(self.windows.batch(position, self.cfg.train.batch_size), seed)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        """The validation numbers (:func:`lmlab.train.pretrain_eval.evaluate`)."""
        return pretrain_eval.evaluate(self)

    def describe_eval(self, row: dict[str, Any]) -> str:
        return pretrain_eval.describe(self.objective, row)

    # ------------------------------------------------------------------ training
    def _key(self, step: int, position: int, index: int) -> tuple[int, int]:
        """Data position and seed of micro-batch ``index`` of ``step`` (global batch at ``position``)."""
        return position + index * self.cfg.train.batch_size, micro_seed(self.cfg.train.seed, step, index)

    def _micro_batch(self, key: tuple[int, int]):
        def run():
            item = self.load_micro_batch(key) if self.prefetcher is None else self.prefetcher.take(key)
            inputs = self.device_inputs(item, key[1])
            torch.manual_seed(key[1])
            return self.step_module(inputs)
        return run

    def _micro_batches(self, step: int) -> list:
        """What the engine runs for step ``step``'s micro-batches (this process's slice of the global
        batch); the prefetch thread starts reading the next step's."""
        t = self.cfg.train
        first = self.info.rank * t.grad_accum
        if self.prefetcher is not None and step + 1 < t.max_steps:
            after = self.position + self.rows_per_step
            self.prefetcher.ahead([self._key(step + 1, after, first + m) for m in range(t.grad_accum)])
        return [self._micro_batch(self._key(step, self.position, first + m)) for m in range(t.grad_accum)]

    def _after_step(self, step: int, done, seconds: float) -> dict[str, Any]:
        """Advance the data position; the step's row (the engine's numbers are averaged over the
        processes, and a non-finite loss never gets here)."""
        t = self.cfg.train
        self.step = step
        self.position += self.rows_per_step
        self.tokens += self.rows_per_step * t.seq_len
        return {"step": self.step, "tokens": self.tokens, "loss": done.loss, "lr": done.lr,
                "grad_norm": done.grad_norm, **done.metrics,
                "tokens_per_s": round(self.rows_per_step * t.seq_len / max(seconds, 1e-9), 1),
                **self._utilisation(1, seconds), "elapsed_s": round(self.elapsed(), 3)}

    def train_step(self) -> dict[str, float]:
        """One optimizer step through the fit loop: its numbers (loss, lr, gradient norm, the
        objective's signals, speed)."""
        row = self.fit.take_step(self.step)
        return {k: v for k, v in row.items() if k not in ("step", "tokens")}

    def _report(self, step: int, row: dict[str, Any], evaluation: dict[str, Any] | None, final: bool) -> None:
        t = self.cfg.train
        if evaluation is not None:
            row.update(evaluation)
            self.log(f"step {step}: train loss {row['loss']:.4f}, {self.describe_eval(row)}")
        if self.info.is_main and (step % t.log_every == 0 or "val_loss" in row or final):
            self.run_log.record(row, step)
        self.last_row = row
        spent = max(time.perf_counter() - self.t_loop, 1e-9)
        rate = (self.tokens - self.start_tokens) / spent
        mfu = self._utilisation(step - self.first_step, spent).get("mfu")
        shown_mfu = {"mfu": f"{mfu:.1%}"} if mfu is not None else {}
        self.run_log.update(step, [f"loss {row['loss']:.4f}", f"{rate:,.0f} tokens/s",
                                   *(f"MFU {v}" for v in shown_mfu.values())],
                            loss=f"{row['loss']:.3f}", tok_s=f"{rate:,.0f}", **shown_mfu)

    def save(self) -> None:
        """Checkpoint the run at its current step (:func:`lmlab.train.pretrain_state.save`)."""
        pretrain_state.save(self)

    def _save_and_plot(self, step: int) -> None:
        self.save()
        if self.info.is_main:
            self._plot(self.run_log.history)

    def _stopped(self, requested: str, step: int) -> str:
        """The fix the stop's one line says (lmlab.stopping): the run saved its step and continues."""
        return f"{RESUME} (step {step} is saved in {self.checkpointer.last})"

    def _utilisation(self, steps: int, seconds: float) -> dict[str, float]:
        """Achieved model TFLOP/s per device over ``steps`` steps in ``seconds``, and MFU where the
        device's peak is known (empty where the model's FLOPs are not counted)."""
        if not self.step_flops or steps <= 0 or seconds <= 0:
            return {}
        tflops = self.step_flops * steps / seconds / self.info.world_size / 1e12
        out = {"tflops": float(f"{tflops:.4g}")}  # significant digits: a CPU run is at 1e-3
        if self.peak:
            out["mfu"] = float(f"{tflops / self.peak:.4g}")
        return out

    def elapsed(self) -> float:
        return self.elapsed0 + time.perf_counter() - self.t_start

    def run(self) -> dict[str, Any]:
        self.t_start = time.perf_counter()
        self.info = dist_.DistInfo()
        try:
            self.setup()
            with StopRequests() as self.stop:
                return self._run()
        finally:
            if self.progress is not None:
                self.progress.close()
            for logger in self.loggers:
                logger.close()
            if self.prefetcher is not None:
                self.prefetcher.close()
            dist_.shutdown(self.info)

    def _run(self) -> dict[str, Any]:
        t = self.cfg.train
        if self.info.is_main:
            atomic_write_text(self.run_dir / "config.toml", to_toml(self.cfg))
        if self.info.is_main and t.loggers:
            self.loggers = open_loggers(t.loggers, self.run_dir, resume_after=self.step or None,
                                        config=self.cfg.to_dict())
        if self.step == 0 and t.eval_at_start and self.initial_val is None:
            self.initial_val = self.evaluate()
            self.log(f"step 0: {self.describe_eval(self.initial_val)}")
            for logger in self.loggers:
                logger.log(self.initial_val, 0)
        rows = self.metrics.rows() if self.info.is_main else []
        self.run_log = RunLogger(self.metrics if self.info.is_main else None, self._print,
                                 loggers=self.loggers, history=rows)
        self.run_log.show_progress(t.max_steps, self.step, desc="pretrain",
                                   show=t.progress if self.info.is_main else "off")
        self.progress = self.run_log.progress
        self.last_row = rows[-1] if rows else {}
        self.first_step, self.start_tokens, self.t_loop = self.step, self.tokens, time.perf_counter()
        self.fit.run(self.step)
        if self.info.is_main and rows:
            self._plot(rows)
        return self._summary(rows)

    def _summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """What ``pretrain()`` returns and ``summary.json`` holds."""
        vals = [r for r in rows if "val_loss" in r]
        spent = time.perf_counter() - self.t_loop
        summary = {
            "run_dir": str(self.run_dir),
            "steps": self.step,
            "tokens": self.tokens,
            "train_loss": self.last_row.get("loss"),
            "val_loss": vals[-1]["val_loss"] if vals else None,
            "val_ppl": vals[-1].get("val_ppl") if vals else None,
            "val_bpb": vals[-1].get("val_bpb") if vals else None,
            "val": self.describe_eval(vals[-1]) if vals else None,
            "val_signals": {k: v for k, v in vals[-1].items() if k.startswith("val_")} if vals else {},
            "initial_val_loss": (self.initial_val or {}).get("val_loss"),
            "parameters": self.model.num_parameters(),
            "seconds": round(self.elapsed(), 2),
            "tokens_per_s": round((self.tokens - self.start_tokens) / max(spent, 1e-9), 1),
            **self._utilisation(self.step - self.first_step, spent),
            "checkpoint": str(self.checkpointer.last) if self.checkpointer.last else None,
            "world_size": self.info.world_size,
            "threads": self.machine.threads,
            "precision": self.machine.precision,
            "machine": self.machine.record(),
        }
        if self.info.is_main:
            write_json(self.run_dir / "summary.json", summary)
        return summary

    def _plot(self, rows: list[dict]) -> None:
        init = (self.initial_val or {}).get("val_loss")
        plot_losses(
            rows, self.run_dir / "loss.png", f"{self.cfg.model.preset} / {self.cfg.objective.name}", init
        )
