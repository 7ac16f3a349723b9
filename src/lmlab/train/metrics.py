"""What a run reports: ``metrics.jsonl``, the ``loss.png`` curve and the progress bar.

``metrics.jsonl`` holds one JSON object per logged step: ``step``, ``tokens`` (training tokens
seen so far, all processes), ``loss`` (this step's training loss, averaged over micro-batches and
processes), ``lr``, ``grad_norm`` (before clipping), ``tokens_per_s``, ``elapsed_s``, any
objective metrics, and on evaluation steps ``val_loss``, ``val_ppl`` (``exp(val_loss)``) and
``val_bpb`` (bits per UTF-8 byte: ``val_loss * tokens / (ln 2 * bytes)`` of the validation split,
comparable across tokenizers). Each line is flushed as it is written, so a killed run keeps its
log; on resume the lines after the checkpoint's step are dropped before new ones are appended.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from lmlab import values
from lmlab.errors import LmlabError
from lmlab.file_schemas import MetricsRow
from lmlab.fileio import append_line, atomic_write_text

#: what to do about a damaged metrics log
METRICS_FIX = ("the run's metrics log is damaged: restore it, or remove the bad line (a resume "
               "rewrites the log from its checkpoint's step)")


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``, each checked against :class:`lmlab.file_schemas.MetricsRow`
    (a JSON object with a ``step`` and numbers): text that is not UTF-8, a line that is not JSON or
    a row of the wrong shape is a one-line error naming the file and the line. A last line without
    its newline that is not JSON was cut off by a kill mid-write, and is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    rows = []
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise LmlabError(f"{path}: line {lineno} is not UTF-8 text (got {raw[:40]!r})",
                             METRICS_FIX) from None
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            if lineno == len(lines):  # no newline after it: cut off by a kill
                continue
            shown = line if len(line) <= 40 else line[:37] + "..."
            raise LmlabError(f"{path}: line {lineno} is not JSON (got {shown!r})", METRICS_FIX) from None
        values.check(MetricsRow, row, where=f"{path}: line {lineno}", fix=METRICS_FIX)
        rows.append(row)
    return rows


class MetricsLog:
    """Append-only JSON-lines log of a run."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def rows(self) -> list[dict[str, Any]]:
        """The rows logged so far (:func:`read_metrics`)."""
        return read_metrics(self.path)

    def truncate_after(self, step: int) -> list[dict[str, Any]]:
        """Drop rows logged after ``step`` (work lost since the checkpoint); return the kept rows."""
        kept = [r for r in self.rows() if r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        return kept

    def append(self, row: dict[str, Any]) -> None:
        append_line(self.path, json.dumps(row))


def perplexity(mean_nll: float) -> float:
    return math.exp(mean_nll) if mean_nll < 700 else float("inf")


def plot_losses(
    rows: list[dict[str, Any]], path: str | os.PathLike, title: str = "", initial_val: float | None = None
) -> None:
    """Draw train loss (and val loss, with its step-0 value if known) against step into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    train = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    if initial_val is not None:
        val = [(0, initial_val), *val]
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val loss", linewidth=1.5, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    from lmlab.fileio import atomic_write_bytes

    atomic_write_bytes(path, buf.getvalue())
