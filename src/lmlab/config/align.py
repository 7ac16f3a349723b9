"""``[align]``: preference-tuning hyper-parameters, one typed section checked once.

Defaults follow the DPO paper (Rafailov et al. 2023, sec. 6 and appendix B: β = 0.1, RMSprop at
1e-6 with warmup for billion-parameter models) scaled to small models: AdamW at 5e-5 (a model of
a few million parameters barely moves at 1e-6), linear warmup over the first 10% of the steps then
linear decay to 0, no weight decay, the global gradient norm clipped at 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic.dataclasses import dataclass

from lmlab.config.overrides import suggest
from lmlab.errors import LmlabError
from lmlab.values import (
    COUNT_MAX,
    BatchSize,
    Count,
    Device,
    Fraction,
    GradAccum,
    GradClip,
    LabelSmoothing,
    LearningRate,
    PositiveWeight,
    Seed,
    Size,
    Temperature,
    Text,
    Threads,
    WeightDecay,
    choice,
    whole,
)

METHODS = ("dpo", "rlhf")
#: the DPO losses of lmlab.align.dpo
LOSSES = ("sigmoid", "ipo")
#: the labelled tasks whose files align reads as pairs (the templates of lmlab.align.from_task)
TASKS = ("sst2", "cola", "rte", "mrpc")


def check_dpo_options(beta: float, loss: str, label_smoothing: float) -> None:
    if not beta > 0:
        raise LmlabError(f"beta must be > 0, got {beta}", "e.g. --beta 0.1 (larger keeps the policy closer "
                         "to the reference)")
    if loss not in LOSSES:
        raise LmlabError(f"unknown DPO loss {loss!r}", f"choose one of: {', '.join(LOSSES)}")
    if not 0 <= label_smoothing < 0.5:
        raise LmlabError(f"label smoothing must be in [0, 0.5), got {label_smoothing}",
                         "it is the assumed share of flipped labels, e.g. 0.1 (0 = plain DPO)")
    if loss == "ipo" and label_smoothing:
        raise LmlabError('label_smoothing applies only with loss="sigmoid" (the IPO loss has no label '
                         'smoothing)', 'use loss="sigmoid", or drop label_smoothing')


#: how a malformed data line is handled; the autocast precision
OnBadLine = choice("error", "skip")
Precision = choice("auto", "fp32", "bf16")
Method = choice(*METHODS)
DpoLoss = choice(*LOSSES)
#: tokens per prompt + response: at least a prompt token and a response token
Length = whole(2, COUNT_MAX, hint="a whole number of at least 2 (a prompt and a response token), e.g. 256")


@dataclass
class AlignConfig:
    """Every field's type (:mod:`lmlab.values`) is its range, checked by :meth:`from_dict` before
    anything is read; :meth:`validate` checks what relates fields to each other."""

    method: Method = "dpo"
    beta: PositiveWeight = 0.1            # DPO: how far from the reference; RLHF: weight of the KL penalty
    loss: DpoLoss = "sigmoid"             # DPO loss: sigmoid (DPO) or ipo
    label_smoothing: LabelSmoothing = 0.0  # conservative DPO's assumed share of flipped preferences
    lr: LearningRate = 5e-5
    epochs: Count = 1
    max_steps: Count | None = None        # overrides epochs
    batch_size: BatchSize = 16            # pairs per micro-batch
    grad_accum: GradAccum = 1                 # micro-batches per optimizer step
    eval_batch_size: BatchSize = 32
    eval_every: Count | None = None       # default: 10 evaluations over the run (and one at step 0)
    save_every: Count | None = None       # DPO's resume state every N steps (default: after each evaluation)
    log_every: Count = 10
    warmup_ratio: Fraction = 0.1
    weight_decay: WeightDecay = 0.0
    betas: tuple[Fraction, Fraction] = (0.9, 0.999)
    grad_clip: GradClip = 1.0             # max global gradient norm; 0 = no clipping
    max_length: Length = 256              # tokens per prompt + response
    eos: bool = False                     # end decoder responses with EOS (encoder-decoders always do)
    dropout: bool = False                 # keep the policy's dropout on (off: policy and reference agree)
    task: Text | None = None              # read train/dev as this labelled task's files (from_task.TEMPLATES)
    max_train_examples: Count | None = None
    max_eval_examples: Count | None = None
    on_bad_line: OnBadLine = "error"
    seed: Seed = 0
    device: Device = "auto"
    precision: Precision = "auto"         # auto = bf16 autocast on a CUDA GPU that has it, else fp32
    threads: Threads | None = None        # None or 0: OMP_NUM_THREADS, else auto (lmlab.runtime)
    progress: bool = True
    # RLHF (method "rlhf"): supervised warm-up, the reward model's own training, then the policy phase
    sft_steps: Size = 0                   # steps of supervised training on the chosen responses first
    reward_steps: Count = 200             # Bradley-Terry steps of the reward model
    reward_lr: LearningRate = 1e-4
    samples: BatchSize = 4                # responses sampled per prompt (their mean reward is the baseline)
    max_new_tokens: Count = 8             # longest sampled response
    temperature: Temperature = 1.0        # sampling temperature of the policy

    def validate(self) -> AlignConfig:
        """What relates fields to each other (each field's range is its type, checked by from_dict)."""
        def check(ok: bool, name: str, fix: str):
            if not ok:
                raise LmlabError(f"{name} = {getattr(self, name)!r} is not allowed", fix)

        check_dpo_options(self.beta, self.loss, self.label_smoothing)
        check(self.method != "rlhf" or self.samples >= 2, "samples",
              "sample at least 2 responses per prompt (their mean reward is the baseline)")
        check(self.task is None or self.task in TASKS, "task",
              f"choose one of: {', '.join(TASKS)} (or write the pairs as JSON Lines)")
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AlignConfig:
        """The config of ``data`` (field -> value), every value checked against its field's type."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise LmlabError(f"unknown preference-tuning setting {key!r}", suggest(key, names))
        from lmlab.config.fields import build_section  # the one typed check (strings stay strings)

        return build_section(cls, dict(data), "align", what="preference-tuning setting").validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
