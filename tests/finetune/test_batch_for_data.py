"""A batch larger than the training data (lmlab.config.fits.batch_for_data): fine-tuning and
distillation take one batch of all the examples, and every count and estimate says so."""

from __future__ import annotations

from lmlab.cli import main


def test_batch_for_data_cuts_a_batch_to_the_items_with_one_note():
    from lmlab.config.fits import batch_for_data

    said = []
    assert batch_for_data(100, 16, "pairs", "--batch-size", said.append) == 16
    assert said == ["note: --batch-size 100 is more than the 16 pairs of the training data; each batch holds "
                    "all 16 of them"]
    assert batch_for_data(16, 16, "pairs", "--batch-size", said.append) == 16
    assert batch_for_data(8, 16, "pairs", "--batch-size", said.append) == 8
    assert len(said) == 1  # nothing to say when the batch fits


def test_finetune_and_distill_count_the_batch_they_take(ckpt, data_dir, tmp_path, capsys):
    g = data_dir / "glue" / "sst2"
    data = ["--train", str(g / "train.tsv"), "--dev", str(g / "dev.tsv"), "--max-train-examples", "12",
            "--max-eval-examples", "6"]
    ft = tmp_path / "ft"
    assert main(["finetune", "--checkpoint", str(ckpt), "--task", "sst2", *data, "--out", str(ft),
                 "--max-steps", "1", "--batch-size", "100000", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("note: --batch-size 100,000 is more than the 12 examples of the training data; each "
                     "batch holds all 12 of them") == 1, err
    assert "1 batches of 12)" in err and "100000" not in err.replace("100,000", ""), err
    assert main(["compress", "distill", "--teacher", str(ft), *data, "--out", str(tmp_path / "st"),
                 "--steps", "2", "--batch-size", "100000"]) == 0
    err = capsys.readouterr().err
    assert err.count("note: --batch-size 100,000 is more than the 12 examples") == 1, err
    assert "2 steps of 12 of 12 training examples" in err and "steps of 100000" not in err, err
    assert "2 steps of 12, last" in err, err
