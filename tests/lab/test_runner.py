"""Running a grid: caching (a second invocation trains nothing), resuming an interrupted grid, and
one real end-to-end micro grid (MLM-pretrained vs from-scratch, pretrained and fine-tuned for real)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmlab.errors import LmlabError
from lmlab.lab import layout, load_grid, run_grid
from lmlab.lab import runner as runner_mod


@pytest.fixture()
def micro(tmp_path, data_dir):
    """A grid dict on 60 KB of real text with a 1-layer width-32 BERT; ``micro(**changes)``."""
    shakespeare = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    wiki = (data_dir / "pretrain" / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    (tmp_path / "train.txt").write_text(shakespeare[:60_000], encoding="utf-8")
    (tmp_path / "val.txt").write_text(wiki[:20_000], encoding="utf-8")

    def make(**changes):
        grid = {
            "name": "micro",
            "seeds": [0],
            "budget": {"tokens": 2560},  # 10 steps of 8 x 32 tokens
            "pretrain": {
                "data": {
                    "train": [str(tmp_path / "train.txt")],
                    "val": [str(tmp_path / "val.txt")],
                    "tokenizer": {"algo": "bytelevel", "vocab_size": 300},
                },
                "train": {"batch_size": 8, "seq_len": 32, "eval_batches": 2, "threads": 1},
                "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "max_positions": 64},
            },
            "arms": [
                {"name": "mlm", "preset": "bert-tiny", "objective": "mlm"},
                {"name": "scratch", "preset": "bert-tiny", "objective": "none"},
            ],
            "finetune": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_length": 32, "threads": 1},
            "tasks": [
                {
                    "task": "sst2",
                    "train": str(data_dir / "glue/sst2/train.tsv"),
                    "dev": str(data_dir / "glue/sst2/dev.tsv"),
                    "max_train_examples": 64,
                    "max_eval_examples": 32,
                }
            ],
        }
        grid.update(changes)
        return grid

    return make


class Fakes:
    """Stand-ins for pretrain() and finetune() that write what the real ones write and count calls."""

    def __init__(self, interrupt_at: int | None = None):
        self.pretrain_calls: list[tuple[str, bool]] = []
        self.finetune_calls: list[str] = []
        self.pretrain_configs: list[dict] = []
        self.finetune_settings: list[dict] = []
        self.interrupt_at = interrupt_at

    def pretrain(self, config, out_dir, overrides=None, resume=False, log=None):
        out = Path(out_dir)
        self.pretrain_calls.append((out.name, resume))
        self.pretrain_configs.append(config)
        steps = config["train"]["max_steps"]
        (out / "checkpoints" / "step_5").mkdir(parents=True, exist_ok=True)
        if self.interrupt_at is not None and len(self.pretrain_calls) == self.interrupt_at:
            raise KeyboardInterrupt
        ckpt = out / "checkpoints" / f"step_{steps}"
        ckpt.mkdir(parents=True, exist_ok=True)
        rows = [{"step": s, "loss": 5.0, "val_loss": 6.0 - s / steps} for s in (steps // 2, steps)]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        summary = {
            "steps": steps,
            "tokens": steps * 256,
            "val_loss": 5.0,
            "initial_val_loss": 6.5,
            "parameters": 1234,
            "checkpoint": str(ckpt),
        }
        (out / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
        return summary

    def finetune(self, checkpoint, task, train, dev, out, log=None, **settings):
        self.finetune_calls.append(Path(out).name)
        self.finetune_settings.append(settings)
        assert Path(checkpoint).is_dir()
        Path(out).mkdir(parents=True, exist_ok=True)
        metrics = {"accuracy": 0.5 + settings["seed"] / 100}
        (Path(out) / "eval.json").write_text(json.dumps(metrics), encoding="utf-8")
        return SimpleNamespace(metrics=metrics)


def fake_grid(micro):
    return load_grid(
        micro(
            seeds=[0, 1],
            arms=[
                {"name": "mlm", "preset": "bert-tiny", "objective": "mlm"},
                {"name": "electra", "preset": "electra-tiny", "objective": "electra"},
            ],
        )
    )


def test_second_invocation_trains_nothing(micro, tmp_path, monkeypatch):
    fakes = Fakes()
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    monkeypatch.setattr(runner_mod, "finetune", fakes.finetune)
    grid = fake_grid(micro)
    out = tmp_path / "out"
    first = run_grid(grid, out, progress=False, log=lambda m: None)
    assert len(fakes.pretrain_calls) == 4 and len(fakes.finetune_calls) == 4
    assert all(not resume for _, resume in fakes.pretrain_calls)
    assert len(first.trained) == 8 and not first.cached
    assert sorted(r["tasks"]["sst2"]["accuracy"] for r in first.records) == [0.5, 0.5, 0.51, 0.51]

    second = run_grid(
        load_grid(micro(seeds=[0, 1], arms=grid_arms(grid))), out, progress=False, log=lambda m: None
    )
    assert len(fakes.pretrain_calls) == 4 and len(fakes.finetune_calls) == 4  # nothing new
    assert not second.trained and len(second.cached) == 8
    assert second.records == first.records

    # a third seed: only its runs are trained
    run_grid(load_grid(micro(seeds=[0, 1, 2], arms=grid_arms(grid))), out, progress=False, log=lambda m: None)
    assert len(fakes.pretrain_calls) == 6 and len(fakes.finetune_calls) == 6
    assert {name.split("-s")[1][0] for name, _ in fakes.pretrain_calls[4:]} == {"2"}


def grid_arms(grid):
    return [{"name": a.name, "preset": a.preset, "objective": a.objective} for a in grid.arms]


def test_compare_logger_reaches_every_run_and_changes_no_run_key(micro, tmp_path, monkeypatch):
    from lmlab.cli import main
    from lmlab.train.config import to_toml

    fakes = Fakes()
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    monkeypatch.setattr(runner_mod, "finetune", fakes.finetune)
    grid = tmp_path / "grid.toml"
    grid.write_text(to_toml(micro(arms=[{"name": "mlm", "preset": "bert-tiny", "objective": "mlm"}])))
    out = str(tmp_path / "out")
    assert main(["compare", "--config", str(grid), "--out", out, "--progress", "off",
                 "--logger", "tensorboard", "--logger", "wandb"]) == 0
    assert [c["train"]["loggers"] for c in fakes.pretrain_configs] == [["tensorboard", "wandb"]]
    assert [s["loggers"] for s in fakes.finetune_settings] == [["tensorboard", "wandb"]]
    # logging changes no result: without --logger the same runs are found done
    calls = (list(fakes.pretrain_calls), list(fakes.finetune_calls))
    assert main(["compare", "--config", str(grid), "--out", out, "--progress", "off"]) == 0
    assert (fakes.pretrain_calls, fakes.finetune_calls) == calls


def test_compare_refuses_an_unknown_logger_before_any_work(micro, tmp_path, monkeypatch, capsys):
    from assertions import exit_code

    from lmlab.train.config import to_toml

    fakes = Fakes()
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    grid = tmp_path / "grid.toml"
    grid.write_text(to_toml(micro()))
    argv = ["compare", "--config", str(grid), "--out", str(tmp_path / "out"), "--logger", "neptune"]
    assert exit_code(argv) == 2  # refused as the flag is parsed
    assert capsys.readouterr().err.startswith("error: argument --logger: invalid choice: 'neptune'")
    assert not fakes.pretrain_calls and not (tmp_path / "out").exists()


def test_interrupted_grid_resumes(micro, tmp_path, monkeypatch):
    fakes = Fakes(interrupt_at=3)
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    monkeypatch.setattr(runner_mod, "finetune", fakes.finetune)
    out = tmp_path / "out"
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_grid(fake_grid(micro), out, progress=False, log=lines.append)
    assert "interrupted: run the same command again to resume" in lines[-1]
    assert len(fakes.pretrain_calls) == 3 and len(fakes.finetune_calls) == 2
    interrupted = fakes.pretrain_calls[2][0]

    fakes.interrupt_at = None
    result = run_grid(fake_grid(micro), out, progress=False, log=lines.append)
    # the interrupted run continues from its checkpoint (resume=True); finished runs are not redone
    assert fakes.pretrain_calls[3] == (interrupted, True)
    assert len(fakes.pretrain_calls) == 5 and len(fakes.finetune_calls) == 4
    assert len(result.cached) == 4 and len(result.trained) == 4
    assert (out / "results.md").is_file()


def test_dry_run_trains_nothing(micro, tmp_path, monkeypatch):
    fakes = Fakes()
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    monkeypatch.setattr(runner_mod, "finetune", fakes.finetune)
    lines: list[str] = []
    run_grid(fake_grid(micro), tmp_path / "out", dry_run=True, log=lines.append)
    assert not fakes.pretrain_calls and not fakes.finetune_calls and not (tmp_path / "out").exists()
    assert any("mlm/base/seed 1" in line and "to train" in line for line in lines)


def test_report_only_trains_nothing_and_reports_the_finished_runs(micro, tmp_path, monkeypatch):
    fakes = Fakes()
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    monkeypatch.setattr(runner_mod, "finetune", fakes.finetune)
    out = tmp_path / "out"
    with pytest.raises(LmlabError, match="holds no runs"):
        run_grid(fake_grid(micro), out, report_only=True, log=lambda m: None)
    # seed 0 only is trained (a grid still running, say) ...
    one_seed = load_grid(micro(seeds=[0], arms=grid_arms(fake_grid(micro))))
    run_grid(one_seed, out, progress=False, log=lambda m: None)
    calls = (len(fakes.pretrain_calls), len(fakes.finetune_calls))
    # ... then the two-seed grid's report: nothing trains, the table counts one seed per row
    result = run_grid(fake_grid(micro), out, report_only=True, log=lambda m: None)
    assert (len(fakes.pretrain_calls), len(fakes.finetune_calls)) == calls
    assert not result.trained and len(result.records) == 2
    assert "| mlm | mlm |" in (out / "results.md").read_text(encoding="utf-8")
    assert (out / "results.md").read_text(encoding="utf-8").count(" | 1 |") == 2


def test_real_micro_grid_end_to_end(micro, tmp_path):
    """MLM pretraining (10 real steps) vs the same model untrained, both fine-tuned on 64 SST-2
    sentences; then the same grid again trains nothing."""
    out = tmp_path / "out"
    grid = load_grid(micro())
    result = run_grid(grid, out, progress=False, log=lambda m: None)
    assert len(result.trained) == 4
    mlm, scratch = result.records
    assert mlm["steps"] == 10 and mlm["tokens"] == 2560 and mlm["val_loss"] < mlm["curve"][0][1]
    assert scratch["steps"] == 0 and scratch["val_loss"] is None and scratch["flops"] == 0
    assert mlm["parameters"] == scratch["parameters"]
    for r in result.records:
        assert 0.0 <= r["tasks"]["sst2"]["accuracy"] <= 1.0
    # the untrained model really is the MLM run's starting point: same tokenizer, same init seed
    from lmlab.loading import load_model

    init = load_model(layout.checkpoint_of(out, grid.pretrain_runs[1]))
    assert init.tokenizer.vocab_size == 300
    md = (out / "results.md").read_text(encoding="utf-8")
    assert "| mlm | mlm |" in md and "| scratch | none |" in md
    for name in (
        "results.csv",
        "runs.csv",
        "results.json",
        "loss_vs_compute.png",
        "downstream.png",
        "plan.json",
    ):
        assert (out / name).is_file(), name
    again = run_grid(load_grid(micro()), out, progress=False, log=lambda m: None)
    assert not again.trained and len(again.cached) == 4
    assert again.records == result.records


def test_compare_refuses_a_user_folder_before_the_plan_line(micro, tmp_path, monkeypatch, capsys):
    """--out a folder lmlab did not write (it holds the grid file): one line, the refusal, and no
    plan line before it; the folder is untouched."""
    from assertions import exit_code

    from lmlab.train.config import to_toml

    fakes = Fakes()
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    mine = tmp_path / "mine"
    mine.mkdir()
    grid = mine / "g.toml"
    grid.write_text(to_toml(micro()))
    capsys.readouterr()
    assert exit_code(["compare", "--config", str(grid), "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: output folder") and "g.toml" in err, err
    assert sorted(p.name for p in mine.iterdir()) == ["g.toml"] and not fakes.pretrain_calls


def _fine_tuned_model(path: Path) -> None:
    path.mkdir()
    (path / "config.json").write_text("{}\n")
    from lmlab import ownership

    ownership.seal(path, "fine-tuned model")


@pytest.mark.parametrize("what", ["a file of yours", "a fine-tuned model", "a folder of yours"])
def test_dry_run_refuses_exactly_the_out_the_real_run_refuses(micro, tmp_path, monkeypatch, what):
    """--dry-run makes the real run's checks on --out (runner.check_out): it passed a user's file, a
    fine-tuned model and a user's non-empty folder as '-> OUT', which the real run refused (probe8 #2)."""
    fakes = Fakes()
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    monkeypatch.setattr(runner_mod, "finetune", fakes.finetune)
    out = tmp_path / "out"
    if what == "a file of yours":
        out.write_text("mine\n")
    elif what == "a fine-tuned model":
        _fine_tuned_model(out)
    else:
        out.mkdir()
        (out / "tr.tsv").write_text("sentence\tlabel\n")
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else out.read_text()
    errors, lines, grid = [], [], fake_grid(micro)
    for dry_run in (True, False):
        with pytest.raises(LmlabError) as e:
            run_grid(grid, out, dry_run=dry_run, progress=False, log=lines.append)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and not lines, (errors, lines)
    assert not fakes.pretrain_calls and not fakes.finetune_calls
    assert (sorted(p.name for p in out.iterdir()) if out.is_dir() else out.read_text()) == before


def test_report_only_refuses_a_folder_where_its_report_goes_before_the_plan(micro, tmp_path, monkeypatch):
    """A folder made at OUT/results.md: refused before the plan line (and by --dry-run), said to be a
    folder, not a file that changed since lmlab wrote it (probe8 #9); also when lmlab had not
    written that file yet (an interrupted grid), and for the run that would write it at its end."""
    fakes = Fakes()
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    monkeypatch.setattr(runner_mod, "finetune", fakes.finetune)
    out, grid = tmp_path / "out", fake_grid(micro)
    run_grid(grid, out, progress=False, log=lambda m: None)
    (out / "results.md").unlink()
    (out / "results.md").mkdir()
    lines: list[str] = []
    for flags in ({"report_only": True}, {"report_only": True, "dry_run": True}, {}, {"dry_run": True}):
        with pytest.raises(LmlabError, match="results.md, which is a folder that lmlab did not make") as e:
            run_grid(grid, out, progress=False, log=lines.append, **flags)
        assert "changed since" not in str(e.value)
    assert not lines and (out / "results.md").is_dir()

    fakes = Fakes(interrupt_at=2)  # a grid stopped before its report: no results.md of lmlab's yet
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    other = tmp_path / "other"
    with pytest.raises(KeyboardInterrupt):
        run_grid(grid, other, progress=False, log=lambda m: None)
    (other / "runs.csv").mkdir()
    for flags in ({"report_only": True}, {}):
        with pytest.raises(LmlabError, match="runs.csv is a folder that lmlab did not make") as e:
            run_grid(grid, other, progress=False, log=lines.append, **flags)
        assert "move that folder away" in str(e.value)
    assert not lines and len(fakes.pretrain_calls) == 2
