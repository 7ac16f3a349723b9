"""Issue 27: `lmlab compress distill` says its plan, an estimate once its first steps are timed,
its progress and a line when training ends, before the before -> after summary. No timing is
asserted."""

from __future__ import annotations

from lmlab.cli import main


def test_distill_says_plan_estimate_progress_and_summary(ckpt, data_dir, tmp_path, capsys):
    from lmlab.finetune import finetune

    g = data_dir / "glue" / "sst2"
    teacher = tmp_path / "teacher"  # a tiny GPT (the shared fixture) fine-tuned for two steps
    finetune(ckpt, "sst2", g / "train.tsv", g / "dev.tsv", teacher, max_train_examples=32,
             max_eval_examples=8, max_steps=2, batch_size=8, progress=False, log=lambda m: None)
    code = main(["compress", "distill", "--teacher", str(teacher), "--train", str(g / "train.tsv"),
                 "--dev", str(g / "dev.tsv"), "--max-train-examples", "40", "--max-eval-examples", "16",
                 "--layers", "1", "--steps", "6", "--batch-size", "8", "--out", str(tmp_path / "st")])
    assert code == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert err[0].startswith(f"distilling {teacher} (2 layers) into 1 layers: 6 steps of 8 of 40 training")
    estimate = [line for line in err if line.startswith("estimate: ~")]
    assert len(estimate) == 1 and " for 6 steps at " in estimate[0] and estimate[0].endswith("/step")
    progress = [line.split(":")[0] for line in err if line.startswith("step ") and "s left" in line]
    assert progress == [f"step {k}/6" for k in range(1, 6)]
    assert all("(soft " in line for line in err if line.startswith("step "))
    assert err[-1].startswith("distill done in ") and ": 6 steps of 8, last loss " in err[-1]
    assert captured.out.splitlines()[-1].startswith("distilled 2 layers into 1 (6 steps")
