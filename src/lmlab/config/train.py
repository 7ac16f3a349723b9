"""``[train]``: a pretraining run's optimisation, evaluation, checkpoints and machine."""

from __future__ import annotations

from dataclasses import field

from pydantic.dataclasses import dataclass

from lmlab.config.overrides import NOWHERE, Origin
from lmlab.config.rules import Needs, SettingNames, check_rules, settings_given
from lmlab.errors import LmlabError
from lmlab.values import (
    Count,
    Device,
    Epsilon,
    Fraction,
    GradAccum,
    GradClip,
    LearningRate,
    MinLearningRate,
    Seed,
    Size,
    Text,
    Tflops,
    Threads,
    WeightDecay,
    choice,
)

SCHEDULES = ("cosine", "linear", "constant")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DISTRIBUTED = ("auto", "ddp", "fsdp")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
ATTENTION = ("auto", "sdpa", "flex")
PROGRESS = ("auto", "on", "off")
# the enumerated keys, as value types (lmlab.values)
Schedule = choice(*SCHEDULES)
Precision = choice(*PRECISIONS)
Distributed = choice(*DISTRIBUTED)
CompileBackend = choice(*COMPILE_BACKENDS)
Attention = choice(*ATTENTION)
Progress = choice(*PROGRESS)
#: the schedules that decay (``constant`` keeps ``lr``: :func:`lmlab.train.optim.warmup_decay_lr`)
DECAYING = tuple(s for s in SCHEDULES if s != "constant")
#: what a ``[train]`` setting needs of the others, by field name (:mod:`lmlab.config.rules`): the
#: one statement of them, for recipes, ``--set``, the Python ``pretrain(...)`` and a grid's
#: ``pretrain.train`` and arms' ``train`` (:func:`check_train_rules`)
RULES = (
    Needs("compile_backend", "compile", (True,), why="the backend torch.compile runs"),
    Needs("decay_steps", "schedule", DECAYING, why="the step the decay ends at"),
    Needs("min_lr", "schedule", DECAYING, why="the rate the decay ends at"),
)


@dataclass
class TrainConfig:
    """``[train]``: optimisation, evaluation, checkpoints and the machine.

    Batch: ``batch_size`` rows of ``seq_len`` tokens per forward pass and process; one optimizer
    step sees ``batch_size * grad_accum * world_size`` rows (the global batch).
    Schedule: linear warmup over ``warmup_steps`` to ``lr``, then ``cosine``/``linear`` decay to
    ``min_lr`` at ``decay_steps`` (0 = ``max_steps``), ``min_lr`` after; ``constant`` keeps ``lr``.
    Keep ``decay_steps`` fixed to extend a run (``max_steps``) without changing its past.
    Speed: ``compile`` runs the model through ``torch.compile`` (``compile_backend``: inductor,
    the default; aot_eager or eager to debug); ``activation_checkpointing`` recomputes each
    block's activations in the backward pass (less memory, ~1/3 more compute); ``peak_tflops``
    is the device's peak for the MFU column (0 = looked up for known GPUs; none on CPUs);
    ``attention`` picks how packed documents are masked: ``flex`` (block-sparse FlexAttention),
    ``sdpa`` (a dense mask), ``auto`` (flex on CUDA, sdpa on CPUs); ``prefetch`` reads the next
    step's windows on a background thread while this step computes (same numbers either way;
    :mod:`lmlab.train.prefetch`). ``loggers``: where the
    metrics rows also go (``["tensorboard"]``; :mod:`lmlab.train.loggers`).
    """

    max_steps: Count = 1000
    batch_size: Count = 16  # a batch too large for the memory: _check_batch_fits
    seq_len: Count = 128
    lr: LearningRate = 1e-3
    min_lr: MinLearningRate = 1e-4
    warmup_steps: Size = 100
    decay_steps: Size = 0
    schedule: Schedule = "cosine"
    weight_decay: WeightDecay = 0.1
    betas: list[Fraction] = field(default_factory=lambda: [0.9, 0.95])
    eps: Epsilon = 1e-8
    grad_accum: GradAccum = 1
    clip: GradClip = 1.0
    eval_every: Count = 100
    eval_batches: Size = 20
    eval_at_start: bool = True
    checkpoint_every: Count = 500
    keep_checkpoints: Size = 3
    log_every: Count = 1
    seed: Seed = 0
    threads: Threads = 0
    precision: Precision = "auto"
    device: Device = "auto"
    distributed: Distributed = "auto"
    progress: Progress = "auto"
    compile: bool = False
    compile_backend: CompileBackend = "inductor"
    activation_checkpointing: bool = False
    peak_tflops: Tflops = 0.0
    attention: Attention = "auto"
    prefetch: bool = True
    loggers: list[Text] = field(default_factory=list)


def check_train_rules(train: TrainConfig, keys, origin: Origin = NOWHERE) -> None:
    """A setting of ``keys`` (the ``[train]`` keys written) whose partner makes it do nothing
    (:data:`RULES`), refused in one line named where it was written (``origin``). Only a value that
    is not the default counts as given: a saved config (``RUN_DIR/config.toml``) writes every key."""
    import dataclasses

    defaults = TrainConfig()
    given, turned_off = settings_given(RULES, [k for k in keys if hasattr(defaults, k)],
                                       lambda n: getattr(train, n), lambda n: getattr(defaults, n),
                                       "train", origin)
    for name in turned_off:
        setattr(train, name, getattr(defaults, name))
    for rule in RULES:
        if rule.flag not in given:
            continue
        # each named as written; a partner not written is named in the setting's table (a grid's
        # pretrain.train.compile beside pretrain.train.compile_backend)
        table = origin.written_as(f"train.{rule.flag}")[:-len(rule.flag)]
        names = SettingNames("key", names={f.name: (origin.written_as(f"train.{f.name}")
                                                    if f.name in keys else table + f.name)
                                           for f in dataclasses.fields(TrainConfig)})
        try:
            check_rules([rule], given, lambda name: getattr(train, name), names)
        except LmlabError as e:  # the problem names the setting where it was written, the fix by its key
            raise origin.naming(e, f"train.{e.setting}", names.of(e.setting)) from None
