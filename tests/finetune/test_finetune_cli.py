"""`lmlab finetune` / `lmlab evaluate` from the command line, and their one-line errors."""

from __future__ import annotations

import json

from lmlab.cli import main


def test_finetune_then_evaluate_print_the_same_json(ckpt, data_dir, tmp_path, capsys):
    g = data_dir / "glue" / "cola"
    out = tmp_path / "ft"
    rc = main(["finetune", "--checkpoint", str(ckpt), "--task", "cola", "--train", str(g / "train.tsv"),
               "--dev", str(g / "dev_in_domain.tsv"), "--out", str(out), "--epochs", "1",
               "--batch-size", "16", "--max-train-examples", "64", "--max-eval-examples", "48",
               "--no-progress"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"accuracy", "matthews_corr"}
    assert printed == json.loads((out / "eval.json").read_text())
    rc = main(["evaluate", "--checkpoint", str(out), "--task", "cola", "--data", str(g / "dev_in_domain.tsv"),
               "--max-examples", "48"])
    evaluated = json.loads(capsys.readouterr().out)
    assert rc == 0 and evaluated.pop("baseline")["metric"] == "matthews_corr"  # fine-tuning's select metric
    assert evaluated == printed  # the same metrics, the baseline beside them under its own key


def test_bad_line_is_one_line_error_or_skipped(ckpt, tmp_path, capsys):
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\ngood\t1\nbad\t0\nbroken line without label\nfine\t1\nawful\t0\n")
    args = ["finetune", "--checkpoint", str(ckpt), "--task", "sst2", "--train", str(train),
            "--dev", str(train), "--out", str(tmp_path / "o"), "--max-steps", "1", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "train.tsv line 4: expected 2 tab-separated fields" in err
    assert "--on-bad-line skip" in err and "\n" not in err
    assert main(args + ["--on-bad-line", "skip"]) == 2          # 1 of 5 rows: more than the default 1%
    err = capsys.readouterr().err
    assert "skipping" in err and "train.tsv: 1 of 5 rows (20.0%) are malformed" in err
    assert main(args + ["--on-bad-line", "skip", "--max-bad-fraction", "0.2"]) == 0
    assert "train.tsv: skipped 1 of 5 rows (20.0%) as malformed" in capsys.readouterr().err


def test_cli_errors_are_one_line(ckpt, data_dir, tmp_path, capsys):
    g = data_dir / "glue" / "sst2"
    assert main(["evaluate", "--checkpoint", str(ckpt), "--data", str(g / "dev.tsv")]) == 2
    assert "not a fine-tuned checkpoint" in capsys.readouterr().err
    assert main(["finetune", "--checkpoint", str(ckpt), "--task", "nope", "--train", str(g / "dev.tsv"),
                 "--dev", str(g / "dev.tsv"), "--out", str(tmp_path / "x")]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err
    assert main(["finetune", "--checkpoint", str(ckpt), "--task", "sst2", "--train", str(g / "dev.tsv"),
                 "--dev", str(g / "dev.tsv"), "--out", str(tmp_path / "x"), "--method-option", "rank"]) == 2
    assert "is not KEY=VALUE" in capsys.readouterr().err
    assert main(["finetune", "--checkpoint", str(ckpt), "--task", "sst2", "--train", str(g / "dev.tsv"),
                 "--dev", str(g / "dev.tsv"), "--out", str(tmp_path / "x"), "--tokenizer",
                 str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
