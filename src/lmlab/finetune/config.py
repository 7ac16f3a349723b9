"""Fine-tuning hyper-parameters: one dataclass, checked once, with the usual BERT/GPT defaults.

Defaults follow the BERT paper's fine-tuning recipe (Devlin et al. 2019, appendix A.3): AdamW
(Loshchilov & Hutter 2019) with weight decay 0.01, learning rate in {2,3,5}e-5, batch 32, 2-4
epochs, linear warmup over the first 10% of steps then linear decay to 0. The task options
(``max_length``...) are passed on to :class:`lmlab.tasks.TaskOptions`; None keeps the task's own
default (e.g. 384 tokens for SQuAD).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lmlab.errors import LmlabError

#: FinetuneConfig fields that are task options (forwarded to lmlab.tasks.make_task)
TASK_OPTION_FIELDS = ("max_length", "doc_stride", "max_answer_length", "lm_weight", "decoder_style",
                      "max_target_length", "prefix", "rouge_stemmer", "format", "header", "delimiter",
                      "fields", "template", "packing")


#: the learning rates ``lr = "auto"`` tries, each a full fine-tuning run, the best on dev kept (the
#: BERT paper's recipe, Devlin et al. 2019 §A.3, with a range wide enough for tiny and base models)
LR_SWEEP = (1e-4, 3e-4, 1e-3)


@dataclass
class FinetuneConfig:
    lr: float | str = 5e-5                # or "auto": a sweep over lr_sweep, selected on dev
    lr_sweep: tuple[float, ...] = LR_SWEEP
    batch_size: int = 32
    group_by_length: bool = True          # batches of similar lengths (less padding); see epoch_batches
    eval_batch_size: int = 64
    epochs: int = 3
    max_steps: int | None = None          # stops early when set (and overrides epochs when larger)
    warmup_ratio: float = 0.1             # share of all steps spent warming up
    warmup_steps: int | None = None       # overrides warmup_ratio
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0                # max global gradient norm; 0 = no clipping
    seed: int = 0
    eval_every: int | None = None         # evaluate every N steps too (default: at each epoch end)
    log_every: int = 10
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    select_metric: str | None = None      # dev metric that picks the best checkpoint (task's main one)
    on_bad_line: str = "error"
    max_bad_fraction: float = 0.01        # with on_bad_line="skip": more malformed rows stop the run
    device: str = "auto"
    precision: str = "auto"               # auto = bf16 autocast on a CUDA GPU that has it, else fp32
    threads: int | None = None
    progress: bool = True
    loggers: tuple[str, ...] = ()         # also write the metrics rows there, e.g. ("tensorboard",)
    save_every: int | None = None         # resume state every N steps (default: after each evaluation)
    # task options (None = the task's default)
    max_length: int | None = None
    doc_stride: int | None = None
    max_answer_length: int | None = None
    lm_weight: float | None = None
    decoder_style: str | None = None
    max_target_length: int | None = None
    prefix: str | None = None
    rouge_stemmer: bool | None = None
    template: str | None = None           # instruct: the prompt template text (None = the default)
    packing: bool | None = None           # instruct: several examples per row (None = on for decoders)
    # how data files are read (lmlab.tasks.tables; None = from the extension / decided / the defaults)
    format: str | None = None
    header: bool | None = None
    delimiter: str | None = None
    fields: dict[str, str | int] | None = None   # role -> column name or 0-based index

    def validate(self) -> FinetuneConfig:
        def check(ok: bool, name: str, fix: str):
            if not ok:
                raise LmlabError(f"{name} = {getattr(self, name)!r} is not allowed", fix)

        number = isinstance(self.lr, (int, float)) and not isinstance(self.lr, bool)
        check(self.lr == "auto" or (number and self.lr > 0), "lr",
              "use a positive learning rate, e.g. 5e-5, or 'auto'")
        check(len(self.lr_sweep) >= 1 and all(isinstance(x, (int, float)) and x > 0 for x in self.lr_sweep),
              "lr_sweep", "list positive learning rates, e.g. [1e-4, 3e-4, 1e-3]")
        for name in ("batch_size", "eval_batch_size", "epochs", "log_every"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, f"use a positive integer for {name}")
        for name in ("max_steps", "warmup_steps", "eval_every", "max_train_examples", "max_eval_examples",
                     "threads", "save_every"):
            v = getattr(self, name)
            check(v is None or (isinstance(v, int) and v >= (0 if name == "warmup_steps" else 1)), name,
                  f"use a positive integer for {name} (or leave it unset)")
        check(0 <= self.warmup_ratio < 1, "warmup_ratio", "use a fraction in [0, 1), e.g. 0.1")
        check(self.weight_decay >= 0, "weight_decay", "use a non-negative value, e.g. 0.01")
        check(self.grad_clip >= 0, "grad_clip", "use a non-negative value (0 = no clipping)")
        check(self.on_bad_line in ("error", "skip"), "on_bad_line", "use 'error' or 'skip'")
        check(isinstance(self.max_bad_fraction, (int, float)) and 0 <= self.max_bad_fraction <= 1,
              "max_bad_fraction", "use a fraction in [0, 1], e.g. 0.01")
        check(self.precision in ("auto", "fp32", "bf16"), "precision", "use auto, fp32 or bf16")
        from lmlab.train.loggers import check_loggers

        check_loggers(self.loggers, "loggers")
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FinetuneConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise LmlabError(f"unknown fine-tuning settings {unknown}",
                             f"use some of: {', '.join(sorted(names))}")
        data = {k: (tuple(v) if k in ("betas", "lr_sweep", "loggers") and isinstance(v, (list, tuple)) else v)
                for k, v in data.items()}  # anything else is left for validate() to name
        return cls(**data).validate()

    def task_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in TASK_OPTION_FIELDS if getattr(self, k) is not None}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
