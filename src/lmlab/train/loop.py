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

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.data.batch import TokenBatch
from lmlab.data.packing import PackedWindows, eval_starts, read_windows
from lmlab.errors import LmlabError
from lmlab.fileio import atomic_write_text, directory_lock, remove_leftovers, write_json
from lmlab.models.checkpoint import trusted_inputs
from lmlab.ownership import claim_dir, start_temporary
from lmlab.runtime import resolve
from lmlab.train import distributed as dist_
from lmlab.train.checkpoint import (
    CHECKPOINTS,
    SHARDED,
    check_train_tensors,
    latest_checkpoint,
    load_train_checkpoint,
    read_train_state,
    restore_rng,
    rng_tensors,
    save_train_checkpoint,
)
from lmlab.train.config import RunConfig, load_config, override_items, read_toml, to_toml
from lmlab.train.data import prepare_run_data
from lmlab.train.device import peak_tflops
from lmlab.train.engine import Engine
from lmlab.train.loggers import open_loggers
from lmlab.train.metrics import MetricsLog, perplexity, plot_losses, read_metrics
from lmlab.train.optim import build_optimizer, load_optimizer_tensors, lr_at, optimizer_tensors
from lmlab.train.preempt import StopRequests
from lmlab.train.prefetch import Prefetcher
from lmlab.train.progress import Progress

#: train.* keys that may change on --resume without changing the run's past or its arithmetic
RESUME_FREE_KEYS = {
    "max_steps",
    "prefetch",
    "eval_every",
    "eval_batches",
    "checkpoint_every",
    "keep_checkpoints",
    "log_every",
    "threads",
    "progress",
    "eval_at_start",
    "device",
    "distributed",
    "activation_checkpointing",
    "peak_tflops",
    "loggers",
}


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


def micro_seed(seed: int, step: int, index: int) -> int:
    """Seed of micro-batch ``index`` (in the global batch) of optimizer step ``step``."""
    return (seed * 1_000_003 + step * 7919 + index * 104_729 + 12_345) % (2**63 - 1)


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
    run_dir = Path(out_dir)
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
    # a new or empty folder becomes the run's; an earlier run's is continued; anything else is refused
    claim_dir(run_dir, RUN_KIND, RUN_ENTRIES)
    with directory_lock(run_dir, "run directory"):  # two runs into one directory would mix their files
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
        from lmlab.models import CONFIG_ARCHITECTURE, PRESETS
        from lmlab.objectives import get_objective

        cfg, t = self.cfg, self.cfg.train
        dev_type = (
            "cuda"
            if (t.device.startswith("cuda") or (t.device == "auto" and torch.cuda.is_available()))
            else "cpu"
        )
        self.info = dist_.init(dev_type)
        # names every rank agrees on (FSDP shards are written beside the checkpoint by all ranks)
        here = torch.device("cuda", self.info.local_rank) if dev_type == "cuda" else torch.device("cpu")
        self.rank0_pid = dist_.broadcast_int(os.getpid(), self.info, here)
        threads, precision = t.threads, t.precision
        saved = self._saved_machine()
        if saved:  # resume: keep the run's own automatic choices (numerics must not change mid-run)
            threads = threads or saved.get("threads", 0)
            precision = saved.get("precision", precision) if precision == "auto" else precision
        self.machine = resolve(t.device, threads, precision, self.info.local_rank, self.info.local_world_size)

        # cheap checks first: nothing is tokenised or trained for a recipe that cannot run
        objective_cls = get_objective(cfg.objective.name)
        base = PRESETS[cfg.model.preset]()
        arch = CONFIG_ARCHITECTURE.get(type(base), "?")
        if objective_cls.architectures and arch not in objective_cls.architectures:
            raise LmlabError(
                f"objective {cfg.objective.name!r} trains {'/'.join(objective_cls.architectures)} "
                f"models, but preset {cfg.model.preset} is {'an' if arch[0] in 'aeiou' else 'a'} {arch}",
                f"pick a {objective_cls.architectures[0]} preset or another objective",
            )
        max_pos = cfg.model.overrides.get("max_positions", getattr(base, "max_positions", None))
        if max_pos is not None and t.seq_len > max_pos:
            raise LmlabError(
                f"train.seq_len {t.seq_len} is longer than the model's {max_pos} positions",
                f"set train.seq_len <= {max_pos} (or model.max_positions)",
            )
        self.ckpt = self._check_run_dir()

        # data (rank 0 builds, the others wait and open it)
        ok = True
        if self.info.is_main:
            try:
                self.data = prepare_run_data(cfg.data, self.run_dir, self.log)
            except BaseException:
                ok = False
                dist_.broadcast_flag(False, self.info, self.machine.device)
                raise
        if dist_.broadcast_flag(ok, self.info, self.machine.device) and not self.info.is_main:
            self.data = prepare_run_data(cfg.data, self.run_dir, self.log, build=False)
        if not ok:
            raise LmlabError("data preparation failed on rank 0", "see its error")
        tok = self.data.tokenizer

        # model and objective
        self.objective = objective_cls(tok, **cfg.objective.params)
        # the objective may have added tokens (T5 sentinels) to the tokenizer the shards were made with
        self.model_config = self._model_config(tok, max(self.data.train.vocab_size, tok.vocab_size))
        for split in (self.data.train, self.data.val):
            split.check_token_ids(self.model_config.vocab_size)
        # what the rest of the setup reports is printed once it succeeded: a resume state that does
        # not fit the model built now is then the only line
        self._held = list(self.machine.notes)
        from lmlab.models import build_model

        torch.manual_seed(t.seed)
        self.model = build_model(self.model_config, heads=objective_cls.heads or None)
        self.model.tokenizer = tok
        self.objective.setup(self.model)  # objective-owned parts sized from the model (ELECTRA, SBO)
        self.model.to(self.machine.device)
        self.objective.to(self.machine.device)
        self._speed_options(objective_cls)
        self.step_module = dist_.parallelize(
            TrainStep(self.model, self.objective), self.info, t.distributed, self.machine.device
        )
        self.optimizer = build_optimizer([self.model, self.objective], t)
        self.scaler = (
            torch.amp.GradScaler(self.machine.device.type)
            if self.machine.dtype is torch.float16 and self.machine.device.type == "cuda"
            else None
        )
        self.engine = Engine(self.optimizer, lambda step: lr_at(step, t), clip=t.clip,
                             autocast=self.machine.autocast, scaler=self.scaler, wrapped=self.step_module,
                             fix="lower train.lr, raise train.warmup_steps or use train.precision=fp32")
        self.windows = PackedWindows(self.data.train, t.seq_len, t.seed, cfg.data.max_tokens)
        self.device_generator: torch.Generator | None = None  # device-side preparation's, made once
        if t.prefetch:  # the next step's micro-batches are read (and prepared) on a background thread
            self.prefetcher = Prefetcher(self.load_micro_batch)
        starts = eval_starts(self.data.val, t.seq_len, t.eval_batches * t.batch_size)
        self.val_starts = starts[self.info.rank :: self.info.world_size]
        # every rank runs as many evaluation batches as rank 0 (which has the most windows): under
        # FSDP each forward gathers weights from all ranks, so a rank that stopped early would hang them
        self.val_batches = math.ceil(len(starts[:: self.info.world_size]) / t.batch_size)
        self.rows_per_step = t.batch_size * t.grad_accum * self.info.world_size
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.step, self.tokens, self.position, self.initial_val = 0, 0, 0, None
        self.elapsed0 = 0.0
        n = self.model.num_parameters()
        self.log(
            f"model: {cfg.model.preset} ({arch}), {n:,} parameters, "
            f"vocabulary {self.model_config.vocab_size:,}; objective: {cfg.objective.name}; "
            f"{self.info.world_size} process(es), mode {self.info.mode}"
        )
        self.log(
            f"data: train {self.windows.num_tokens:,} tokens "
            f"{f'(the first of {self.data.train.num_tokens:,}) ' if cfg.data.max_tokens else ''}"
            f"({self.windows.windows_per_epoch:,} windows of {t.seq_len}), "
            f"val {self.data.val.num_tokens:,} tokens ({len(starts)} eval windows) from "
            f"{self.data.val_source}; "
            f"global batch {self.rows_per_step} x {t.seq_len} = {self.rows_per_step * t.seq_len:,} tokens"
        )
        if self.ckpt is not None:
            self._restore(self.ckpt)
        held, self._held = self._held, None
        for msg in held:
            self.log(msg)

    def _speed_options(self, objective_cls) -> None:
        """Activation checkpointing, torch.compile, and the FLOPs and peak behind the MFU column."""
        cfg, t = self.cfg, self.cfg.train
        flex = t.attention == "flex" or (t.attention == "auto" and self.machine.device.type == "cuda")
        self.model.attention_backend = "flex" if flex else "sdpa"
        if flex:
            dropout = getattr(self.model_config, "attn_dropout", 0.0)
            self.log("attention: packed documents on FlexAttention's block-sparse kernel (train.attention)"
                     + (f"; training uses the dense kernel, since FlexAttention has no attention dropout "
                        f"(model.attn_dropout={dropout}; set it to 0 to train on flex)" if dropout else ""))
        if t.activation_checkpointing:
            from lmlab.models.activation_checkpointing import enable_activation_checkpointing

            n = enable_activation_checkpointing(self.model)
            self.log(f"activation checkpointing: {n} Transformer block(s) recompute their activations "
                     "in the backward pass" if n else
                     "warning: train.activation_checkpointing found no Transformer block in this model")
        if t.compile:
            import torch._dynamo

            # an MLM head given labels but no label_positions (UniLM) selects the masked rows on the
            # device: a data-dependent shape the graph can hold
            torch._dynamo.config.capture_dynamic_output_shape_ops = True
            self.model.compile(backend=t.compile_backend)
            self.log(f"compile: torch.compile, backend {t.compile_backend} (the first steps, and the "
                     "first evaluation, include compiling)")
        rows = t.batch_size * t.grad_accum * self.info.world_size
        try:
            self.step_flops = objective_cls.step_flops(self.model_config, t.seq_len, rows,
                                                       cfg.objective.params)
        except LmlabError:
            self.step_flops = None
        self.peak = peak_tflops(self.machine.device, self.machine.dtype, t.peak_tflops)
        if self.step_flops and self.peak:
            self.log(f"MFU: {self.step_flops:.3g} model FLOPs per step ({cfg.objective.name}'s count) "
                     f"against {self.peak:g} TFLOP/s per device")
        elif self.step_flops:
            self.log(f"MFU: not logged, the peak of this {self.machine.device.type} is unknown (set "
                     "train.peak_tflops); the tflops column shows the achieved model TFLOP/s")

    def _saved_machine(self) -> dict | None:
        """On resume, the machine choices saved in the newest checkpoint, once the files a resume
        reads back (its train state and model config, the run's metrics log) are checked whole,
        each against its file schema: before any work."""
        if not self.resume:
            return None
        path = latest_checkpoint(self.run_dir)
        if path is None:
            return None
        from lmlab.models import read_checkpoint_meta

        state = read_train_state(path)
        read_checkpoint_meta(path)
        read_metrics(self.run_dir / "metrics.jsonl")
        return state.get("machine")

    def _model_config(self, tok, vocab_size: int):
        return model_config(self.cfg.model.preset, self.cfg.model.overrides, tok, vocab_size)

    def _check_run_dir(self) -> Path | None:
        existing = latest_checkpoint(self.run_dir)
        if not self.resume:
            if existing is not None:
                raise LmlabError(
                    f"{self.run_dir} already holds a run (checkpoint {existing.name})",
                    "pass --resume to continue it, or choose a new --out",
                )
            return None
        if existing is None:
            self.log(f"resume: no checkpoint in {self.run_dir / 'checkpoints'}, starting from scratch")
            return None
        saved_path = self.run_dir / "config.toml"
        if saved_path.is_file():
            self._compare_configs(load_config(read_toml(saved_path)))
        return existing

    def _compare_configs(self, saved: RunConfig) -> None:
        now, old = self.cfg.to_dict(), saved.to_dict()
        diffs = []
        for section in now:
            for key in sorted(set(now[section]) | set(old[section])):
                if now[section].get(key) != old[section].get(key):
                    diffs.append((section, key))
        fatal = [
            f"{s}.{k}" for s, k in diffs if s in ("model", "objective") or (s, k) == ("data", "tokenizer")
        ]
        if fatal:
            raise LmlabError(
                f"--resume with a different {', '.join(fatal)} than the run was started with",
                "resume with the run's own config (RUN_DIR/config.toml) or start a new run",
            )
        changed = [f"{s}.{k}" for s, k in diffs if not (s == "train" and k in RESUME_FREE_KEYS)]
        if changed:
            self.log(
                f"warning: resuming with changed {', '.join(changed)}: the continued run will differ "
                "from an uninterrupted one"
            )

    def _restore(self, path: Path) -> None:
        from lmlab.models.checkpoint import load_state

        tensors, meta, weights = load_train_checkpoint(path)
        self.windows.check_position(meta["data_position"], str(path / "train_state.json"))  # before any walk
        sharded = path / SHARDED
        if (self.info.mode == "fsdp") != sharded.is_dir():
            saved_as = "FSDP (sharded)" if sharded.is_dir() else "a single process or DDP"
            raise LmlabError(f"{path} was written by a run with {saved_as}, this one runs "
                             f"{self.info.mode}",
                             "resume with the run's own train.distributed (and torchrun for FSDP)")
        from lmlab.models import read_checkpoint_meta
        from lmlab.models.checkpoint import tokenizer_matches

        if not tokenizer_matches(read_checkpoint_meta(path), self.model.tokenizer):
            raise LmlabError(f"{path} was trained with another tokenizer than the one the data gives now "
                             "(same size, other tokens): resuming would feed it ids that mean other words",
                             "resume with the run's own data and tokenizer, or start a new run")
        if self.info.mode == "fsdp":  # weights, objective and optimizer state, each rank its shards
            dist_.load_sharded(self.step_module, self.optimizer, sharded)
        else:
            check_train_tensors(path, tensors, meta, self.optimizer, self.objective)
            load_state(self.model, weights, str(path))
            obj_state = {k[len("objective.") :]: v for k, v in tensors.items() if k.startswith("objective.")}
            if obj_state:
                self.objective.load_state_dict(obj_state)
            moments = {k: v for k, v in tensors.items() if k.startswith("state.")}
            load_optimizer_tensors(self.optimizer, moments, meta["optimizer"])
        restore_rng(tensors)
        self.step, self.tokens, self.position = meta["step"], meta["tokens"], meta["data_position"]
        self.initial_val = meta.get("initial_val")
        self.elapsed0 = meta.get("elapsed_s", 0.0)
        if self.info.is_main:
            self.metrics.truncate_after(self.step)
        self.log(
            f"resumed from {path} at step {self.step} (data position {self.position:,} windows, "
            f"epoch {self.windows.epoch_of(self.position):.2f})"
        )

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
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean validation loss (weighted by predicted tokens when the objective reports ``targets``)."""
        t = self.cfg.train
        self.model.eval()
        self.objective.eval()
        total, weight = 0.0, 0.0
        sums: dict[str, float] = {}  # the objective's metrics, weighted like the loss
        for i in range(0, self.val_batches * t.batch_size, t.batch_size):
            chunk = self.val_starts[i : i + t.batch_size]
            batch = read_windows(self.data.val, chunk or [0], t.seq_len)  # none left: a stand-in, unscored
            seed = micro_seed(t.seed, -1, i)
            inputs = self.device_inputs(self.host_inputs(batch, seed), seed)
            with self.machine.autocast():  # through the DDP/FSDP wrapper, which gathers sharded weights
                loss, extra = self.step_module(inputs)
            if not chunk:
                continue
            w = float(extra.get("targets", 1.0))
            total += float(loss) * w
            weight += w
            for k, v in extra.items():
                if k != "targets" and isinstance(v, (int, float, torch.Tensor)):
                    sums[k] = sums.get(k, 0.0) + float(v) * w
        names = sorted(sums)
        total, weight, *values = dist_.mean_across([total, weight, *(sums[k] for k in names)], self.info,
                                                   self.machine.device)
        self.model.train()
        self.objective.train()
        mean = total / max(weight, 1e-12)
        row = {"val_loss": mean, **{f"val_{k}": v / max(weight, 1e-12) for k, v in zip(names, values)}}
        kind = getattr(self.objective, "loss_kind", "other")
        if kind in ("nll", "masked_nll"):
            row["val_ppl"] = perplexity(mean)
        if kind == "nll":
            row["val_bpb"] = self.data.val.bits_per_byte(mean)
        return row

    def describe_eval(self, row: dict[str, Any]) -> str:
        """The validation numbers that mean something for this objective: loss, perplexity and bits
        per byte only for a per-token NLL, and each learning signal beside its trivial baseline."""
        parts = [f"val loss {row['val_loss']:.4f}"]
        if "val_ppl" in row:
            parts.append(f"ppl {row['val_ppl']:.1f}")
        if "val_bpb" in row:
            parts.append(f"{row['val_bpb']:.3f} bits/byte")
        for metric, guess, what in getattr(self.objective, "signals", ()):
            if f"val_{metric}" in row and f"val_{guess}" in row:
                parts.append(f"{metric} {row[f'val_{metric}']:.4f} ({what}: {row[f'val_{guess}']:.4f})")
        return ", ".join(parts)

    # ------------------------------------------------------------------ training
    def train_step(self) -> dict[str, float]:
        t = self.cfg.train
        first = self.info.rank * t.grad_accum

        def key(step: int, position: int, index: int) -> tuple[int, int]:
            """Data position and seed of micro-batch ``index`` of ``step`` (global batch at ``position``)."""
            return position + index * t.batch_size, micro_seed(t.seed, step, index)

        def micro_batch(index: int):
            def run():
                k = key(self.step, self.position, index)
                item = self.load_micro_batch(k) if self.prefetcher is None else self.prefetcher.take(k)
                inputs = self.device_inputs(item, k[1])
                torch.manual_seed(k[1])
                return self.step_module(inputs)
            return run

        if self.prefetcher is not None and self.step + 1 < t.max_steps:
            after = self.position + self.rows_per_step
            self.prefetcher.ahead([key(self.step + 1, after, first + m) for m in range(t.grad_accum)])
        with trusted_inputs():  # ids and lengths were checked once, before the first step
            done = self.engine.step(self.step, [micro_batch(first + m) for m in range(t.grad_accum)])
        self.step += 1
        self.position += self.rows_per_step
        self.tokens += self.rows_per_step * t.seq_len
        # averaged over the processes by the engine; a non-finite loss never gets here
        return {"loss": done.loss, "lr": done.lr, "grad_norm": done.grad_norm, **done.metrics}

    def save(self) -> None:
        t = self.cfg.train
        tensors, sharded = {}, None
        if self.info.mode != "fsdp":
            tensors, opt_meta = optimizer_tensors(self.optimizer)
            for k, v in self.objective.state_dict().items():
                tensors[f"objective.{k}"] = v.detach().cpu()
        else:  # every rank writes its shards beside the checkpoint; rank 0 moves them in
            opt_meta = {"param_groups": []}
            sharded = self.run_dir / CHECKPOINTS / f".step_{self.step}.tmp-{self.rank0_pid}-sharded"
            if self.info.is_main:  # marked as this process's, so a killed run's shards are removed next start
                sharded.mkdir(parents=True, exist_ok=True)
                start_temporary(sharded, "checkpoint shards")
            dist_.barrier(self.info)
            dist_.save_sharded(self.step_module, self.optimizer, sharded)
            dist_.barrier(self.info)
        tensors.update(rng_tensors())
        meta = {
            "step": self.step,
            "tokens": self.tokens,
            "data_position": self.position,
            "epoch": self.windows.epoch_of(self.position),
            "rows_per_step": self.rows_per_step,
            "world_size": self.info.world_size,
            "optimizer": opt_meta,
            "initial_val": self.initial_val,
            "elapsed_s": self.elapsed(),
            "config": self.cfg.to_dict(),
            "machine": {"threads": self.machine.threads, "precision": self.machine.precision},
        }
        model = self.model
        if self.info.mode == "fsdp":  # gather the full weights (collective) into a CPU copy
            state = dist_.full_state_dict(self.model, self.info)
            if self.info.is_main:
                from lmlab.models import build_model

                model = build_model(self.model_config, heads=self.model.head_names)
                model.load_state_dict(state)
                model.tokenizer = self.model.tokenizer
        if self.info.is_main:
            path = save_train_checkpoint(self.run_dir, self.step, model, tensors, meta, t.keep_checkpoints,
                                         sharded=sharded)
            self.last_checkpoint = path
        dist_.barrier(self.info)

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
        self.last_checkpoint = latest_checkpoint(self.run_dir)
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
        self.progress = Progress(t.max_steps, self.step, desc="pretrain",
                                 show=t.progress if self.info.is_main else "off", log=self._print)
        first = self.step
        last: dict[str, Any] = rows[-1] if rows else {}
        start_tokens, t_loop = self.tokens, time.perf_counter()
        while self.step < t.max_steps:
            t0 = time.perf_counter()
            row = self.train_step()
            dt = time.perf_counter() - t0
            row = {
                "step": self.step,
                "tokens": self.tokens,
                **row,
                "tokens_per_s": round(self.rows_per_step * t.seq_len / max(dt, 1e-9), 1),
                **self._utilisation(1, dt),
                "elapsed_s": round(self.elapsed(), 3),
            }
            final = self.step == t.max_steps
            if self.step % t.eval_every == 0 or final:
                row.update(self.evaluate())
                self.log(f"step {self.step}: train loss {row['loss']:.4f}, {self.describe_eval(row)}")
            if self.info.is_main and (self.step % t.log_every == 0 or "val_loss" in row or final):
                self.metrics.append(row)
                rows.append(row)
                for logger in self.loggers:
                    logger.log(row, self.step)
            last = row
            spent = max(time.perf_counter() - t_loop, 1e-9)
            rate = (self.tokens - start_tokens) / spent
            mfu = self._utilisation(self.step - first, spent).get("mfu")
            shown_mfu = {"mfu": f"{mfu:.1%}"} if mfu is not None else {}
            self.progress.update(self.step, [f"loss {row['loss']:.4f}", f"{rate:,.0f} tokens/s",
                                             *(f"MFU {v}" for v in shown_mfu.values())],
                                 loss=f"{row['loss']:.3f}", tok_s=f"{rate:,.0f}", **shown_mfu)
            saved = self.step % t.checkpoint_every == 0 or final
            if saved:
                self.save()
                if self.info.is_main:
                    self._plot(rows)
            if self.stop.requested and not final:
                if not saved:
                    self.save()
                self.log(f"{self.stop.requested}: stopped after step {self.step}, checkpoint "
                         f"{self.last_checkpoint}; continue with --resume")
                raise KeyboardInterrupt
        if self.info.is_main and rows:
            self._plot(rows)
        vals = [r for r in rows if "val_loss" in r]
        summary = {
            "run_dir": str(self.run_dir),
            "steps": self.step,
            "tokens": self.tokens,
            "train_loss": last.get("loss"),
            "val_loss": vals[-1]["val_loss"] if vals else None,
            "val_ppl": vals[-1].get("val_ppl") if vals else None,
            "val_bpb": vals[-1].get("val_bpb") if vals else None,
            "val": self.describe_eval(vals[-1]) if vals else None,
            "val_signals": {k: v for k, v in vals[-1].items() if k.startswith("val_")} if vals else {},
            "initial_val_loss": (self.initial_val or {}).get("val_loss"),
            "parameters": self.model.num_parameters(),
            "seconds": round(self.elapsed(), 2),
            "tokens_per_s": round((self.tokens - start_tokens) / max(time.perf_counter() - t_loop, 1e-9), 1),
            **self._utilisation(self.step - first, time.perf_counter() - t_loop),
            "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
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


def model_config(preset: str, overrides: dict[str, Any], tok, vocab_size: int):
    """The config of a run's model: ``preset`` + ``overrides``, sized to ``vocab_size`` (the
    tokenizer's, objective-added tokens included) with the tokenizer's pad/bos/eos ids."""
    from lmlab.models import get_preset

    overrides = dict(overrides)
    overrides.setdefault("vocab_size", vocab_size)
    if overrides["vocab_size"] < vocab_size:
        raise LmlabError(
            f"model.vocab_size {overrides['vocab_size']} is smaller than the tokenizer's {vocab_size} tokens",
            f"set model.vocab_size >= {vocab_size} or leave it out",
        )
    fields = {f.name for f in dataclasses.fields(type(get_preset(preset)))}
    for role in ("pad", "bos", "eos"):
        key = f"{role}_token_id"
        if key in fields and key not in overrides and tok.role_id(role) is not None:
            overrides[key] = tok.role_id(role)
    return get_preset(preset, **overrides)
