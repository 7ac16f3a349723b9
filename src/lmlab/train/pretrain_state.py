"""A pretraining run's checkpoints through the one resume format
(:class:`lmlab.train.components.Checkpointer`): what it saves, what a resume checks and restores.

The functions take the :class:`lmlab.train.loop.Trainer` whose run they save or continue.
"""

from __future__ import annotations

from pathlib import Path

from lmlab.data.shards import INDEX_FILE
from lmlab.errors import LmlabError
from lmlab.ownership import derived_name, start_temporary
from lmlab.train import distributed as dist_
from lmlab.train.checkpoint import (
    CHECKPOINTS,
    SHARDED,
    check_checkpoint_names,
    check_train_tensors,
    latest_checkpoint,
    read_train_state,
    set_aside_damaged,
)
from lmlab.train.components.checkpointer import optimizer_state, restore_optimizer
from lmlab.train.components.identity import fingerprint, how_it_differs, same
from lmlab.train.components.resume_state import ResumeState, random_streams, restore_random_streams
from lmlab.train.config import DataConfig, RunConfig, load_config, read_toml
from lmlab.train.data import expand, resolve
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


def run_inputs(data: DataConfig) -> dict[str, list[Path]]:
    """The files and folders a run's ``[data]`` reads, by setting: ``data.train``, ``data.val``
    and, for text, ``data.tokenizer`` (its folder, or the text files a table trains it on; token
    shards bring their own tokenizer, inside ``data.train``)."""
    out = {"data.train": resolve(data.train, "data.train")}
    if data.val:
        out["data.val"] = resolve(data.val, "data.val")
    tok = data.tokenizer
    if any((p / INDEX_FILE).is_file() for p in out["data.train"]):
        return out
    if isinstance(tok, str) and tok:
        out["data.tokenizer"] = [Path(expand(tok))]
    elif isinstance(tok, dict) and tok.get("input"):
        given = tok["input"]
        out["data.tokenizer"] = resolve([given] if isinstance(given, str) else given, "data.tokenizer.input")
    elif isinstance(tok, dict):
        out["data.tokenizer"] = out["data.train"]  # trained on the training text
    return out


def input_identity(data: DataConfig, known: dict | None = None) -> dict[str, dict]:
    """What the run reads, by content (:mod:`lmlab.train.components.identity`), saved with every
    checkpoint (``inputs``); ``known``: the saved one, whose digests are reused for untouched files."""
    known = known if isinstance(known, dict) else {}
    roles = run_inputs(data)
    out: dict[str, dict] = {}
    for role, paths in roles.items():
        again = next((out[r] for r in out if roles[r] == paths), None)  # the same files: hashed once
        out[role] = again if again is not None else fingerprint(paths, known.get(role))
    return out


def check_max_steps_reach(max_steps: int, step: int, checkpoint: Path | None,
                          key: str = "train.max_steps") -> None:
    """One-line error, before any work, when a resume's ``max_steps`` is below the ``step`` its
    ``checkpoint`` reached: the run would train nothing, report the old steps as trained and record
    a config.toml whose max_steps the run is already past. ``max_steps`` equal to the step is a
    finished run resumed (nothing to do, as a grid re-run does)."""
    if checkpoint is not None and max_steps < step:
        raise LmlabError(f"{key} {max_steps} is below step {step}, which the run to resume has reached "
                         f"({checkpoint}); nothing was trained or written",
                         f"set {key} to {step} or more to continue it (--set {key}={step + 1} trains one "
                         "more step), or start a new run with another --out")


def check_run_dir(trainer) -> Path | None:
    """The checkpoint to resume from (None: start), or a one-line error for a run folder that holds
    a run without ``--resume``, or a resume with another model, objective or tokenizer (by setting
    or by content). Sets ``trainer.inputs``, the run's :func:`input_identity`."""
    existing = latest_checkpoint(trainer.run_dir, trainer.log)
    if not trainer.resume and existing is not None:
        raise LmlabError(f"{trainer.run_dir} already holds a run (checkpoint {existing.name})",
                         "pass --resume to continue it, or choose a new --out")
    state = read_train_state(existing) if existing is not None else {}
    check_max_steps_reach(trainer.cfg.train.max_steps, state.get("step", 0), existing, "train.max_steps")
    # the names of the checkpoints it will write are free, or its own to replace: before any work
    check_checkpoint_names(trainer.run_dir, state.get("step", 0), trainer.cfg.train.max_steps)
    if existing is None:
        if trainer.resume:
            trainer.log(f"resume: no checkpoint in {trainer.run_dir / 'checkpoints'}, starting from scratch")
        trainer.inputs = input_identity(trainer.cfg.data)
        return None
    if trainer.info.is_main:  # one process renames; the resumed run writes those steps again
        set_aside_damaged(trainer.run_dir, trainer.log)
    saved_inputs = state.get("inputs")  # None: saved by an lmlab before inputs
    trainer.inputs = input_identity(trainer.cfg.data, saved_inputs)
    saved_path = trainer.run_dir / "config.toml"
    saved = load_config(read_toml(saved_path)) if saved_path.is_file() else None
    compare_configs(trainer, saved, saved_inputs)
    return existing


def compare_configs(trainer, saved: RunConfig | None, saved_inputs: dict | None = None) -> None:
    """A resume with another model, objective or tokenizer (its setting, or the contents of its
    folder or of the text it is trained on) is refused; other changes (settings, the contents of
    the data) are said in a warning. A data path that changed while its contents did not is no
    change. ``saved_inputs``: the :func:`input_identity` the checkpoint recorded (None: none)."""
    now = trainer.cfg.to_dict()
    old = saved.to_dict() if saved is not None else now
    diffs = [(section, key) for section in now for key in sorted(set(now[section]) | set(old[section]))
             if now[section].get(key) != old[section].get(key)]
    before, inputs = saved_inputs or {}, trainer.inputs if saved_inputs is not None else {}
    content = sorted(r for r in set(before) | set(inputs) if not same(before.get(r), inputs.get(r)))

    def moved(section: str, key: str) -> bool:  # another path, the same contents
        role = f"{section}.{key}"
        folders = key != "tokenizer" or all(isinstance(c[section].get(key), str) for c in (old, now))
        return role in before and role in inputs and role not in content and folders

    diffs = [(s, k) for s, k in diffs if not moved(s, k)]
    fatal = [f"{s}.{k}" for s, k in diffs if s in ("model", "objective") or (s, k) == ("data", "tokenizer")]
    if fatal:
        raise LmlabError(f"--resume with a different {', '.join(fatal)} than the run was started with",
                         "resume with the run's own config (RUN_DIR/config.toml) or start a new run")
    trained = not isinstance(now["data"].get("tokenizer"), str)  # a table: the tokenizer is trained on text
    names = {"data.tokenizer": "the text data.tokenizer is trained on"} if trained else {}
    said = {r: f"{names.get(r, r)} {how_it_differs(before.get(r), inputs.get(r))}" for r in content}
    if "data.tokenizer" in said:
        raise LmlabError(f"--resume on another tokenizer than the run was started with: "
                         f"{said['data.tokenizer']}",
                         "resume with the run's own data and tokenizer, or start a new run (another --out)")
    changed = [f"{s}.{k}" for s, k in diffs if not (s == "train" and k in RESUME_FREE_KEYS)]
    if changed:
        trainer.log(f"warning: resuming with changed {', '.join(changed)}: the continued run will differ "
                    "from an uninterrupted one")
    data = [words for role, words in said.items() if role not in changed]  # a changed path: said above
    if data:
        trainer.log(f"warning: resuming on changed data: {', '.join(data)}: the continued run will differ "
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
            "inputs": trainer.inputs,
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
        start_temporary(sharded, "checkpoint shards", pid=trainer.rank0_pid)
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
