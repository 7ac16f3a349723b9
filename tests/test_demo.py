"""`lmlab demo` runs end to end: tokenizer, a short pretraining that lowers the loss, a sample."""

from lmlab.cli import main


def test_demo_trains_tokenizer_pretrains_and_samples(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "30", "--vocab-size", "600"]) == 0
    printed = capsys.readouterr().out
    assert "bytes per token" in printed and "ROMEO:" in printed
    from lmlab.loading import load_model
    from lmlab.tokenizers import load_tokenizer

    tok = load_tokenizer(out / "tokenizer")
    assert tok.vocab_size == 600
    ckpts = sorted((out / "run" / "checkpoints").iterdir())
    model = load_model(ckpts[-1])
    assert model.config.vocab_size >= 600
    assert (out / "run" / "loss.png").stat().st_size > 1000
    import json

    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["val_loss"] < summary["initial_val_loss"] - 0.5
