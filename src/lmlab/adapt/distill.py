"""Knowledge distillation: train a smaller student to imitate a (fine-tuned) teacher.

Hinton, Vinyals & Dean 2015 ("Distilling the Knowledge in a Neural Network"): the teacher's
output distribution softened by a temperature ``T``, ``p_T = softmax(z / T)``, carries more
information per example than the one-hot label (which wrong classes are *almost* right). The
student minimises a mix of the soft and the hard loss::

    L = alpha · T² · KL(p_T^teacher ‖ p_T^student)  +  (1 - alpha) · CE(z^student, y)

The ``T²`` keeps the soft term's gradients on the same scale as the hard term's when ``T``
changes (the soft gradients shrink as ``1/T²``). KL is averaged over the rows that carry a
prediction: examples for classification, selected positions for MLM (the lmlab MLM head returns
logits only there, identically for teacher and student), and positions with a next-token label
for causal LM heads. ``alpha=1`` is pure distillation, ``alpha=0`` ordinary training.

Student (Sanh et al. 2019, "DistilBERT"): the teacher's architecture with fewer layers,
initialised from the teacher, taking every k-th layer (``layers`` picks them explicitly), plus the
teacher's embeddings, pooler and heads; or freshly initialised (``init="fresh"``).

:func:`distillation_loss` is one step for any head (a batch of model inputs in, loss out) and
:func:`distill` a whole run on an :mod:`lmlab.tasks` task (AdamW, linear warmup and decay) through
the one fit loop (:class:`lmlab.train.components.FitLoop`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab import values
from lmlab.arguments import describe, model_argument, number_argument, optional_number, tensor_argument
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE, head_loss
from lmlab.setting_names import KEYWORDS, SettingNames


def soft_target_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 2.0,
                     mask: Tensor | None = None) -> Tensor:
    """``T² · KL(softmax(t/T) ‖ softmax(s/T))`` summed over classes, averaged over rows.

    Logits ``[..., C]``; ``mask`` (boolean, the leading shape) selects the rows that count.
    """
    tensor_argument(student_logits, "student_logits", kind="float")
    tensor_argument(teacher_logits, "teacher_logits", kind="float")
    if student_logits.shape != teacher_logits.shape:
        raise LmlabError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ in shape",
                         "distil into a student with the same heads, labels and vocabulary as the teacher")
    number_argument(values.Temperature, temperature, "temperature")  # the range of --temperature
    c = student_logits.shape[-1]
    s, t = student_logits.reshape(-1, c).float(), teacher_logits.reshape(-1, c).float()
    if mask is not None:
        keep = mask.reshape(-1).bool()
        s, t = s[keep], t[keep]
    if s.shape[0] == 0:
        return student_logits.sum() * 0.0
    log_p_s = F.log_softmax(s / temperature, dim=-1)
    log_p_t = F.log_softmax(t / temperature, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1).mean()
    return kl * temperature**2


def kd_loss(student_logits: Tensor, teacher_logits: Tensor, hard_loss: Tensor | None,
            temperature: float = 2.0, alpha: float = 0.5, mask: Tensor | None = None) -> Tensor:
    """``alpha · soft_target_loss + (1 - alpha) · hard_loss`` (``hard_loss`` may be None when alpha=1)."""
    number_argument(values.Probability, alpha, "alpha")  # the weight of the soft loss: --alpha's range
    if hard_loss is not None:
        tensor_argument(hard_loss, "hard_loss", dims=0, shape="a 0-d loss", kind="float")
    soft = soft_target_loss(student_logits, teacher_logits, temperature, mask) if alpha > 0 else 0.0
    if alpha == 1:
        return soft
    if hard_loss is None:
        raise LmlabError("the hard loss needs labels", "pass labels with the batch or use alpha=1")
    return alpha * soft + (1 - alpha) * hard_loss


def prediction_mask(model: nn.Module, logits: Tensor, inputs: dict[str, Tensor]) -> Tensor | None:
    """Which rows of ``logits`` are predictions to imitate (None = all of them)."""
    if logits.dim() != 3:
        return None  # [B, C] classification, [N, V] MLM (already the selected positions)
    labels, attn = inputs.get("labels"), inputs.get("attention_mask")
    if getattr(model, "architecture", "") == "decoder" and "lm" in getattr(model, "head_names", ()):
        # position i predicts token i+1: the last position predicts nothing
        if labels is not None and labels.shape == logits.shape[:2]:
            nxt = labels[:, 1:] != IGNORE
        elif attn is not None:
            nxt = attn[:, 1:].bool()
        else:
            nxt = torch.ones(logits.shape[0], logits.shape[1] - 1, dtype=torch.bool, device=logits.device)
        return F.pad(nxt, (0, 1), value=False)
    if labels is not None and labels.shape == logits.shape[:2]:
        return labels != IGNORE
    if attn is not None and attn.shape == logits.shape[:2]:
        return attn.bool()
    return None


def distillation_loss(student: nn.Module, teacher: nn.Module, inputs: dict[str, Tensor],
                      temperature: float = 2.0, alpha: float = 0.5) -> tuple[Tensor, dict[str, float]]:
    """One distillation step's loss for any lmlab head (classification, token labels, MLM, LM).

    ``inputs``: the keyword arguments of the models' forward, labels included (they give the hard
    loss, the model's own). The teacher runs without gradients. Returns ``(loss, {"soft", "hard"})``.
    """
    student = model_argument(student, "distillation_loss' student")
    teacher = model_argument(teacher, "distillation_loss' teacher")
    if not isinstance(inputs, dict):
        raise LmlabError(f"distillation_loss' inputs must be a dict of the models' keyword arguments, got "
                         f"{describe(inputs)}", "pass e.g. {'input_ids': ids, 'labels': labels}")
    if "span" in getattr(student, "head_names", ()):
        raise LmlabError("distillation of extractive-QA (span) heads is not supported",
                         "distil a classification, token-classification, MLM or LM head")
    number_argument(values.Probability, alpha, "alpha")
    number_argument(values.Temperature, temperature, "temperature")
    labels = inputs.get("labels")
    scoring = {k: v for k, v in inputs.items() if k != "labels"}  # models compute no loss
    s_out = student(**scoring)
    soft = torch.zeros((), device=s_out.logits.device)
    if alpha > 0:  # alpha = 0 (hard labels only) needs no teacher
        with torch.no_grad():
            t_out = teacher(**scoring)
        mask = prediction_mask(student, s_out.logits, inputs)
        soft = soft_target_loss(s_out.logits, t_out.logits, temperature, mask)
    hard_loss = None if labels is None else head_loss(student.head_names[0], s_out.logits, labels,
                                                      inputs.get("attention_mask"))
    if alpha < 1 and hard_loss is None:
        raise LmlabError("the hard loss needs labels", "pass labels with the batch or use alpha=1")
    loss = soft if alpha == 1 else alpha * soft + (1 - alpha) * hard_loss
    hard = float(hard_loss.detach()) if hard_loss is not None else float("nan")
    return loss, {"soft": float(soft.detach()), "hard": hard}


# --------------------------------------------------------------------------- student


def student_layers(n_teacher: int, n_student: int, names: SettingNames = KEYWORDS) -> list[int]:
    """Every k-th teacher layer, DistilBERT-style: ``[0, k, 2k, ...]`` with ``k = n_teacher / n_student``.
    ``names``: how the caller names ``n_layers`` in the error (``--layers`` on the command line)."""
    if not 1 <= n_student <= n_teacher:
        raise LmlabError(f"a student needs between 1 and {n_teacher} layers, got {n_student}",
                         f"choose {names.to_set('n_layers')} in 1..{n_teacher}")
    return [i * n_teacher // n_student for i in range(n_student)]


def chosen_layers(n_teacher: int, n_layers: int | None = None, layers: Sequence[int] | None = None,
                  names: SettingNames = KEYWORDS) -> list[int]:
    """The teacher layers a student copies: ``layers`` as given, else every k-th of ``n_layers``
    (default: half the teacher's), each checked against the ``n_teacher`` layers. Needs only the
    teacher's config, so ``lmlab compress distill`` checks it before the teacher's weights load."""
    if layers is None:
        return student_layers(n_teacher, n_layers or max(1, n_teacher // 2), names)
    layers = list(layers)
    bad = [i for i in layers if not 0 <= i < n_teacher]
    if not layers or bad:
        shown = ",".join(map(str, layers)) if names.style == "flag" else str(layers)
        lacks = f"names layers the {n_teacher}-layer teacher lacks ({', '.join(map(str, bad))})" if bad \
            else "names no layer"
        raise LmlabError(f"{names.to_set('layers')} {shown} {lacks}", f"pick indices in 0..{n_teacher - 1}")
    return layers


#: who refuses an int8 teacher (:func:`lmlab.models.refuse_int8`): a student copied from it
TEACHER_INIT_READER = "a student initialised from its teacher (--init teacher)"


def make_student(teacher: nn.Module, n_layers: int | None = None, layers: Sequence[int] | None = None,
                 init: str = "teacher", seed: int = 0, names: SettingNames = KEYWORDS) -> nn.Module:
    """A copy of ``teacher``'s architecture with fewer layers (same heads, vocabulary, tokenizer).

    ``layers``: teacher layer indices to copy (default :func:`student_layers`); ``init="teacher"``
    copies those layers, the embeddings, pooler and heads; ``"fresh"`` keeps the new random weights.
    ``names``: how the caller names its settings in errors (:class:`lmlab.setting_names.SettingNames`;
    ``lmlab compress distill`` passes its flags).
    """
    from lmlab.models import build_model

    teacher = model_argument(teacher, "make_student's teacher")
    optional_number(values.Count, n_layers, "make_student's n_layers")
    if layers is not None:
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
            raise LmlabError(f"make_student's layers must be a list of teacher layer numbers, got "
                             f"{describe(layers)}", "pass e.g. layers=[0, 2, 4]")
        number_argument(values.Layers, list(layers), "make_student's layers")
    number_argument(values.Seed, seed, "make_student's seed")
    arch = getattr(teacher, "architecture", "")
    if arch not in ("encoder", "decoder"):
        raise LmlabError(f"cannot build a student for a {arch or type(teacher).__name__} model",
                         "distil an encoder or decoder Transformer")
    if init not in ("teacher", "fresh"):
        raise LmlabError(f"unknown student init {init!r}", "use 'teacher' or 'fresh'")
    if init == "teacher":  # the student starts from the teacher's float weights, then trains
        from lmlab.models.checkpoint import refuse_int8

        refuse_int8(teacher, TEACHER_INIT_READER)
    cfg = teacher.config
    layers = chosen_layers(cfg.n_layers, n_layers, layers, names)
    torch.manual_seed(seed)
    student = build_model(dataclasses.replace(cfg, n_layers=len(layers)).validate(),
                          heads=tuple(teacher.head_names), architecture=arch)
    if init == "teacher":
        shared = getattr(cfg, "layer_groups", None)  # ALBERT: blocks are shared, copy them as they are
        src_of = {i: i for i in range(len(student.layers))} if shared else dict(enumerate(layers))
        t_state, state = teacher.state_dict(), {}
        for key, value in student.state_dict().items():
            src = key
            if key.startswith("layers."):
                _, i, rest = key.split(".", 2)
                src = f"layers.{src_of[int(i)]}.{rest}"
            if src in t_state and t_state[src].shape == value.shape:
                state[key] = t_state[src]
        student.load_state_dict(state, strict=False)
        if hasattr(student, "tie_weights"):
            student.tie_weights()
    student.tokenizer = getattr(teacher, "tokenizer", None)
    return student.to(next(teacher.parameters()).device)


# --------------------------------------------------------------------------- a task run


@dataclass
class DistillResult:
    student: nn.Module
    steps: int
    metrics: dict[str, float] | None          # dev metrics of the student at the end (when dev given)
    history: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0


def distill(teacher: nn.Module, student: nn.Module, task, train: Sequence, dev: Sequence | None = None, *,
            steps: int = 1000, batch_size: int = 32, lr: float = 5e-5, weight_decay: float = 0.01,
            warmup_ratio: float = 0.1, temperature: float = 2.0, alpha: float = 0.5, grad_clip: float = 1.0,
            seed: int = 0, log_every: int = 50, log: Callable[[str], None] | None = None) -> DistillResult:
    """Train ``student`` on ``task`` (an :class:`lmlab.tasks.Task` whose labels are fitted) from the
    ``teacher``'s soft targets and the hard labels of ``train`` (lists of Examples).

    ``alpha=0`` trains on the hard labels only (the baseline the distillation must beat).
    ``log`` (default: silent) hears the progress (a bar on a terminal, else a line every ~5% of the
    steps), an estimate of the run's time after its first steps and a one-line summary at the end.
    """
    from lmlab.tasks import check_tokenizer
    from lmlab.tasks.base import pad_id_of
    from lmlab.train.components import FitLoop, RunLogger
    from lmlab.train.engine import Engine
    from lmlab.train.estimate import duration
    from lmlab.train.optim import adamw, warmup_decay_lr

    teacher = model_argument(teacher, "distill's teacher")
    student = model_argument(student, "distill's student")
    from lmlab.models.checkpoint import refuse_int8

    refuse_int8(student, "distillation (it trains the student)")
    checks = ((values.Count, steps, "steps"), (values.BatchSize, batch_size, "batch_size"),
              (values.LearningRate, lr, "lr"), (values.WeightDecay, weight_decay, "weight_decay"),
              (values.Fraction, warmup_ratio, "warmup_ratio"),
              (values.Temperature, temperature, "temperature"),
              (values.Probability, alpha, "alpha"), (values.GradClip, grad_clip, "grad_clip"),
              (values.Seed, seed, "seed"), (values.Count, log_every, "log_every"))
    for kind, value, name in checks:
        number_argument(kind, value, f"distill's {name}")  # each the range of its flag or recipe key
    tok = check_tokenizer(student)
    t_tok = getattr(teacher, "tokenizer", None)
    if t_tok is not None and t_tok.vocab_size != tok.vocab_size:
        raise LmlabError("teacher and student tokenizers differ",
                         "build the student with make_student(teacher)")
    feats = task.features(list(train), tok)
    if not feats:
        raise LmlabError("no training examples to distil on", "pass a non-empty training file")
    from lmlab.config.fits import batch_for_data

    # a batch beyond the training data is one batch of all of it, counted as such below
    batch_size = batch_for_data(batch_size, len(feats), "examples", "batch_size", log)
    torch.manual_seed(seed)
    opt = adamw([student], lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)
    warmup = round(warmup_ratio * steps)
    engine = Engine(opt, lambda s: warmup_decay_lr(s, lr=lr, warmup=warmup, end=steps), clip=grad_clip)
    teacher.eval()
    student.train()
    t0 = time.perf_counter()
    say = log or (lambda msg: None)
    run_log = RunLogger(None, say)
    run_log.show_progress(steps, desc="distill", show="auto" if log else "off",
                          estimate={"hint": _shorter_distill_hint})
    run = DistillSteps(teacher, student, task, feats, pad_id_of(tok, student), batch_size, seed,
                       (temperature, alpha), run_log, log_every, steps)
    FitLoop(engine, steps, micro_batches=run.micro_batches, after_step=run.after_step,
            report=lambda *_: None).run(0)
    run_log.close()
    say(f"distill done in {duration(time.perf_counter() - t0)}: {steps:,} steps of {batch_size}, last "
        + _losses(run.last))
    student.eval()
    metrics = task.evaluate(student, list(dev)) if dev else None
    return DistillResult(student, steps, metrics, run_log.history, time.perf_counter() - t0)


class DistillSteps:
    """What the fit loop (:class:`lmlab.train.components.FitLoop`) runs for a distillation: each step
    a batch of the training features in a seeded random order, the teacher and the student on it."""

    def __init__(self, teacher: nn.Module, student: nn.Module, task, feats: list, pad: int, batch_size: int,
                 seed: int, mix: tuple[float, float], log, log_every: int, steps: int):
        self.teacher, self.student, self.task, self.feats, self.pad = teacher, student, task, feats, pad
        self.batch_size, (self.temperature, self.alpha) = batch_size, mix
        self.log, self.log_every, self.steps = log, log_every, steps
        self.device = next(student.parameters()).device
        self.gen = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.last: dict[str, float] = {}

    def micro_batches(self, step: int) -> list:
        from lmlab.tasks import collate

        if not self.order:
            self.order = torch.randperm(len(self.feats), generator=self.gen).tolist()
        idx, self.order = self.order[:self.batch_size], self.order[self.batch_size:]
        batch = collate([self.feats[i] for i in idx], self.pad, self.device)
        inputs = self.task.model_inputs(self.student, batch)
        return [lambda: distillation_loss(self.student, self.teacher, inputs, self.temperature, self.alpha)]

    def after_step(self, step: int, done, seconds: float) -> dict[str, float]:
        row = self.last = {"step": step, "loss": done.loss, **done.metrics}
        if step % self.log_every == 0 or step == self.steps:
            self.log.record(row)
        self.log.update(step, [_losses(row)], loss=f"{done.loss:.4f}")
        return row


def _losses(row: dict[str, float]) -> str:
    return f"loss {row['loss']:.4f} (soft {row['soft']:.4f}, hard {row['hard']:.4f})"


def _shorter_distill_hint(seconds_per_step: float) -> str:
    """Said after an estimate over half an hour."""
    from lmlab.train.estimate import duration

    steps = max(1, int(600 / seconds_per_step))
    return f"hint: that is long; --steps {steps:,} would take about {duration(600)}"


def agreement(task, a: nn.Module, b: nn.Module, examples: Sequence) -> float:
    """Share of ``examples`` on which two models predict the same label."""
    a, b = model_argument(a, "agreement's a"), model_argument(b, "agreement's b")
    was = a.training, b.training
    a.eval(), b.eval()
    try:
        with torch.no_grad():
            pa, pb = task.predict(a, list(examples)), task.predict(b, list(examples))
    finally:
        a.train(was[0]), b.train(was[1])
    return sum(x == y for x, y in zip(pa, pb)) / max(1, len(pa))
