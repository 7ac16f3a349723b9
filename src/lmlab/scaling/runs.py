"""Reading a series of training runs as scaling-law data points ``(N, D, loss)``.

A run directory is what ``lmlab pretrain`` writes (docs/training.md): ``summary.json`` (final
``val_loss``, ``tokens``, ``parameters``), ``metrics.jsonl`` (one row per logged step; evaluation
rows carry ``val_loss``) and ``checkpoints/step_N/config.json`` (the model config). The loss is
the final validation loss (summary.json, else the last ``val_loss`` row of metrics.jsonl, whose
``tokens`` is then ``D``).

``N`` is either every parameter (``total``: the model's own count, as Chinchilla counts) or the
non-embedding parameters (Kaplan et al. 2020, §2.1: they give cleaner laws at small sizes, where
the vocabulary's embedding is a large, slowly-learning share of the model). ``auto`` uses
non-embedding when every run has a checkpoint config to count it from, else total.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lmlab.errors import LmlabError
from lmlab.fileio import read_json
from lmlab.values import check_distinct

__all__ = ["COUNTS", "RunPoint", "read_run", "read_runs"]

COUNTS = ("auto", "non-embedding", "total")


@dataclass(frozen=True)
class RunPoint:
    """One run: ``n_params`` parameters trained on ``n_tokens`` tokens reached ``loss``."""

    name: str
    n_params: float
    n_tokens: float
    loss: float

    def __post_init__(self) -> None:
        from lmlab import values

        if not isinstance(self.name, str):
            raise LmlabError(f"RunPoint's name must be a string, got {type(self.name).__name__} "
                             f"{self.name!r}",
                             "pass e.g. RunPoint('gpt-1m', 1e6, 2e7, 3.2)")
        for field_ in ("n_params", "n_tokens", "loss"):  # a log of each is taken
            values.check(values.Positive, getattr(self, field_), f"RunPoint {self.name!r}: {field_}")

    @property
    def flops(self) -> float:
        """Training compute by the rule of thumb ``C = 6·N·D``."""
        return 6.0 * self.n_params * self.n_tokens


def _is_run_dir(p: Path) -> bool:
    return (p / "summary.json").is_file() or (p / "metrics.jsonl").is_file()


def _last_val_row(path: Path) -> dict | None:
    from lmlab.train.metrics import read_metrics

    rows = [r for r in read_metrics(path) if r.get("val_loss") is not None]
    return rows[-1] if rows else None


def _checkpoint_config(run: Path, summary: dict) -> dict | None:
    """The model section of the newest checkpoint's config.json, if the run has one."""
    from lmlab.train.checkpoint import list_checkpoints

    dirs = [d for _, d in reversed(list_checkpoints(run))]
    if summary.get("checkpoint"):
        dirs.append(Path(summary["checkpoint"]))
    for d in dirs:
        if (d / "config.json").is_file():
            meta = read_json(d / "config.json", "checkpoint config")
            if isinstance(meta, dict) and isinstance(meta.get("config"), dict):
                return meta
    return None


def _count_from_config(meta: dict, where: Path):
    """(total, embedding) parameters of a checkpoint's model config."""
    from lmlab.models.config import config_from_dict
    from lmlab.models.flops import count_parameters

    cfg_dict = dict(meta["config"])
    cfg_dict.setdefault("family", meta.get("family"))
    cfg = config_from_dict(cfg_dict)
    heads = tuple(meta.get("heads") or ()) or None
    try:
        pc = count_parameters(cfg, heads)
    except LmlabError:
        try:
            pc = count_parameters(cfg)  # heads count_parameters does not know: the pretraining ones
        except LmlabError as e:
            raise LmlabError(
                f"cannot count the parameters of run {where} ({e})", "pass --params total"
            ) from None
    return pc.total, pc.embedding


def read_run(path: str | os.PathLike, count: str = "total") -> RunPoint:
    """One run directory as a :class:`RunPoint`; ``count`` is ``total`` or ``non-embedding``."""
    run = Path(path)
    if not run.is_dir():
        raise LmlabError(f"run directory {run} does not exist", "pass directories written by lmlab pretrain")
    if not _is_run_dir(run):
        raise LmlabError(
            f"{run} is not a run directory (no summary.json or metrics.jsonl)",
            "pass directories written by lmlab pretrain",
        )
    summary = read_json(run / "summary.json", "run summary") if (run / "summary.json").is_file() else {}
    if not isinstance(summary, dict):
        raise LmlabError(f"{run / 'summary.json'} is not a JSON object", "re-run or --resume the run")
    loss, tokens = summary.get("val_loss"), summary.get("tokens")
    if loss is None and (run / "metrics.jsonl").is_file():
        row = _last_val_row(run / "metrics.jsonl")
        if row is not None:
            loss, tokens = row["val_loss"], row.get("tokens", tokens)
    if loss is None:
        raise LmlabError(
            f"run {run} has no validation loss",
            "train it with evaluation on (train.eval_every, eval_batches > 0) or leave it out",
        )
    if tokens is None:
        raise LmlabError(
            f"run {run} does not say how many tokens it trained on", "re-run it with lmlab pretrain"
        )

    meta = _checkpoint_config(run, summary)
    total = summary.get("parameters")
    embedding = None
    if meta is not None and (count == "non-embedding" or total is None):
        cfg_total, embedding = _count_from_config(meta, run)
        total = total if total is not None else cfg_total
    if total is None:
        raise LmlabError(
            f"run {run} has no parameter count (summary.json 'parameters' or a checkpoint config)",
            "re-run it with lmlab pretrain",
        )
    if count == "non-embedding":
        if embedding is None:
            raise LmlabError(
                f"run {run} has no checkpoint config to count non-embedding parameters", "pass --params total"
            )
        n = total - embedding
    elif count == "total":
        n = total
    else:
        raise LmlabError(f"unknown parameter count {count!r}", "choose total or non-embedding")
    for what, v in (("validation loss", loss), ("tokens", tokens), ("parameters", n)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or v != v or v == float("inf"):
            raise LmlabError(
                f"run {run} has {what} {v!r}; it must be a positive number",
                "leave out runs that diverged or never trained",
            )
    return RunPoint(str(run), float(n), float(tokens), float(loss))


def read_runs(paths: list[str | os.PathLike], count: str = "auto") -> tuple[list[RunPoint], str]:
    """Read runs (a directory holding run directories stands for all of them); return them and the
    parameter count used (``auto`` resolved)."""
    if count not in COUNTS:
        raise LmlabError(f"unknown parameter count {count!r}", f"choose one of: {', '.join(COUNTS)}")
    if not paths:
        raise LmlabError("no runs given", "pass the run directories of lmlab pretrain, e.g. runs/*")
    dirs: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir() and not _is_run_dir(p):
            children = sorted(c for c in p.iterdir() if c.is_dir() and _is_run_dir(c))
            if children:
                dirs.extend(children)
                continue
        dirs.append(p)
    # one run given twice (run1 run1, or runs/ and runs/a) would weigh its point twice in the fit
    check_distinct(dirs, "the runs (RUN_DIR)", "give each run once", key=lambda d: d.resolve())
    # each run's checkpoint config, read once for the checks below
    metas = {d: _checkpoint_config(d, _summary_or_empty(d)) for d in dirs if d.is_dir()}
    check_one_series(metas)
    if count == "auto":
        count = "non-embedding" if all(m is not None for m in metas.values()) else "total"
    return [read_run(d, count) for d in dirs], count


def _measure(run: Path, meta: dict | None) -> tuple[str | None, int | None]:
    """``(objective, vocabulary size)`` of a run (``meta``: its checkpoint config): what its
    validation loss measures (None: not recorded, e.g. a run folder of an older lmlab)."""
    from lmlab.config.toml import read_toml

    objective = None
    if (run / "config.toml").is_file():
        try:
            section = read_toml(run / "config.toml").get("objective")
            objective = section.get("name") if isinstance(section, dict) else None
        except (LmlabError, AttributeError):  # unreadable, or not a table: not recorded
            objective = None
    vocab = (meta or {}).get("config", {}).get("vocab_size")
    return objective, vocab


def check_one_series(metas: dict[Path, dict | None]) -> None:
    """The runs one law is fitted to measure the same loss (``metas``: each run's checkpoint config):
    one objective (an MLM loss over 15% of the tokens is no CLM loss) over one vocabulary. A mix is
    refused in one line naming the groups."""
    dirs = list(metas)
    measures = {d: _measure(d, metas[d]) for d in dirs}
    for index, what in ((0, "objective"), (1, "vocabulary size")):
        groups: dict = {}
        for d in dirs:
            key = measures[d][index]
            if key is not None:
                groups.setdefault(key, []).append(d.name)
        if len(groups) > 1:
            shown = "; ".join(f"{key}: {', '.join(names)}" for key, names in groups.items())
            raise LmlabError(f"the runs mix {what}s ({shown}): their validation losses measure different "
                             "things, so one scaling law cannot fit them",
                             f"fit the runs of one {what} at a time")


def _summary_or_empty(run: Path) -> dict:
    s = run / "summary.json"
    data = read_json(s, "run summary") if s.is_file() else {}
    return data if isinstance(data, dict) else {}
