"""Preference-tuning hyper-parameters: one dataclass, checked once.

Defaults follow the DPO paper (Rafailov et al. 2023, sec. 6 and appendix B: β = 0.1, RMSprop at
1e-6 with warmup for billion-parameter models) scaled to small models: AdamW at 5e-5 (a model of
a few million parameters barely moves at 1e-6), linear warmup over the first 10% of the steps then
linear decay to 0, no weight decay, the global gradient norm clipped at 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lmlab.align.dpo import check_dpo_options
from lmlab.errors import LmlabError

METHODS = ("dpo", "rlhf")


@dataclass
class AlignConfig:
    method: str = "dpo"
    beta: float = 0.1                     # DPO: how far from the reference; RLHF: weight of the KL penalty
    loss: str = "sigmoid"                 # DPO loss: sigmoid (DPO) or ipo
    label_smoothing: float = 0.0          # conservative DPO's assumed share of flipped preferences
    lr: float = 5e-5
    epochs: int = 1
    max_steps: int | None = None          # overrides epochs
    batch_size: int = 16                  # pairs per micro-batch
    grad_accum: int = 1                   # micro-batches per optimizer step
    eval_batch_size: int = 32
    eval_every: int | None = None         # default: 10 evaluations over the run (and one at step 0)
    log_every: int = 10
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0                # max global gradient norm; 0 = no clipping
    max_length: int = 256                 # tokens per prompt + response
    eos: bool = False                     # end decoder responses with EOS (encoder-decoders always do)
    dropout: bool = False                 # keep the policy's dropout on (off: policy and reference agree)
    task: str | None = None               # read train/dev as this labelled task's files (from_task.TEMPLATES)
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    on_bad_line: str = "error"
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"               # auto = bf16 autocast on a CUDA GPU that has it, else fp32
    threads: int | None = None
    progress: bool = True
    # RLHF (method "rlhf"): supervised warm-up, the reward model's own training, then the policy phase
    sft_steps: int = 0                    # steps of supervised training on the chosen responses first
    reward_steps: int = 200               # Bradley-Terry steps of the reward model
    reward_lr: float = 1e-4
    samples: int = 4                      # responses sampled per prompt (their mean reward is the baseline)
    max_new_tokens: int = 8               # longest sampled response
    temperature: float = 1.0              # sampling temperature of the policy

    def validate(self) -> AlignConfig:
        def check(ok: bool, name: str, fix: str):
            if not ok:
                raise LmlabError(f"{name} = {getattr(self, name)!r} is not allowed", fix)

        check(self.method in METHODS, "method", f"choose one of: {', '.join(METHODS)}")
        check_dpo_options(self.beta, self.loss, self.label_smoothing)
        for name in ("lr", "reward_lr", "temperature"):
            v = getattr(self, name)
            check(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, name,
                  f"use a positive number for {name}")
        for name in ("epochs", "batch_size", "grad_accum", "eval_batch_size", "log_every", "max_length",
                     "reward_steps", "samples", "max_new_tokens"):
            v = getattr(self, name)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name,
                  f"use a positive integer for {name}")
        check(self.max_length >= 2, "max_length",
              "use at least 2 tokens (a prompt token and a response token), e.g. 256")
        check(isinstance(self.sft_steps, int) and self.sft_steps >= 0, "sft_steps",
              "use a non-negative integer (0 = no supervised warm-up)")
        for name in ("max_steps", "eval_every", "max_train_examples", "max_eval_examples", "threads"):
            v = getattr(self, name)
            check(v is None or (isinstance(v, int) and v >= 1), name,
                  f"use a positive integer for {name} (or leave it unset)")
        check(self.method != "rlhf" or self.samples >= 2, "samples",
              "sample at least 2 responses per prompt (their mean reward is the baseline)")
        check(0 <= self.warmup_ratio < 1, "warmup_ratio", "use a fraction in [0, 1), e.g. 0.1")
        check(self.weight_decay >= 0, "weight_decay", "use a non-negative value, e.g. 0.0")
        check(self.grad_clip >= 0, "grad_clip", "use a non-negative value (0 = no clipping)")
        from lmlab.align.from_task import TEMPLATES

        check(self.task is None or self.task in TEMPLATES, "task",
              f"choose one of: {', '.join(TEMPLATES)} (or write the pairs as JSON Lines)")
        check(self.on_bad_line in ("error", "skip"), "on_bad_line", "use 'error' or 'skip'")
        check(self.precision in ("auto", "fp32", "bf16"), "precision", "use auto, fp32 or bf16")
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AlignConfig:
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise LmlabError(f"unknown preference-tuning setting {key!r}",
                                 f"use some of: {', '.join(names)}")
        if isinstance(data.get("betas"), list):
            data = {**data, "betas": tuple(data["betas"])}
        return cls(**data).validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
