"""``align(checkpoint, train, dev, out, method=...)``: one preference-tuning run, by method name."""

from __future__ import annotations

import os
from collections.abc import Callable

from lmlab.align.loop import AlignResult, dpo, setup
from lmlab.align.rlhf import check_policy, rlhf

#: method name -> the run (each takes the loop's Setup); AlignConfig.method is checked against it
METHODS: dict[str, Callable] = {"dpo": dpo, "rlhf": rlhf}
#: method name -> its check of the checkpoint's facts, run before any data or weight is read
CHECKS: dict[str, Callable] = {"rlhf": check_policy}


def _check(facts, cfg, device) -> None:
    check = CHECKS.get(cfg.method)
    if check is not None:
        check(facts, cfg, device)


def align(checkpoint, train, dev, out: str | os.PathLike | None, *, tokenizer=None,
          log: Callable[[str], None] | None = None, resume: bool = False, **hparams) -> AlignResult:
    """Preference-tune ``checkpoint`` (a directory or a model) on ``train`` pairs, judged on ``dev``.

    ``train``/``dev``: JSON Lines files of ``{prompt, chosen, rejected}`` (or lists of
    :class:`PreferencePair`). ``hparams``: :class:`AlignConfig` fields (``method``, ``beta``,
    ``lr``, ``max_steps``, ``batch_size``...). ``out=None`` writes nothing.
    ``resume``: continue the interrupted DPO run that was writing ``out`` (stopped by Ctrl-C, SIGTERM
    or a crash) exactly where its resume state left it (:mod:`lmlab.align.loop`); a run of other
    settings or inputs is refused before any work.
    """
    run = setup(checkpoint, train, dev, out, hparams, tokenizer, log, check=_check, resume=resume)
    with run.live:  # however the run ends, nothing is left beside ``out`` but ``out``
        return METHODS[run.cfg.method](run)
