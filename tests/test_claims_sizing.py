"""``benchmarks/claims_sizing.py`` on a tiny grid on the CPU (seconds): every pretraining arm is
built as ``lmlab compare`` builds it and measured, the GPU estimate is positive, and it scales with
the pretraining tokens. No timing is asserted beyond "positive"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import claims_sizing  # noqa: E402

CORPUS = ROOT / "src" / "lmlab" / "assets" / "tinyshakespeare.txt"


def tiny_grid(tmp: Path, data_dir: Path, tokens: int = 2560) -> Path:
    """Three arms of one-layer models on the built-in corpus, fine-tuned on 64 SST-2 sentences."""
    text = CORPUS.read_text(encoding="utf-8")
    train, val = tmp / "train.txt", tmp / "val.txt"
    train.write_text(text[:60_000], encoding="utf-8")
    val.write_text(text[-20_000:], encoding="utf-8")
    sst2 = data_dir / "glue" / "sst2"
    grid = tmp / "grid.toml"
    grid.write_text(
        f'name = "sizing-tiny"\nseeds = [0, 1]\nbudget = {{ tokens = {tokens} }}\n'
        f'pretrain.data = {{ train = ["{train}"], val = ["{val}"], '
        'tokenizer = { algo = "bytelevel", vocab_size = 300 } }\n'
        "pretrain.train = { batch_size = 8, seq_len = 32, eval_batches = 2, threads = 1 }\n"
        "pretrain.model = { d_model = 32, n_layers = 1, n_heads = 2, d_ff = 64, max_positions = 64 }\n"
        'finetune = { epochs = 2, batch_size = 16, lr = "auto", lr_sweep = [1e-3, 3e-3] }\n'
        "arms = [\n"
        '  { name = "mlm", preset = "bert-tiny", objective = "mlm" },\n'
        '  { name = "clm", preset = "gpt2-tiny", objective = "clm" },\n'
        '  { name = "scratch", preset = "bert-tiny", objective = "none" },\n]\n'
        f'tasks = [{{ task = "sst2", train = "{sst2 / "train.tsv"}", dev = "{sst2 / "dev.tsv"}", '
        "max_train_examples = 64, max_eval_examples = 32 }]\n",
        encoding="utf-8",
    )
    return grid


def test_tiny_grid_is_measured_and_estimated(tmp_path, data_dir, capsys):
    grid = tiny_grid(tmp_path, data_dir)
    out = tmp_path / "out"
    assert claims_sizing.main(["--config", str(grid), "--out", str(out), "--cpu", "--steps", "2",
                               "--warmup", "1"]) == 0
    summary = json.loads((out / "sizing.json").read_text())
    arms = {a["arm"]: a for a in summary["arms"]}
    assert list(arms) == ["mlm", "clm"]  # the arm that is not pretrained has nothing to measure
    for a in arms.values():
        assert a["steps"] == 10 and a["tokens"] == 2560
        for key in ("flops_per_token", "cpu_tokens_per_s", "host_tokens_per_s", "gpu_flops_s",
                    "gpu_cpu_ratio_s", "gpu_floor_s", "gpu_host_s", "cpu_s"):
            assert a[key] > 0, key
        assert a["gpu_s"] == pytest.approx(max(a["gpu_flops_s"], a["gpu_cpu_ratio_s"], a["gpu_floor_s"],
                                               a["gpu_host_s"]) + summary["assumptions"]["run_overhead_s"])
    # the causal LM projects every position to the vocabulary, the masked LM 15% of them
    assert arms["clm"]["flops_per_token"] > arms["mlm"]["flops_per_token"]
    # the first arm is the reference of the CPU-ratio bound: there both bounds agree
    assert arms["mlm"]["gpu_cpu_ratio_s"] == pytest.approx(arms["mlm"]["gpu_flops_s"])
    # fine-tuning: 3 runs (seed 0) x 2 rates x 2 epochs x ceil((64 - 7) / 16) steps
    assert summary["finetune_runs"] == 3 and summary["finetune_steps"] == 3 * 2 * 2 * 4
    assert summary["data_measured"] and summary["data_s"] > 0
    assert summary["gpu_seed_s"] > summary["gpu_finetune_s"] > 0 and summary["cpu_seed_s"] > 0
    assert summary["budget_factor_for_target"] > 1  # a tiny grid leaves room in 240 s
    md = (out / "sizing.md").read_text()
    assert "| mlm | mlm | 10 |" in md and "one seed on one GPU" in md and "one seed on this CPU" in md
    assert "| mlm | mlm | 10 |" in capsys.readouterr().out


def test_the_estimate_scales_with_the_tokens():
    """Every pretraining bound is linear in the run's tokens and steps; the overhead is not."""
    def cost(scale: int) -> claims_sizing.ArmCost:
        return claims_sizing.ArmCost("mlm", "mlm", "encoder", 100 * scale, 409_600 * scale, 2e7, 5_000.0, 1e6)

    args = claims_sizing.parse_args([])
    rate = claims_sizing.gpu_matmul_rate()
    one, two = [cost(1)], [cost(2)]
    claims_sizing.estimate_gpu(one, args, rate)
    claims_sizing.estimate_gpu(two, args, rate)
    for key in ("gpu_flops_s", "gpu_cpu_ratio_s", "gpu_floor_s", "gpu_host_s", "cpu_s"):
        assert getattr(two[0], key) == pytest.approx(2 * getattr(one[0], key)), key
    overhead = args.run_overhead_s
    assert two[0].gpu_s - overhead == pytest.approx(2 * (one[0].gpu_s - overhead))
    # an encoder-decoder at the same FLOPs is estimated slower (T5-base's recorded MFU penalty)
    t5 = [claims_sizing.ArmCost("t5", "t5", "seq2seq", 100, 409_600, 2e7, 5_000.0, 1e6)]
    claims_sizing.estimate_gpu(one + t5, args, rate)
    assert t5[0].gpu_flops_s > one[0].gpu_flops_s


def test_gpt2_reference_reproduces_the_recorded_mfu():
    """The matmul rate is the one the recorded run's 32.8% MFU was measured against."""
    per_token = claims_sizing.gpt2_flops_per_token()
    assert 6 * 85e6 < per_token < 1.2e9  # 6 N plus the attention and the vocabulary projection
    rate = claims_sizing.gpu_matmul_rate()
    assert 297_000 * per_token / rate == pytest.approx(0.328)


@pytest.mark.parametrize(("args", "message"), [
    (["--rows", "0"], "error: --rows is 0; give at least 1"),
    (["--mfu", "1.5"], "error: --mfu is 1.5; give a positive number up to 1"),
])
def test_bad_numbers_are_one_line(tmp_path, data_dir, capsys, args, message):
    grid = tiny_grid(tmp_path, data_dir)
    assert claims_sizing.main(["--config", str(grid), "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert err.strip() == message and not (tmp_path / "out").exists()


def test_a_grid_with_nothing_to_pretrain_is_refused(tmp_path, data_dir, capsys):
    grid = tiny_grid(tmp_path, data_dir)
    text = grid.read_text().replace('objective = "mlm"', 'objective = "none"').replace('objective = "clm"',
                                                                                        'objective = "none"')
    grid.write_text(text)
    assert claims_sizing.main(["--config", str(grid), "--out", str(tmp_path / "out")]) == 2
    assert "has no pretraining arm; size a grid that pretrains something" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_gpu_grid_is_one_seed_of_claims_1_to_5(data_dir):
    """claims-gpu.toml: one seed by default, every claim's arms (claim 3's static masking included),
    ELECTRA at mlm-40's FLOPs, and gpu_check.sh gives its grid part the 240 s it is sized for."""
    from lmlab.lab import load_grid

    grid = load_grid(ROOT / "configs" / "grids" / "claims-gpu.toml")
    assert grid.seeds == [0]
    claims = {c.name.split(".")[0] for c in grid.contrasts}
    assert {"1", "2", "3", "4", "5"} <= claims
    runs = {r.arm.name: r for r in grid.pretrain_runs}
    assert runs["mlm-40-static"].arm.params["masking"] == "static"
    mlm, electra = runs["mlm-40"], runs["electra-40"]
    assert mlm.flops - electra.flops_per_step < electra.flops <= mlm.flops
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    assert 'GRID_S="${GPU_CHECK_GRID_S:-240}"' in script and "claims-gpu.toml --set \"seeds=[0]\"" in script
