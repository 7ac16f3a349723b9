"""Golden loss curves: each recipe in ``configs/`` pins the first steps of its training curve.

``configs/golden/<recipe>.json`` records a short run of ``configs/<recipe>.toml`` (the overrides
below: 20 steps, 1 thread, float32, so the numbers do not depend on the machine's thread count
or its bf16 support) and the training loss of every step plus the validation losses. The test
``tests/train/test_recipes.py`` re-runs every golden file and compares within ``tolerance``:
tight enough to catch any change to data order, tokenisation, initialisation, masking, the
model or the optimizer, loose enough for the last-bit differences between CPU kernels.

Record (or re-record after an intended change) with::

    python -m lmlab.train.golden configs/gpt-tiny-clm.toml
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from lmlab.fileio import read_json, write_json
from lmlab.train.metrics import read_metrics

GOLDEN_DIR = Path("configs") / "golden"
DEFAULT_OVERRIDES = [
    "train.max_steps=20",
    "train.eval_every=10",
    "train.checkpoint_every=20",
    "train.eval_batches=4",
    "train.threads=1",
    "train.precision=fp32",
    "train.progress=off",
    "train.eval_at_start=true",
]
DEFAULT_TOLERANCE = 5e-4


def golden_path(recipe: str | Path) -> Path:
    return Path(recipe).parent / "golden" / f"{Path(recipe).stem}.json"


def run_curve(recipe: str | Path, overrides: list[str], run_dir: str | Path) -> dict[str, Any]:
    """Train ``recipe`` with ``overrides`` into ``run_dir``; the curve in golden-file form."""
    from lmlab.train import pretrain

    summary = pretrain(recipe, run_dir, overrides=overrides, log=lambda m: None)
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    return {
        "loss": [round(r["loss"], 6) for r in rows],
        "val_loss": {str(r["step"]): round(r["val_loss"], 6) for r in rows if "val_loss" in r}
        | {"0": round(summary["initial_val_loss"], 6)},
    }


def record(
    recipe: str | Path, overrides: list[str] | None = None, tolerance: float = DEFAULT_TOLERANCE
) -> Path:
    """Run ``recipe`` and write its golden file next to it (``configs/golden/<name>.json``)."""
    import torch

    import lmlab

    overrides = list(DEFAULT_OVERRIDES if overrides is None else overrides)
    with tempfile.TemporaryDirectory() as tmp:
        curve = run_curve(recipe, overrides, Path(tmp) / "run")
    data = {
        "recipe": str(recipe),
        "overrides": overrides,
        "tolerance": tolerance,
        **curve,
        "recorded_with": {"lmlab": lmlab.__version__, "torch": torch.__version__},
    }
    path = golden_path(recipe)
    write_json(path, data)
    return path


def compare(golden: dict[str, Any], curve: dict[str, Any]) -> list[str]:
    """Differences beyond the golden file's tolerance, as readable lines (empty = reproduced)."""
    tol = golden.get("tolerance", DEFAULT_TOLERANCE)
    problems = []
    if len(curve["loss"]) != len(golden["loss"]):
        problems.append(f"{len(curve['loss'])} logged steps, golden has {len(golden['loss'])}")
    for i, (want, got) in enumerate(zip(golden["loss"], curve["loss"]), 1):
        if abs(want - got) > tol * max(1.0, abs(want)):
            problems.append(f"step {i}: train loss {got:.6f}, golden {want:.6f}")
    for step, want in golden["val_loss"].items():
        got = curve["val_loss"].get(step)
        if got is None or abs(want - got) > tol * max(1.0, abs(want)):
            problems.append(f"step {step}: val loss {got}, golden {want:.6f}")
    return problems


def check(golden_file: str | Path, run_dir: str | Path) -> list[str]:
    """Re-run the recipe of ``golden_file`` into ``run_dir`` and compare (see :func:`compare`)."""
    golden = read_json(golden_file, "golden curve")
    return compare(golden, run_curve(golden["recipe"], golden["overrides"], run_dir))


if __name__ == "__main__":  # pragma: no cover
    for recipe in sys.argv[1:] or sorted(str(p) for p in Path("configs").glob("*.toml")):
        print(f"recorded {record(recipe)}")
