"""ELECTRA: discriminator labels = (corrupted != original) exactly, shared embeddings, no gradient
through sampling, joint loss, training on real text."""

from __future__ import annotations

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.losses import binary_token_loss
from lmlab.models import build_model, get_preset
from lmlab.objectives import get_objective
from lmlab.objectives.base import encoder_hidden
from lmlab.objectives.electra import Electra, replaced_token_labels


@pytest.fixture()
def setup(tok, book_paragraphs, packer):
    torch.manual_seed(0)
    model = build_model(get_preset("electra-tiny", vocab_size=tok.vocab_size, max_positions=128))
    obj = Electra(tok)
    obj.setup(model)
    batch = packer(tok, book_paragraphs, rows=8, seq_len=128, start=50)
    return model, obj, batch


def test_registered():
    assert get_objective("electra") is Electra
    assert Electra.heads == ("discriminator",)


def test_label_function():
    original = torch.tensor([[2, 10, 11, 12, 13, 3]])
    corrupted = torch.tensor([[2, 10, 99, 12, 13, 3]])  # position 3 was masked but sampled back as 12
    special = torch.tensor([[True, False, False, False, False, True]])
    assert replaced_token_labels(original, corrupted, special).tolist() == [[-100, 0, 1, 0, 0, -100]]


def test_generator_input_keeps_15_percent_of_the_selected_tokens_as_the_reference(setup, tok):
    """google-research/electra (pretrain_helpers.mask): of the selected tokens, 85% become [MASK] and
    the rest stay unchanged (no random tokens)."""
    model, obj, batch = setup
    inputs = obj.prepare(batch, torch.Generator().manual_seed(0))
    selected = inputs["labels"] != -100
    masked = inputs["input_ids"][selected] == tok.token_to_id["[MASK]"]
    kept = inputs["input_ids"][selected] == batch.input_ids[selected]
    assert bool((masked | kept).all())
    assert 0.80 < float(masked.float().mean()) < 0.90, float(masked.float().mean())


def test_sampled_original_counts_as_original(setup, tok):
    model, obj, batch = setup
    inputs = obj.prepare(batch, torch.Generator().manual_seed(0))
    masked = inputs["labels"] != -100
    # force the generator to always sample the most frequent token of the batch
    frequent = int(batch.input_ids.flatten().mode().values)
    with torch.no_grad():
        obj.generator.bias[frequent] = 1e4
    _, _, corrupted = obj.corrupt(model, inputs)
    assert bool((corrupted[masked] == frequent).all())
    assert torch.equal(corrupted[~masked], batch.input_ids[~masked])
    labels = replaced_token_labels(batch.input_ids, corrupted, torch.isin(batch.input_ids,
                                                                        torch.tensor(sorted(tok.special_ids))))
    hit = masked & (batch.input_ids == frequent)
    assert int(hit.sum()) > 0  # some masked tokens were the frequent one: sampled == original
    assert bool((labels[hit] == 0).all())
    assert bool((labels[masked & ~hit] == 1).all())
    assert bool((labels[~masked] == 0).all())


def test_joint_loss_shared_embeddings_and_no_gradient_through_sampling(setup):
    model, obj, batch = setup
    inputs = obj.prepare(batch, torch.Generator().manual_seed(1))
    # the generator owns no embedding tables: shared weights live (and are optimised) once, in the model
    model_ids = {id(p) for p in model.parameters()}
    assert not any(id(p) in model_ids for p in obj.parameters())
    n_gen = sum(p.numel() for p in obj.parameters())
    assert 0 < n_gen < model.num_parameters() / 2
    loss, metrics = obj.loss(model, inputs)
    assert loss.item() == pytest.approx(float(metrics["gen_loss"] + 50 * metrics["disc_loss"]), rel=1e-5)
    assert 0.05 < float(metrics["replaced"]) < 0.16  # ~15% masked, most samples differ from the original
    # the discriminator's loss alone gives the generator no gradient (sampling is not differentiable)
    _, _, corrupted = obj.corrupt(model, inputs)
    none_special = torch.zeros_like(corrupted, dtype=torch.bool)
    labels = replaced_token_labels(inputs["original_ids"], corrupted, none_special)
    hidden = encoder_hidden(model, {**inputs, "input_ids": corrupted, "token_type_ids": None})
    binary_token_loss(model.heads["discriminator"](hidden), labels).backward()
    assert all(p.grad is None for p in obj.generator.parameters())
    # the generator's loss reaches the shared token embeddings
    model.zero_grad()
    gen_loss, _, _ = obj.corrupt(model, inputs)
    gen_loss.backward()
    assert model.embeddings.word.weight.grad.abs().sum() > 0
    assert obj.generator.dense.weight.grad.abs().sum() > 0


def test_sampling_is_reproducible(setup):
    model, obj, batch = setup
    model.eval()
    obj.eval()  # the generator's dropout off too: the same logits, so the same draws
    a = obj.corrupt(model, obj.prepare(batch, torch.Generator().manual_seed(5)))[2]
    b = obj.corrupt(model, obj.prepare(batch, torch.Generator().manual_seed(5)))[2]
    c = obj.corrupt(model, obj.prepare(batch, torch.Generator().manual_seed(6)))[2]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_rotary_discriminator_gives_the_generator_positions(tok, book_paragraphs, packer):
    torch.manual_seed(0)
    cfg = get_preset("electra-tiny", vocab_size=tok.vocab_size, positions="rotary", init_std=0.2)
    model = build_model(cfg)
    obj = Electra(tok)
    obj.setup(model)
    obj.generator.eval()
    assert obj.generator.rotary is not None
    batch = packer(tok, book_paragraphs, rows=2, seq_len=32, start=50)
    positions = obj.prepare(batch, torch.Generator().manual_seed(0))["label_positions"]
    embedded = torch.randn(2, 32, model.embeddings.word.weight.shape[1])
    word = model.embeddings.word.weight
    with torch.no_grad():
        base = obj.generator(embedded, word, positions, None)
        shifted = obj.generator(embedded, word, positions, None, torch.arange(32)[None] + 5)
        moved = obj.generator(embedded, word, positions, None, torch.arange(32).flip(0)[None])
    assert torch.allclose(base, shifted, atol=1e-4)  # relative offsets only
    assert not torch.allclose(base, moved, atol=1e-3)  # but it sees where its neighbours are


def test_needs_setup_and_a_discriminator(tok, book_paragraphs, packer):
    obj = Electra(tok)
    batch = packer(tok, book_paragraphs, rows=2, seq_len=32)
    model = build_model(get_preset("electra-tiny", vocab_size=tok.vocab_size))
    with pytest.raises(LmlabError, match="setup"):
        obj.loss(model, obj.prepare(batch, torch.Generator()))
    with pytest.raises(LmlabError, match="discriminator"):
        obj.setup(build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size)))
    with pytest.raises(LmlabError):
        Electra(tok, generator_size=0)


def test_trains_and_lowers_validation_loss(tok, book_paragraphs, wiki_paragraphs, packer, trainer):
    torch.manual_seed(0)
    model = build_model(get_preset("electra-tiny", vocab_size=tok.vocab_size, max_positions=128))
    obj = Electra(tok)
    obj.setup(model)
    train = [packer(tok, book_paragraphs, 8, 128, start=i * 20) for i in range(10)]
    val = [packer(tok, wiki_paragraphs, 16, 128, start=i * 30) for i in range(2)]
    before, after = trainer(obj, model, train, val, steps=30)
    assert after < before * 0.8, (before, after)


def test_sampling_draws_from_the_generators_softmax():
    """The hashed inverse-transform draw (no generator state, nothing read on the host) has the
    softmax's distribution: frequencies within 4 binomial sigmas on 40k rows, never a token of
    probability 0, and other draws for another seed."""
    from lmlab.objectives.electra import sample_tokens

    n = 40_000
    logits = torch.tensor([0.0, 1.0, 2.0, -float("inf"), 0.5]).expand(n, -1)
    p = torch.softmax(logits[0], -1)
    drawn = sample_tokens(logits, torch.tensor([123]))
    freq = torch.bincount(drawn, minlength=5).double() / n
    assert freq[3] == 0
    assert torch.all((freq - p).abs() <= 4 * (p * (1 - p) / n).sqrt() + 1e-12), (freq, p)
    assert torch.equal(drawn, sample_tokens(logits, torch.tensor(123)))  # a pure function of the seed
    assert (drawn != sample_tokens(logits, torch.tensor([124]))).float().mean() > 0.3
    assert sample_tokens(logits[:0], torch.tensor([1])).shape == (0,)
