"""Issue 27: `lmlab finetune` and `lmlab evaluate` say what they will do before they start
(examples, steps, epochs, batch, device), how long fine-tuning will take once its first steps are
timed, their progress while they run, and one line at the end. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmlab.cli import main
from lmlab.finetune.config import FinetuneConfig
from lmlab.finetune.loop import _done_line, _predicting_in_chunks, _shorter_run_hint
from lmlab.progress import Progress


def test_finetune_then_evaluate_say_plan_estimate_progress_and_summary(ckpt, data_dir, tmp_path, capsys):
    g = data_dir / "glue" / "cola"
    out = tmp_path / "ft"
    rc = main(["finetune", "--checkpoint", str(ckpt), "--task", "cola", "--train", str(g / "train.tsv"),
               "--dev", str(g / "dev_in_domain.tsv"), "--out", str(out), "--max-steps", "6",
               "--batch-size", "8", "--max-train-examples", "32", "--max-eval-examples", "24"])
    assert rc == 0
    err = capsys.readouterr().err.splitlines()
    plan = [line for line in err if line.startswith("finetune: task cola")]
    assert len(plan) == 1 and "32 train / 24 dev examples" in plan[0] and "method full" in plan[0]
    assert "6 steps (max_steps: 1.50 epochs of 4 batches of 8)" in plan[0] and "device cpu" in plan[0]
    estimate = [line for line in err if line.startswith("estimate: ~")]
    assert len(estimate) == 1 and " for 6 steps at " in estimate[0]
    assert estimate[0].endswith("/step (plus 2 evaluations of 24 examples)")
    assert err.index(estimate[0]) > err.index(plan[0])
    assert [line.split(":")[0] for line in err if line.startswith("step ") and "s left" in line] == [
        f"step {k}/6" for k in range(1, 6)]  # the progress lines (no terminal)
    assert err[-1].startswith("finetune done in ") and "(6 steps): best dev matthews_corr" in err[-1]
    assert err[-1].endswith(f"; saved to {out}")

    rc = main(["evaluate", "--checkpoint", str(out), "--data", str(g / "dev_in_domain.tsv"),
               "--max-examples", "40", "--batch-size", "8"])
    captured = capsys.readouterr()
    assert rc == 0
    metrics = json.loads(captured.out)  # stdout stays the JSON alone
    err = [line for line in captured.err.splitlines() if not line.startswith("warning: ")]  # at the baseline
    assert err[0].startswith("evaluate: 40 examples of task cola in 5 batch(es) of 8, device cpu")
    assert [line.split(":")[0] for line in err[1:-1]] == [f"batch {k}/5" for k in range(1, 5)]
    assert err[-1].startswith("evaluated 40 examples in ")
    scores = f"accuracy {metrics['accuracy']:.4f}, matthews_corr {metrics['matthews_corr']:.4f}"
    base = metrics["baseline"]["metrics"]
    assert err[-1].endswith(f"{scores}; baseline ({metrics['baseline']['answer']}, no model): accuracy "
                            f"{base['accuracy']:.4f}, matthews_corr {base['matthews_corr']:.4f}")


def test_evaluating_in_chunks_gives_the_same_predictions(ckpt, data_dir, tmp_path):
    from lmlab.finetune import finetune

    g = data_dir / "glue" / "cola"
    res = finetune(ckpt, "cola", g / "train.tsv", g / "dev_in_domain.tsv", None, max_steps=2, batch_size=8,
                   max_train_examples=32, max_eval_examples=8, progress=False, log=lambda m: None)
    model, task = res.model, res.task
    examples = task.read(g / "dev_in_domain.tsv")[:90]
    plain = task.predict_and_score(model, examples, 4)
    lines = []
    progress = Progress(23, desc="evaluate", show="auto", log=lines.append, unit="batch")
    with _predicting_in_chunks(task, progress, 4):
        chunked = task.predict_and_score(model, examples, 4)
    assert chunked == plain and "predict" not in vars(task)  # the task's own predict is back
    assert [line.split(":")[0] for line in lines] == [f"batch {k}/23" for k in range(2, 23, 2)]


def test_a_long_run_is_told_which_flags_shorten_it():
    hint = _shorter_run_hint(3.0, FinetuneConfig.from_dict({}))
    assert hint.startswith("hint: that is long; --max-steps 200 would take about 10 min")
    assert "--max-train-examples N, --epochs 1 shorten the run too" in hint
    steps_set = _shorter_run_hint(3.0, FinetuneConfig.from_dict({"max_steps": 5000}))
    assert "--epochs" not in steps_set  # --max-steps decides the length then


def test_the_last_line_names_the_data_that_chose_and_the_dev_score():
    best = {"score": 0.86, "step": 4210}
    baseline = ("majority class 'positive'", {"accuracy": 0.5092})
    on_dev = _done_line(6315, best, {"accuracy": 0.86}, "accuracy", "dev", baseline, 11_520.0,
                        Path("ft/sst2"))
    assert on_dev == ("finetune done in 3 h 12 min (6,315 steps): best dev accuracy 0.8600 at step 4,210 "
                      "(baseline 0.5092); saved to ft/sst2")
    on_slice = _done_line(6315, best, {"accuracy": 0.84}, "accuracy", "slice", None, 95.0, None)
    assert on_slice == ("finetune done in 1 min 35 s (6,315 steps): step 4,210 chosen on the slice (accuracy "
                        "0.8600), dev accuracy 0.8400")


def _sst2(path: Path, labels: str) -> Path:
    texts = ["a charming and affecting journey", "bleak and desperate", "the best film of the year",
             "dull , lifeless and long"]
    rows = [f"{texts[i % len(texts)]} {i}\t{y}\n" for i, y in enumerate(labels)]
    path.write_text("sentence\tlabel\n" + "".join(rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tuned(ckpt, tmp_path_factory):
    """A bert-tiny fine-tuned on SST-2 for one step (it has learned nothing), and its folder."""
    from lmlab.finetune import finetune

    d = tmp_path_factory.mktemp("tuned")
    train = _sst2(d / "train.tsv", "10" * 4)
    finetune(ckpt, "sst2", train, train, d / "ft", max_steps=1, batch_size=4, progress=False,
             log=lambda m: None)
    return d


def test_evaluate_gives_every_score_its_trivial_baseline_and_flags_one_at_it(tuned, capsys):
    """probe10b #4: `lmlab evaluate --data` printed SST-2's 0.5092, the majority class's score, with
    nothing saying so. The task's trivial baseline on the scored examples (their majority class, as
    finetune's, lmlab.tasks.baseline) is said beside the scores, kept under "baseline" in the JSON
    (the metrics' keys unchanged) and a score at (or below) it is flagged, worded as finetune's."""
    one_class = _sst2(tuned / "ones.tsv", "1111")  # any model is at (or below) this baseline: 1.0
    assert main(["evaluate", "--checkpoint", str(tuned / "ft"), "--data", str(one_class)]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert printed["baseline"] == {"answer": "majority class '1'", "metrics": {"accuracy": 1.0},
                                   "metric": "accuracy", "at_baseline": True}
    assert set(printed) == {"accuracy", "baseline"}
    err = captured.err.splitlines()
    assert err[-2].endswith(f"accuracy {printed['accuracy']:.4f}; baseline (majority class '1', no model): "
                            "accuracy 1.0000")
    assert err[-1].startswith(f"warning: accuracy {printed['accuracy']:.4f} is at the trivial baseline "
                              "(majority class '1': 1.0000): the model does no better")
    mixed = _sst2(tuned / "mixed.tsv", "0100")
    assert main(["evaluate", "--checkpoint", str(tuned / "ft"), "--data", str(mixed)]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    base = printed["baseline"]
    assert base["answer"] == "majority class '0'" and base["metrics"] == {"accuracy": 0.75}
    assert base["at_baseline"] == (printed["accuracy"] <= 0.755)
    assert ("warning: " in captured.err) == base["at_baseline"]


def test_compress_gives_the_dev_scores_their_baseline_and_flags_them(tuned, tmp_path, capsys):
    """probe10b #4: `lmlab compress quantize|prune|distill --dev` showed "dev accuracy 0.5092 ->
    0.5092" with no baseline. The same baseline now stands beside before -> after, in the last line
    and in compress.json ("baseline", the other keys unchanged)."""
    one_class = _sst2(tuned / "ones.tsv", "1111")
    assert main(["compress", "quantize", "--checkpoint", str(tuned / "ft"), "--dev", str(one_class),
                 "--out", str(tmp_path / "q")]) == 0
    printed = capsys.readouterr().out.splitlines()
    report = json.loads((tmp_path / "q" / "compress.json").read_text(encoding="utf-8"))
    assert report["baseline"] == {"answer": "majority class '1'", "metrics": {"accuracy": 1.0},
                                  "metric": "accuracy", "at_baseline": {"before": True, "after": True}}
    before, after = report["before"]["metrics"]["accuracy"], report["after"]["metrics"]["accuracy"]
    assert f"  dev accuracy   {before:.4f} -> {after:.4f} ({after - before:+.4f}; baseline 1.0000)" in printed
    assert "  baseline (majority class '1', no model): accuracy 1.0000" in printed
    assert any(line.startswith(f"  warning: after, dev accuracy {after:.4f} is at the trivial baseline "
                               "(majority class '1': 1.0000)") for line in printed)
    assert f"accuracy {before:.4f} -> {after:.4f} (baseline 1.0000); at the trivial baseline before and " \
           f"after; written to {tmp_path / 'q'}/" in printed[-1]
