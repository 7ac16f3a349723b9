"""An objective's learning signal must not be earned without learning: a model that copies its
input, or predicts T5's sentinels (whose order is fixed), scores nothing beyond what it sees."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from lmlab.models.output import ModelOutput
from lmlab.objectives import get_objective
from lmlab.objectives.masking import IGNORE
from tests.objectives.conftest import pack


class CopiesItsInput(nn.Module):
    """An encoder whose hidden state at each position is the token it is given (one-hot), under an
    identity ``mlm`` head: it predicts its input everywhere (the objective contract: the objective
    calls ``backbone`` and the head it chooses)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.heads = nn.ModuleDict({"mlm": nn.Identity()})

    def backbone(self, input_ids, positions=None, mask=None, token_type_ids=None):
        return nn.functional.one_hot(input_ids, self.vocab_size).float()


def test_mlm_accuracy_leaves_out_the_tokens_kept_unchanged(tok, book_paragraphs):
    objective = get_objective("mlm")(tok, mask_prob=0.5)  # 80/10/10: a tenth of the targets are shown
    batch = pack(tok, book_paragraphs, rows=8, seq_len=64)
    inputs = objective.prepare(batch, torch.Generator().manual_seed(0))
    kept = int(((inputs["input_ids"] == inputs["labels"]) & (inputs["labels"] != IGNORE)).sum())
    assert kept > 10  # the batch does hold targets the input shows
    _, metrics = objective.loss(CopiesItsInput(tok.vocab_size), inputs)
    assert metrics["mlm_acc"] == 0.0  # copying earns nothing: [MASK] and random tokens are never right


def test_electra_generator_accuracy_leaves_out_the_tokens_kept_unchanged(tok, book_paragraphs):
    from lmlab.models import build_model, get_preset
    objective = get_objective("electra")(tok, mask_prob=0.5, mask_token_prob=0.5)
    model = build_model(get_preset("electra-tiny").replace(vocab_size=tok.vocab_size, d_model=32, d_ff=64,
                                                         n_layers=1, n_heads=2, embedding_size=32),
                        heads=("discriminator",))
    objective.setup(model)
    batch = pack(tok, book_paragraphs, rows=4, seq_len=64)
    inputs = objective.prepare(batch, torch.Generator().manual_seed(0))
    shown = (inputs["input_ids"] == inputs["labels"]) & (inputs["labels"] != IGNORE)
    assert int(shown.sum()) > 10
    # a generator that copies its input: right exactly where the input shows the answer
    objective.corrupt = lambda m, i: (torch.zeros(()), nn.functional.one_hot(
        i["input_ids"][i["labels"] != IGNORE], tok.vocab_size).float(), i["original_ids"])
    _, metrics = objective.loss(model, inputs)
    assert metrics["gen_acc"] == 0.0


def test_t5_accuracy_leaves_out_the_sentinels(tok, book_paragraphs):
    import copy
    t5tok = copy.deepcopy(tok)
    objective = get_objective("t5")(t5tok)
    batch = pack(t5tok, book_paragraphs, rows=4, seq_len=64)
    inputs = objective.prepare(batch, torch.Generator().manual_seed(0))
    labels = inputs["labels"]
    sentinel = torch.isin(labels, torch.tensor(objective.sentinel_ids))
    assert int(sentinel.sum()) >= 4

    class PredictsSentinels(nn.Module):  # right on every sentinel, wrong on every content token
        config = SimpleNamespace(decoder_start_token_id=0, pad_token_id=0)

        def forward(self, decoder_input_ids=None, **_):
            logits = torch.zeros(*decoder_input_ids.shape, t5tok.vocab_size)
            target = torch.where(sentinel, labels, torch.full_like(labels, objective.sentinel_ids[-1]))
            logits.scatter_(-1, target.clamp(min=0)[..., None], 1.0)
            return ModelOutput(logits=logits, loss=torch.zeros(()))

        # the objective scores the decoder through the backbone calls: encode, decode, lm_scores
        def encode(self, input_ids, *_):
            return ModelOutput(last_hidden_state=torch.zeros(()))

        def decode(self, decoder_input_ids, *_):
            return decoder_input_ids  # stands in for the hidden states

        def lm_scores(self, hidden):
            return self(decoder_input_ids=hidden).logits

    _, metrics = objective.loss(PredictsSentinels(), inputs)
    assert metrics["target_acc"] == 0.0
