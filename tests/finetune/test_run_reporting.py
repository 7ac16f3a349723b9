"""Issue 27: `lmlab finetune` and `lmlab evaluate` say what they will do before they start
(examples, steps, epochs, batch, device), how long fine-tuning will take once its first steps are
timed, their progress while they run, and one line at the end. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

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
    err = captured.err.splitlines()
    assert err[0].startswith("evaluate: 40 examples of task cola in 5 batch(es) of 8, device cpu")
    assert [line.split(":")[0] for line in err[1:-1]] == [f"batch {k}/5" for k in range(1, 5)]
    assert err[-1].startswith("evaluated 40 examples in ")
    scores = f"accuracy {metrics['accuracy']:.4f}, matthews_corr {metrics['matthews_corr']:.4f}"
    assert err[-1].endswith(scores)


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
