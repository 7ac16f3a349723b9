"""DPO: the loss against the paper's equation, the step-0 identity, response-only log-probabilities,
a frozen reference, and learning on a small learnable preference set."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from align_fixtures import synthetic_pairs, tiny_model

from lmlab.align import (
    align,
    dpo_loss,
    encode_response,
    frozen_reference,
    preference_metrics,
    response_logprobs,
)
from lmlab.align.logprobs import IGNORE
from lmlab.errors import LmlabError
from lmlab.objectives.base import teacher_forced
from lmlab.tasks import collate

QUIET = {"progress": False, "log": lambda m: None}


def logps(seed: int, n: int = 6):
    g = torch.Generator().manual_seed(seed)
    return [-(torch.rand(n, generator=g) * 20 + 1) for _ in range(4)]


@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_dpo_loss_is_the_papers_equation(beta):
    pc, pr, rc, rr = logps(0)
    # Rafailov et al. 2023, eq. 7: -log sigma(beta log(pi(yw)/ref(yw)) - beta log(pi(yl)/ref(yl)))
    ratio_w, ratio_l = torch.log(pc.exp() / rc.exp()), torch.log(pr.exp() / rr.exp())
    expected = -F.logsigmoid(beta * ratio_w - beta * ratio_l).mean()
    assert torch.allclose(dpo_loss(pc, pr, rc, rr, beta), expected, atol=1e-5)


def test_label_smoothing_and_ipo_match_their_formulas():
    pc, pr, rc, rr = logps(1)
    beta, eps = 0.3, 0.2
    z = beta * ((pc - rc) - (pr - rr))
    cdpo = (-(1 - eps) * torch.log(torch.sigmoid(z)) - eps * torch.log(torch.sigmoid(-z))).mean()
    assert torch.allclose(dpo_loss(pc, pr, rc, rr, beta, label_smoothing=eps), cdpo, atol=1e-5)
    h = (pc - rc) - (pr - rr)
    ipo = ((h - 1 / (2 * beta)) ** 2).mean()
    assert torch.allclose(dpo_loss(pc, pr, rc, rr, beta, loss="ipo"), ipo, atol=1e-4)


def test_dpo_gradient_pushes_chosen_up_and_rejected_down():
    pc, pr, rc, rr = logps(2)
    pc.requires_grad_(True), pr.requires_grad_(True)
    beta = 0.5
    dpo_loss(pc, pr, rc, rr, beta).backward()
    h = (pc - rc) - (pr - rr)
    expected = -beta * torch.sigmoid(-beta * h.detach()) / len(pc)   # d/dpc of -log sigma(beta h), averaged
    assert torch.allclose(pc.grad, expected, atol=1e-6) and torch.allclose(pr.grad, -expected, atol=1e-6)


def test_preference_metrics_on_known_numbers():
    pc, pr = torch.tensor([-1.0, -5.0, -2.0]), torch.tensor([-3.0, -4.0, -2.0])
    rc, rr = torch.tensor([-2.0, -5.0, -2.0]), torch.tensor([-2.0, -3.0, -1.0])
    m = preference_metrics(pc, pr, rc, rr, beta=0.5)
    # margins: 0.5*[(1) - (-1)] = 1.0, 0.5*[0 - (-1)] = 0.5, 0.5*[0 - (-1)] = 0.5
    assert m["margin"] == pytest.approx(2 / 3) and m["win_rate"] == 1.0
    assert m["accuracy"] == pytest.approx(1 / 3) and m["ref_accuracy"] == 0   # ties are no preference
    assert m["chosen_reward"] == pytest.approx(0.5 / 3) and m["rejected_reward"] == pytest.approx(-1.5 / 3)


@pytest.mark.parametrize("bad", [{"beta": 0}, {"loss": "hinge"}, {"label_smoothing": 0.5},
                                 {"loss": "ipo", "label_smoothing": 0.1}])
def test_bad_dpo_options_are_one_line_errors(bad):
    pc, pr, rc, rr = logps(3)
    with pytest.raises(LmlabError) as e:
        dpo_loss(pc, pr, rc, rr, **{"beta": 0.1, **bad})
    assert "\n" not in str(e.value) and ";" in str(e.value)


def brute_force(model, prompt_ids, response_ids):
    """Sum of log p(token | everything before it), one forward pass per response token."""
    total = 0.0
    ids = list(prompt_ids)
    with torch.no_grad():
        for t in response_ids:
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            total += float(logits.double().log_softmax(-1)[t])
            ids.append(t)
    return total


def test_response_logprob_is_the_sum_over_response_tokens_only():
    model = tiny_model()
    tok = model.tokenizer
    rows = [encode_response(tok, model, "the cat sat on", " the mat", 64),
            encode_response(tok, model, "dog:", " yes or no", 64, eos=True)]
    with torch.no_grad():
        got = response_logprobs(model, collate(rows, 0))            # right-padded batch of two
    for row, value in zip(rows, got):
        ids, labels = row["input_ids"], row["labels"]
        start = next(i for i, v in enumerate(labels) if v != IGNORE)
        assert labels[start:] == ids[start:] and all(v == IGNORE for v in labels[:start])
        assert float(value) == pytest.approx(brute_force(model, ids[:start], ids[start:]), abs=1e-4)
    # the prompt is read, not scored: another prompt changes the value, the prompt's own targets don't count
    other = encode_response(tok, model, "red sun:", " the mat", 64)
    with torch.no_grad():
        full = collate([rows[0]], 0)
        scored_all = response_logprobs(model, {**full, "labels": full["input_ids"].clone()})
        moved = response_logprobs(model, collate([other], 0))
    assert not torch.allclose(scored_all, got[:1]) and not torch.allclose(moved, got[:1])
    targets = rows[0]["labels"][:]
    with torch.no_grad():
        again = response_logprobs(model, {**full, "labels": torch.tensor([targets])})
    assert torch.equal(again, got[:1])


def test_decoder_rows_keep_the_response_and_cut_the_prompt_from_the_left():
    model = tiny_model()
    tok = model.tokenizer
    row = encode_response(tok, model, "the cat sat on the mat " * 20, " yes", 16)
    assert len(row["input_ids"]) == 16 and tok.decode([v for v in row["labels"] if v != IGNORE]) == " yes"
    assert tok.decode(row["input_ids"][:-1]).endswith("the mat ")


@pytest.mark.parametrize("preset", ["t5-tiny", "bart-tiny"])
def test_encoder_decoder_response_logprob_matches_the_models_own_loss(preset):
    model = tiny_model(preset)
    tok = model.tokenizer
    row = encode_response(tok, model, "the cat sat on", " the mat", 64)
    batch = collate([row], 0)
    with torch.no_grad():
        got = float(response_logprobs(model, batch))
        _, loss = teacher_forced(model, {k: batch[k] for k in ("input_ids", "attention_mask", "labels")})
    n = len(row["labels"])
    assert got == pytest.approx(-float(loss) * n, rel=1e-5)
    assert row["labels"][-1] == tok.eos_id or row["labels"][-1] == model.config.eos_token_id


@pytest.mark.parametrize("preset", ["gpt2-tiny", "t5-tiny"])
def test_step_zero_is_the_reference_margin_zero_loss_log2(preset):
    res = align(tiny_model(preset), synthetic_pairs(16, 0), synthetic_pairs(12, 1), None, max_steps=2,
                batch_size=8, lr=1e-3, eval_every=2, **QUIET)
    s = res.start
    assert s["margin"] == 0 and s["win_rate"] == 0 and s["chosen_reward"] == 0 and s["rejected_reward"] == 0
    assert s["loss"] == pytest.approx(math.log(2), abs=1e-7) and s["accuracy"] == s["ref_accuracy"]
    assert res.history[0]["step"] == 0 and res.history[0]["dev_loss"] == s["loss"]
    assert res.metrics["margin"] != 0                       # and the policy has moved after two steps


def test_the_reference_stays_frozen_while_the_policy_trains(monkeypatch):
    from lmlab.train.engine import Engine

    calls = []
    real_step = Engine.step

    def counted(self, step, micro):
        calls.append(len(micro))
        return real_step(self, step, micro)

    monkeypatch.setattr(Engine, "step", counted)
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = align(model, synthetic_pairs(32, 0), synthetic_pairs(8, 1), None, max_steps=3, batch_size=4,
                grad_accum=2, lr=1e-3, **QUIET)
    ref = res.reference
    assert calls == [2, 2, 2]                                       # every update is the engine's
    assert not ref.training and all(not p.requires_grad and p.grad is None for p in ref.parameters())
    assert all(torch.equal(v, before[k]) for k, v in ref.state_dict().items())
    assert any(not torch.equal(v, before[k]) for k, v in res.model.state_dict().items())
    assert ref is not res.model


def test_frozen_reference_is_a_separate_copy():
    model = tiny_model()
    ref = frozen_reference(model.train())
    assert not ref.training and model.training
    ref_w = next(ref.parameters())
    assert ref_w.data_ptr() != next(model.parameters()).data_ptr() and not ref_w.requires_grad


def test_dpo_learns_a_synthetic_preference_on_held_out_pairs():
    res = align(tiny_model(), synthetic_pairs(200, 0), synthetic_pairs(60, 1), None, max_steps=40,
                batch_size=8, lr=1e-3, **QUIET)
    assert res.metrics["win_rate"] > 0.5 and res.metrics["margin"] > 0
    assert res.metrics["loss"] < math.log(2) and res.metrics["accuracy"] > res.start["accuracy"]
    dev_rows = [r for r in res.history if "dev_margin" in r]
    assert dev_rows[0]["dev_margin"] == 0 and dev_rows[-1]["dev_margin"] > dev_rows[1]["dev_margin"]
