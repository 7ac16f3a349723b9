"""A pretraining run's checkpoints through the one resume format
(:class:`lmlab.train.components.Checkpointer`): what it saves, what a resume checks and restores.

The functions take the :class:`lmlab.train.loop.Trainer` whose run they save or continue.
"""

from __future__ import annotations

from pathlib import Path

from lmlab.errors import LmlabError
from lmlab.ownership import derived_name, start_temporary
from lmlab.train import distributed as dist_
from lmlab.train.checkpoint import (
    CHECKPOINTS,
    SHARDED,
    check_train_tensors,
    latest_checkpoint,
    read_train_state,
    set_aside_damaged,
)
from lmlab.train.components.checkpointer import optimizer_state, restore_optimizer
from lmlab.train.components.resume_state import ResumeState, random_streams, restore_random_streams
from lmlab.train.config import RunConfig, load_config, read_toml
from lmlab.train.metrics import read_metrics

#: train.* keys that may change on --resume without changing the run's past or its arithmetic
RESUME_FREE_KEYS = {
    "max_steps", "prefetch", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints",
    "log_every", "threads", "progress", "eval_at_start", "device", "distributed",
    "activation_checkpointing", "peak_tflops", "loggers",
}


def saved_machine(run_dir: Path, resume: bool, say=None) -> dict | None:
    """On resume, the machine choices saved in the newest checkpoint, once the files a resume reads
    back (its train state and model config, the run's metrics log) are checked whole, each against
    its file schema: before any work."""
    if not resume:
        return None
    path = latest_checkpoint(run_dir, say)
    if path is None:
        return None
    from lmlab.models import read_checkpoint_meta

    state = read_train_state(path)
    read_checkpoint_meta(path)
    read_metrics(run_dir / "metrics.jsonl")
    return state.get("machine")


def check_run_dir(trainer) -> Path | None:
    """The checkpoint to resume from (None: start), or a one-line error for a run folder that holds
    a run without ``--resume``, or a resume with another model, objective or tokenizer."""
    existing = latest_checkpoint(trainer.run_dir, trainer.log)
    if not trainer.resume:
        if existing is not None:
            raise LmlabError(f"{trainer.run_dir} already holds a run (checkpoint {existing.name})",
                             "pass --resume to continue it, or choose a new --out")
        return None
    if existing is None:
        trainer.log(f"resume: no checkpoint in {trainer.run_dir / 'checkpoints'}, starting from scratch")
        return None
    if trainer.info.is_main:  # one process renames; the resumed run writes those steps again
        set_aside_damaged(trainer.run_dir, trainer.log)
    saved_path = trainer.run_dir / "config.toml"
    if saved_path.is_file():
        compare_configs(trainer, load_config(read_toml(saved_path)))
    return existing


def compare_configs(trainer, saved: RunConfig) -> None:
    now, old = trainer.cfg.to_dict(), saved.to_dict()
    diffs = [(section, key) for section in now for key in sorted(set(now[section]) | set(old[section]))
             if now[section].get(key) != old[section].get(key)]
    fatal = [f"{s}.{k}" for s, k in diffs if s in ("model", "objective") or (s, k) == ("data", "tokenizer")]
    if fatal:
        raise LmlabError(f"--resume with a different {', '.join(fatal)} than the run was started with",
                         "resume with the run's own config (RUN_DIR/config.toml) or start a new run")
    changed = [f"{s}.{k}" for s, k in diffs if not (s == "train" and k in RESUME_FREE_KEYS)]
    if changed:
        trainer.log(f"warning: resuming with changed {', '.join(changed)}: the continued run will differ "
                    "from an uninterrupted one")


def save(trainer) -> None:
    """Checkpoint the run at its current step (every rank takes part; rank 0 writes)."""
    tensors, sharded = {}, None
    if trainer.info.mode != "fsdp":
        tensors, opt_meta = optimizer_state(trainer.optimizer)
        for k, v in trainer.objective.state_dict().items():
            tensors[f"objective.{k}"] = v.detach().cpu()
    else:
        opt_meta, sharded = {"param_groups": []}, _save_shards(trainer)
    tensors.update(random_streams())
    state = ResumeState(trainer.step, trainer.position, trainer.tokens, trainer.elapsed())
    meta = {**state.meta(), "epoch": trainer.windows.epoch_of(trainer.position),
            "rows_per_step": trainer.rows_per_step, "world_size": trainer.info.world_size,
            "optimizer": opt_meta, "initial_val": trainer.initial_val, "config": trainer.cfg.to_dict(),
            "machine": {"threads": trainer.machine.threads, "precision": trainer.machine.precision}}
    model = trainer.model
    if trainer.info.mode == "fsdp":  # gather the full weights (collective) into a CPU copy
        full = dist_.full_state_dict(trainer.model, trainer.info)
        if trainer.info.is_main:
            from lmlab.models import build_model

            model = build_model(trainer.model_config, heads=trainer.model.head_names)
            model.load_state_dict(full)
            model.tokenizer = trainer.model.tokenizer
    if trainer.info.is_main:
        trainer.checkpointer.save(trainer.step, model, tensors, meta, sharded=sharded)
    dist_.barrier(trainer.info)


def _save_shards(trainer) -> Path:
    """FSDP: every rank writes its shards beside the checkpoint; rank 0 moves them in."""
    folder = trainer.run_dir / CHECKPOINTS
    sharded = folder / derived_name(f"step_{trainer.step}", folder, f"tmp-{trainer.rank0_pid}-sharded")
    if trainer.info.is_main:  # marked as this process's, so a killed run's shards are removed next start
        sharded.mkdir(parents=True, exist_ok=True)
        start_temporary(sharded, "checkpoint shards")
    dist_.barrier(trainer.info)
    dist_.save_sharded(trainer.step_module, trainer.optimizer, sharded)
    dist_.barrier(trainer.info)
    return sharded


def restore(trainer, path: Path) -> None:
    """Continue the run from the checkpoint ``path``, after checking that it fits this run."""
    tensors, meta, weights = trainer.checkpointer.read(path)
    trainer.windows.check_position(meta["data_position"], str(path / "train_state.json"))  # before any walk
    sharded = path / SHARDED
    if (trainer.info.mode == "fsdp") != sharded.is_dir():
        saved_as = "FSDP (sharded)" if sharded.is_dir() else "a single process or DDP"
        raise LmlabError(f"{path} was written by a run with {saved_as}, this one runs {trainer.info.mode}",
                         "resume with the run's own train.distributed (and torchrun for FSDP)")
    _check_tokenizer(path, trainer.model.tokenizer)
    if trainer.info.mode == "fsdp":  # weights, objective and optimizer state, each rank its shards
        dist_.load_sharded(trainer.step_module, trainer.optimizer, sharded)
    else:
        _load_weights_and_optimizer(trainer, path, tensors, meta, weights)
    restore_random_streams(tensors)
    state = ResumeState.from_meta(meta)
    trainer.step, trainer.tokens, trainer.position = state.step, state.tokens, state.data_position
    trainer.initial_val = meta.get("initial_val")
    trainer.elapsed0 = state.elapsed_s
    if trainer.info.is_main:
        trainer.metrics.truncate_after(trainer.step)
    trainer.log(f"resumed from {path} at step {trainer.step} (data position {trainer.position:,} windows, "
                f"epoch {trainer.windows.epoch_of(trainer.position):.2f})")


def _check_tokenizer(path: Path, tokenizer) -> None:
    from lmlab.models import read_checkpoint_meta
    from lmlab.models.checkpoint import tokenizer_matches

    if not tokenizer_matches(read_checkpoint_meta(path), tokenizer):
        raise LmlabError(f"{path} was trained with another tokenizer than the one the data gives now "
                         "(same size, other tokens): resuming would feed it ids that mean other words",
                         "resume with the run's own data and tokenizer, or start a new run")


def _load_weights_and_optimizer(trainer, path: Path, tensors, meta, weights) -> None:
    from lmlab.models.checkpoint import load_state

    check_train_tensors(path, tensors, meta, trainer.optimizer, trainer.objective)
    load_state(trainer.model, weights, str(path))
    objective = {k[len("objective."):]: v for k, v in tensors.items() if k.startswith("objective.")}
    if objective:
        trainer.objective.load_state_dict(objective)
    restore_optimizer(trainer.optimizer, tensors, meta["optimizer"])
