"""The model builds the attention mask from what the input declares; the block-sparse
(FlexAttention) form gives the same numbers as the dense one. FlexAttention's GPU kernel is not
run here (no GPU on the development machine): its CPU reference implementation is, which takes
the same BlockMask and computes the same function."""

from __future__ import annotations

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.losses import head_loss
from lmlab.models import build_model, get_preset
from lmlab.models.attention_masks import MaskSpec, is_block_mask, same_document, self_attention_mask

DOCS = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [0] * 16])  # packed row, single-document row
PREFIX = torch.zeros(2, 16, dtype=torch.bool)
PREFIX[0, :2] = PREFIX[0, 5:9] = PREFIX[0, 12:13] = PREFIX[1, :6] = True


def _dense(mask, t=16, b=2):
    return (mask == 0).expand(b, 1, t, t)[:, 0]


def test_dense_masks_follow_the_declared_kind():
    causal = _dense(self_attention_mask(causal=True, q_len=16, doc_ids=DOCS)[0])
    tri = torch.ones(16, 16, dtype=torch.bool).tril()
    assert torch.equal(causal, tri & same_document(DOCS)[:, 0])
    both = _dense(self_attention_mask(causal=False, q_len=16, doc_ids=DOCS)[0])
    assert torch.equal(both, same_document(DOCS)[:, 0])
    prefix = _dense(self_attention_mask(causal=True, q_len=16, doc_ids=DOCS, prefix_mask=PREFIX)[0])
    assert prefix[0, 1, 1] and prefix[0, 0, 1] and not prefix[0, 0, 2]   # bidirectional in the prefix only
    assert not prefix[0, 5, 0] and prefix[0, 5, 8] and not prefix[0, 5, 9]  # its own document's prefix
    # nothing declared: the fused kernel's paths, no mask tensor at all
    assert self_attention_mask(causal=True, q_len=16) == (None, True)
    assert self_attention_mask(causal=False, q_len=16) == (None, False)
    with pytest.raises(LmlabError, match="cached"):
        self_attention_mask(causal=True, q_len=1, k_len=9, doc_ids=DOCS[:, :1])


def test_flex_gives_a_block_mask_only_where_it_can():
    assert is_block_mask(self_attention_mask(causal=True, q_len=16, doc_ids=DOCS, backend="flex")[0])
    padded = torch.ones(2, 16, dtype=torch.long)
    padded[1, 10:] = 0
    dense, _ = self_attention_mask(causal=True, q_len=16, doc_ids=DOCS, attention_mask=padded, backend="flex")
    assert not is_block_mask(dense)  # padding: the dense form
    assert self_attention_mask(causal=True, q_len=16, backend="flex") == (None, True)


@pytest.mark.parametrize("preset, prefix", [("gpt2-tiny", None), ("gpt2-tiny", PREFIX),
                                            ("llama-tiny", None), ("bert-tiny", None)])
def test_flex_and_dense_compute_the_same(preset, prefix):
    torch.manual_seed(0)
    model = build_model(get_preset(preset, vocab_size=300)).eval()
    mask = MaskSpec(causal=model.architecture == "decoder", doc_ids=DOCS, prefix=prefix)
    ids = torch.randint(5, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    if preset.startswith("bert"):
        labels[:, ::3] = -100
    outs = []
    with torch.no_grad():  # FlexAttention's CPU implementation has no backward pass
        for backend in ("sdpa", "flex"):
            model.attention_backend = backend
            assert model.backend_now() == backend
            outs.append(model(input_ids=ids, mask=mask))
        dense, flex = outs
        torch.testing.assert_close(flex.logits, dense.logits, rtol=1e-4, atol=1e-5)
        flex_loss, dense_loss = (head_loss(model.head_names[0], out.logits, labels) for out in outs)
        torch.testing.assert_close(flex_loss, dense_loss, rtol=1e-5, atol=1e-6)
        # the documents really are kept apart (the check can fail): changing document 0 leaves the rest
        changed = ids.clone()
        changed[0, :5] = torch.randint(5, 300, (5,))
        after = model(input_ids=changed, mask=mask).last_hidden_state
    torch.testing.assert_close(after[0, 5:], flex.last_hidden_state[0, 5:], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(after[0, :5], flex.last_hidden_state[0, :5])


def test_where_flex_cannot_run_the_dense_kernel_does():
    model = build_model(get_preset("gpt2-tiny", vocab_size=300, attn_dropout=0.1)).train()
    model.attention_backend = "flex"
    assert model.backend_now() == "sdpa"                     # attention dropout in training
    assert model.eval().backend_now() == "sdpa"              # gradients on a CPU
    with torch.no_grad():
        assert model.backend_now() == "flex"


def test_training_with_flex_on_a_cpu_is_refused_before_any_work(tmp_path, capsys):
    from lmlab.cli import main

    code = main(["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", str(tmp_path / "r"),
                 "--set", "train.attention=flex", "train.device=cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --set train.attention=flex trains on CUDA only")
    assert not (tmp_path / "r").exists()
