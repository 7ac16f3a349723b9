"""The one fit loop and its components, shared by every lmlab training loop.

* :mod:`.fit`: :class:`FitLoop`, the loop that drives :meth:`lmlab.train.engine.Engine.step`
  step after step and asks its components when to evaluate, log, save and stop;
* :mod:`.resume_state`: :class:`ResumeState`, where a run stands (step, data position, tokens,
  time), and the random streams a resume restores;
* :mod:`.identity`: what a ``--resume`` must find unchanged, the inputs' fingerprints by content;
* :mod:`.output_resume`: :class:`~.output_resume.ResumeFolder`, the resume folder beside a
  command's output (``.OUT.resume/``): the start checks, the run's identity and the refusals that
  fine-tuning and DPO share;
* :mod:`.checkpointer`: :class:`Checkpointer`, the one resume format (``step_N/`` folders of
  ``train_state.json`` checked by :class:`lmlab.file_schemas.TrainStateFile`,
  ``train_state.safetensors`` and the weights), written atomically, pruned, read back whole;
* :mod:`.evaluator`: :class:`Evaluator`, when to evaluate and the run's own evaluation hook;
* :mod:`.logger`: :class:`RunLogger`, ``metrics.jsonl``, the external loggers, the progress
  display and the time estimate.

Pretraining (:mod:`lmlab.train.loop`), fine-tuning (:mod:`lmlab.finetune.loop`), preference
tuning (DPO, :mod:`lmlab.align.loop`; RLHF's three phases, :mod:`lmlab.align.rlhf`) and
distillation (:mod:`lmlab.adapt.distill`) run through it. Pretraining, fine-tuning and DPO save
their resume state through the checkpointer, in the same format; RLHF and distillation have no
``--resume``.
"""

from lmlab.train.components.checkpointer import Checkpointer
from lmlab.train.components.evaluator import Evaluator
from lmlab.train.components.fit import FitLoop
from lmlab.train.components.logger import RunLogger
from lmlab.train.components.resume_state import ResumeState

__all__ = ["Checkpointer", "Evaluator", "FitLoop", "ResumeState", "RunLogger"]
