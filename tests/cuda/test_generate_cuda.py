"""Generation with the KV cache on CUDA equals transformers' generate on the same weights."""

from __future__ import annotations

import pytest
import torch

from lmlab.generate import generate
from lmlab.loading import load_model

pytestmark = pytest.mark.cuda
tf = pytest.importorskip("transformers")
V = 64


def _hf(family: str):
    if family == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                                bos_token_id=0, eos_token_id=0))
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0))


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    """(HF model, lmlab model read from its save_pretrained folder), both on the GPU, in float32."""
    torch.manual_seed(0)
    hf = _hf(request.param)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # large random weights: tiny random models otherwise repeat one token
        for p in hf.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g))
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d, safe_serialization=True)
    return hf.eval().cuda(), load_model(d).eval().cuda()


def _prompt():
    return torch.randint(3, V, (2, 4), generator=torch.Generator().manual_seed(1)).cuda()


@pytest.mark.parametrize("kw", [{}, {"num_beams": 3}, {"repetition_penalty": 1.3}],
                         ids=["greedy", "beam", "penalty"])
def test_cached_generation_on_cuda_equals_transformers(pair, kw):
    hf, model = pair
    ids = _prompt()
    stop = {"eos_token_id": 0, "pad_token_id": 0}
    ours = generate(model, ids, max_new_tokens=12, use_cache=True, **stop, **kw)
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False, **stop,
                         **kw)
    assert ours.device.type == "cuda"
    assert ours.tolist() == theirs.tolist()


def test_cached_and_uncached_agree_on_cuda(pair):
    _, model = pair
    ids = _prompt()
    for kw in ({}, {"do_sample": True, "seed": 7, "top_k": 20}):
        cached = generate(model, ids, max_new_tokens=12, eos_token_id=[], use_cache=True, **kw)
        plain = generate(model, ids, max_new_tokens=12, eos_token_id=[], use_cache=False, **kw)
        assert torch.equal(cached, plain)
    with torch.no_grad():  # and the logits themselves agree with transformers'
        ours = model(input_ids=ids).logits
        theirs = pair[0](input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
