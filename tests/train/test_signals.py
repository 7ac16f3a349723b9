"""Each objective's learning signal sits beside its trivial baseline in the log; perplexity and bits
per byte appear only where the loss is a per-token negative log-likelihood."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import mannwhitneyu

from lmlab.objectives.base import binary_auc, most_frequent_share, token_signal
from lmlab.train import pretrain


def test_auc_is_the_mann_whitney_statistic():
    g = torch.Generator().manual_seed(0)
    labels = torch.rand(400, generator=g) < 0.2
    scores = torch.randn(400, generator=g) + labels.float()
    u = mannwhitneyu(scores[labels].numpy(), scores[~labels].numpy()).statistic
    auc = float(binary_auc(scores, labels.long()))
    assert auc == pytest.approx(u / (labels.sum() * (~labels).sum()).item())
    assert float(binary_auc(scores, torch.zeros(400, dtype=torch.long))) == 0.5
    # over the kept positions only, ranked in place: the same as selecting them first
    keep = torch.rand(400, generator=g) < 0.5
    kept = mannwhitneyu(scores[keep & labels].numpy(), scores[keep & ~labels].numpy()).statistic
    n_pos, n_neg = (keep & labels).sum().item(), (keep & ~labels).sum().item()
    assert float(binary_auc(scores, labels, keep)) == pytest.approx(kept / (n_pos * n_neg))
    assert float(binary_auc(scores, labels, keep & ~labels)) == 0.5


def test_token_signal_against_the_most_frequent_token():
    labels = torch.tensor([[5, 5, -100, 7], [5, 9, -100, -100]])
    logits = torch.zeros(2, 4, 10)
    logits[..., 5] = 1.0  # always "5": right on 3 of the 5 targets, exactly the guess
    assert token_signal(logits, labels, "mlm") == pytest.approx({"mlm_acc": 0.6, "mlm_acc_guess": 0.6})
    assert most_frequent_share(torch.tensor([1, 2, 2, 3])) == 0.5


def test_token_signal_breaks_ties_as_argmax_does():
    # a model whose logits are all equal predicts the first token, as argmax does: it must not be
    # scored right wherever the label merely shares the maximum (that would report accuracy 1.0)
    labels = torch.tensor([[0, 3, 3, 1]])
    assert token_signal(torch.zeros(1, 4, 6), labels, "lm")["lm_acc"] == pytest.approx(0.25)
    tied = torch.zeros(1, 4, 6)
    tied[..., 1] = tied[..., 3] = 2.0  # two maxima: the first, 1, is the prediction
    assert token_signal(tied, labels, "lm")["lm_acc"] == pytest.approx(0.25)
    logits = torch.randn(3, 16, 50, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(1))
    expected = (logits.argmax(-1) == targets).float().mean()
    assert token_signal(logits, targets, "lm")["lm_acc"] == pytest.approx(float(expected))


def _run(tiny_data, tmp_path, preset, objective, **model):
    cfg = {"model": {"preset": preset, "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64,
                     "max_positions": 64, "dropout": 0.0, "attn_dropout": 0.0, **model},
           "objective": {"name": objective},
           "data": {"train": [str(tiny_data["train"])], "val": [str(tiny_data["val"])]},
           "train": {"max_steps": 2, "batch_size": 4, "seq_len": 32, "eval_every": 2, "eval_batches": 2,
                     "warmup_steps": 0, "checkpoint_every": 2, "threads": 1, "progress": "off"}}
    said: list[str] = []
    summary = pretrain(cfg, tmp_path / objective, log=said.append)
    return summary, "\n".join(said)


def test_electra_logs_discriminator_signals_and_no_perplexity(tiny_data, tmp_path):
    summary, log = _run(tiny_data, tmp_path, "electra-tiny", "electra")
    assert summary["val_ppl"] is None and summary["val_bpb"] is None
    assert "ppl" not in log and "bits/byte" not in log
    assert "disc_acc" in log and "(all original: " in log and "disc_auc" in log and "(chance: 0.5000)" in log
    signals = summary["val_signals"]
    assert signals["val_disc_acc_guess"] == pytest.approx(1 - signals["val_replaced"])
    assert 0 <= signals["val_disc_auc"] <= 1


def test_mlm_has_perplexity_of_masked_tokens_but_no_bits_per_byte(tiny_data, tmp_path):
    summary, log = _run(tiny_data, tmp_path, "bert-tiny", "mlm")
    assert summary["val_ppl"] is not None and summary["val_bpb"] is None
    assert "mlm_acc" in log and "(most frequent token: " in log and "bits/byte" not in log


def test_clm_keeps_perplexity_and_bits_per_byte(tiny_data, tmp_path):
    summary, log = _run(tiny_data, tmp_path, "gpt2-tiny", "clm")
    assert summary["val_ppl"] is not None and summary["val_bpb"] is not None
    assert "next_acc" in log and "bits/byte" in log


@pytest.mark.parametrize("name", sorted(__import__("lmlab.objectives", fromlist=["OBJECTIVES"]).OBJECTIVES))
def test_every_objective_declares_a_signal_with_its_baseline(name):
    from lmlab.objectives import get_objective

    signals = get_objective(name).signals
    assert signals, f"{name} declares no learning signal"
    for metric, baseline, what in signals:
        assert baseline.startswith(metric) and what



def test_the_validation_text_is_named():
    """A validation loss means little without its text: held out of the training documents, or
    named files (another corpus measures the gap between corpora, not learning)."""
    from lmlab.train.config import DataConfig
    from lmlab.train.data import describe_val

    held_out = describe_val(DataConfig(train=["books/"], val_fraction=0.05))
    assert held_out.startswith("5% of the data.train documents, held out")
    wiki = "$LMLAB_DATA/pretrain/wikitext-2/wiki.valid.tokens"
    assert describe_val(DataConfig(train=["books/"], val=[wiki])) == "data.val wiki.valid.tokens"
    assert describe_val(DataConfig(train=["shards/"]), train_is_shards=True) == (
        "the val split of the data.train shards")


def test_the_log_says_where_the_validation_text_comes_from(tiny_data, tmp_path):
    _, log = _run(tiny_data, tmp_path, "gpt2-tiny", "clm")
    assert "eval windows) from data.val val;" in log
