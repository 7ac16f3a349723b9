"""Generation: processors vs their definitions and transformers, cached == uncached, HF generate parity."""

from __future__ import annotations

import json

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.generate import generate, repetition_penalty, temperature, top_k, top_p
from lmlab.generate.sampling import sample
from lmlab.generate.search import _Decoding, _Stops, beam_search
from lmlab.loading import load_model
from lmlab.models import get_preset
from lmlab.models.rnn import ELMoBiLM, LSTMLanguageModel

tf = pytest.importorskip("transformers")
V = 64


# --------------------------------------------------------------------------- models with identical weights
def _perturb(model, std: float = 1.0):
    """Random init with large weights: tiny random models otherwise repeat one token forever."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def _hf_models():
    return {
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2,
                                                         n_head=4, bos_token_id=0, eos_token_id=0)),
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)),
        "t5": lambda: tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64,
                                                                 num_layers=2, num_heads=4, pad_token_id=0,
                                                                 eos_token_id=1, decoder_start_token_id=0)),
        "bart": lambda: tf.BartForConditionalGeneration(tf.BartConfig(
            vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
            forced_eos_token_id=None, forced_bos_token_id=None)),
    }


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """family -> (HF model, lmlab model loaded from the HF model's save_pretrained directory)."""
    out = {}
    for family, make in _hf_models().items():
        torch.manual_seed(0)
        hf = _perturb(make())
        d = tmp_path_factory.mktemp(family)
        hf.save_pretrained(d, safe_serialization=True)
        out[family] = (hf, load_model(d))
    return out


@pytest.fixture(scope="module")
def lstm_lm():
    torch.manual_seed(0)
    return _perturb(LSTMLanguageModel(get_preset("lstm-tiny", vocab_size=V, dropout=0.0)), std=0.5)


def _prompt(family: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, V, (2, 5 if family in ("t5", "bart") else 4), generator=g)


def _firing_eos(model, ids) -> int:
    """A stop token that greedy decoding actually produces mid-way, so stopping gets exercised."""
    free = generate(model, ids, max_new_tokens=10, eos_token_id=[])
    start = 1 if model.architecture == "seq2seq" else ids.shape[1]
    return int(free[0, start + 4])


FAMILIES = ["gpt2", "llama", "t5", "bart"]
MODES = {
    "greedy": {},
    "beam": {"num_beams": 3},
    "beam-returns": {"num_beams": 3, "num_return_sequences": 2, "length_penalty": 0.6},
    "sample": {"do_sample": True, "seed": 7},
    "sample-warped": {"do_sample": True, "seed": 7, "temperature": 0.8, "top_k": 20, "top_p": 0.9,
                      "repetition_penalty": 1.3, "num_return_sequences": 2},
}


# --------------------------------------------------------------------------- cached == uncached
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES + ["lstm"])
def test_cached_and_uncached_decoding_give_identical_tokens(pairs, lstm_lm, family, mode):
    model = lstm_lm if family == "lstm" else pairs[family][1]
    ids = _prompt(family)
    eos = _firing_eos(model, ids)
    kw = dict(MODES[mode], max_new_tokens=10, eos_token_id=eos)
    cached = generate(model, ids, use_cache=True, **kw)
    uncached = generate(model, ids, use_cache=False, **kw)
    assert torch.equal(cached, uncached), (cached, uncached)
    start = 1 if family in ("t5", "bart") else ids.shape[1]
    assert cached.shape[1] > start


# --------------------------------------------------------------------------- parity with transformers
@pytest.mark.parametrize("mode", ["greedy", "beam", "beam-returns", "greedy-penalty", "beam-penalty"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_and_beam_equal_transformers_generate(pairs, family, mode):
    hf, model = pairs[family]
    ids = _prompt(family)
    eos = _firing_eos(model, ids)
    penalty = {"greedy-penalty": {"repetition_penalty": 1.3},
               "beam-penalty": {"num_beams": 3, "repetition_penalty": 1.3}}
    kw = dict(penalty.get(mode) or MODES[mode], max_new_tokens=10, eos_token_id=eos, pad_token_id=eos)
    ours = generate(model, ids, **kw)
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, **kw)
    assert ours.tolist() == theirs.tolist()
    assert (ours == eos).any(), "the stop token never fired: the test would not check stopping"


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_left_padded_batch_equals_transformers(pairs, family):
    hf, model = pairs[family]
    ids = torch.tensor([[7, 8, 9, 10, 11], [0, 0, 21, 22, 23]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    for kw in ({}, {"num_beams": 3}):
        ours = generate(model, ids, mask, max_new_tokens=6, eos_token_id=0, pad_token_id=0, **kw)
        theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=0,
                             pad_token_id=0, **kw)
        assert ours.tolist() == theirs.tolist()
    # the padded prompt continues exactly as it does alone
    alone = generate(model, ids[1:, 2:], max_new_tokens=6, eos_token_id=[])
    batched = generate(model, ids, mask, max_new_tokens=6, eos_token_id=[])
    assert batched[1, 5:].tolist() == alone[0, 3:].tolist()


# --------------------------------------------------------------------------- decoding identities
@pytest.mark.parametrize("family", ["gpt2", "t5", "lstm"])
def test_one_beam_equals_greedy_and_top_k_one_equals_greedy(pairs, lstm_lm, family):
    model = lstm_lm if family == "lstm" else pairs[family][1]
    ids = _prompt(family)
    eos = _firing_eos(model, ids)
    greedy = generate(model, ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=2)
    assert (greedy == eos).any()
    start = getattr(model.config, "decoder_start_token_id", None)
    one_beam = beam_search(_Decoding(model, ids, None, True, start), [], _Stops([eos], []), max_new_tokens=10,
                           num_beams=1, pad_token_id=2)
    assert one_beam.tolist() == greedy.tolist()
    top1 = generate(model, ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=2, do_sample=True, top_k=1,
                    seed=3)
    assert top1.tolist() == greedy.tolist()


class _MarkovLM(torch.nn.Module):
    """A 'decoder' whose next-token distribution depends only on the last token: hand-checkable beams."""

    architecture = "decoder"

    def __init__(self, table: dict[int, dict[int, float]], vocab_size: int = 4):
        super().__init__()
        self.config = type("Config", (), {"vocab_size": vocab_size, "eos_token_id": 0, "pad_token_id": 0})()
        probs = torch.full((vocab_size, vocab_size), 1e-9)
        for prev, row in table.items():
            for tok, p in row.items():
                probs[prev, tok] = p
        self.logprobs = (probs / probs.sum(-1, keepdim=True)).log()

    def forward(self, input_ids, past_key_values=None, use_cache=False, **unused):
        from lmlab.models.output import ModelOutput

        past = ((torch.zeros(input_ids.shape[0], 1),),) if use_cache else None
        return ModelOutput(logits=self.logprobs[input_ids], past_key_values=past)


@pytest.mark.parametrize("length_penalty, expected", [
    # lp=1: finished scores: [3 1 0] -1.309/2, [3 0] -0.693/1, [3 2 0] -1.714/2; then the best running beam
    # (-3.507/2) cannot beat the worst kept (-0.693), so the search stops
    (1.0, [[3, 1, 0], [3, 0, 0]]),
    # lp=2 favours length: [3 1 0] -1.309/4, [3 2 0] -1.714/4 push out [3 0]; the search stops at length 2
    # although [3 1 1 0] (-3.612/9 = -0.401) would later beat [3 2 0]: the early-stop rule transformers uses
    (2.0, [[3, 1, 0], [3, 2, 0]]),
])
def test_beam_search_scores_and_stopping_rule_by_hand(length_penalty, expected):
    model = _MarkovLM({3: {0: 0.5, 1: 0.3, 2: 0.2}, 1: {0: 0.9, 1: 0.1}, 2: {0: 0.9, 2: 0.1}})
    for cache in (True, False):
        out = generate(model, torch.tensor([[3]]), num_beams=2, num_return_sequences=2, max_new_tokens=6,
                       length_penalty=length_penalty, use_cache=cache)
        assert out.tolist() == expected


def test_seeded_sampling_is_reproducible_and_seed_dependent(pairs):
    model = pairs["gpt2"][1]
    ids = _prompt("gpt2")
    a = generate(model, ids, max_new_tokens=12, do_sample=True, seed=11, eos_token_id=[])
    b = generate(model, ids, max_new_tokens=12, do_sample=True, seed=11, eos_token_id=[])
    c = generate(model, ids, max_new_tokens=12, do_sample=True, seed=12, eos_token_id=[])
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_stop_sequences_end_a_row_and_pad_the_rest(pairs):
    model = pairs["gpt2"][1]
    ids = _prompt("gpt2")
    free = generate(model, ids, max_new_tokens=10, eos_token_id=[])
    stop = free[0, 6:8].tolist()              # generated tokens 3 and 4 of row 0
    out = generate(model, ids, max_new_tokens=10, eos_token_id=[], stop_sequences=[stop], pad_token_id=1)
    assert out[0, :8].tolist() == free[0, :8].tolist()
    row1_has_stop = any(free[1, i:i + 2].tolist() == stop for i in range(4, 13))
    if not row1_has_stop:
        assert out[1].tolist() == free[1].tolist()
    if out.shape[1] > 8:
        assert set(out[0, 8:].tolist()) == {1}


# --------------------------------------------------------------------------- processors
def test_repetition_penalty_follows_ctrl_definition():
    scores = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    seq = torch.tensor([[0, 1, 0]])                  # token 0 twice: penalised once
    out = repetition_penalty(seq, scores, 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]
    g = torch.Generator().manual_seed(0)
    scores, seq = torch.randn(4, 30, generator=g), torch.randint(0, 30, (4, 9), generator=g)
    ref = tf.RepetitionPenaltyLogitsProcessor(1.3)(seq, scores.clone())
    torch.testing.assert_close(repetition_penalty(seq, scores, 1.3), ref)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    scores = probs.log()
    kept = lambda p: (top_p(scores, p) > float("-inf"))[0].tolist()  # noqa: E731
    assert kept(0.4) == [False, True, False, False]        # 0.5 alone reaches 0.4
    assert kept(0.75) == [False, True, False, True]        # 0.5 + 0.3
    assert kept(0.85) == [False, True, True, True]         # 0.5 + 0.3 + 0.15
    assert kept(1.0) == [True, True, True, True]
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 50, generator=g) * 2
    for p in (0.3, 0.9):
        ref = tf.TopPLogitsWarper(p)(None, scores.clone())
        assert torch.equal(top_p(scores, p) == float("-inf"), ref == float("-inf"))


def test_top_k_and_temperature_match_transformers():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 40, generator=g)
    kept = top_k(scores, 5) > float("-inf")
    assert kept.sum(dim=1).tolist() == [5, 5, 5]
    assert torch.equal(top_k(scores, 5), tf.TopKLogitsWarper(5)(None, scores.clone()))
    ref = tf.TemperatureLogitsWarper(0.7)(None, scores.clone())
    torch.testing.assert_close(temperature(scores, 0.7), ref)


def test_sampler_draws_from_the_distribution():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3]).repeat(20000, 1)
    draws = sample(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    assert freq[1] == 0
    torch.testing.assert_close(freq, probs[0], atol=0.015, rtol=0)


# --------------------------------------------------------------------------- errors
def test_bad_requests_are_one_line_errors(pairs):
    model = pairs["gpt2"][1]
    with pytest.raises(LmlabError, match="prompt token id 64 is out of range"):
        generate(model, torch.tensor([[1, 64]]))
    with pytest.raises(LmlabError, match="out of range"):
        generate(model, torch.tensor([[-1, 3]]))
    with pytest.raises(LmlabError, match="non-empty"):
        generate(model, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(LmlabError, match="temperature"):
        generate(model, torch.tensor([[1]]), do_sample=True, temperature=0.0)
    with pytest.raises(LmlabError, match="num_return_sequences 4 exceeds num_beams 2"):
        generate(model, torch.tensor([[1]]), num_beams=2, num_return_sequences=4)
    with pytest.raises(LmlabError, match="64 positions"):
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=100)
    with pytest.raises(LmlabError, match="top_p"):
        generate(model, torch.tensor([[1]]), do_sample=True, top_p=1.5)
    elmo = ELMoBiLM(get_preset("elmo-tiny", vocab_size=V), vocab=[str(i) for i in range(V)])
    with pytest.raises(LmlabError, match="cannot generate"):
        generate(elmo, torch.tensor([[1]]))


# --------------------------------------------------------------------------- the `lmlab generate` command
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, shakespeare):
    """gpt2-tiny and t5-tiny checkpoints with a byte-level tokenizer trained on Shakespeare."""
    from lmlab.models import build_model
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("bytelevel", [shakespeare[:20000]], vocab_size=300)
    root = tmp_path_factory.mktemp("cli")
    out = {}
    for family in ("gpt2", "t5"):
        torch.manual_seed(0)
        model = build_model(get_preset(f"{family}-tiny", vocab_size=tok.vocab_size, eos_token_id=tok.eos_id,
                                       bos_token_id=tok.bos_id))
        _perturb(model, std=0.3).save(root / family, tokenizer=tok)
        out[family] = root / family
    model.save(root / "no-tokenizer")
    out["no-tokenizer"] = root / "no-tokenizer"
    return out


def _cli(capsys, *args):
    from assertions import exit_code

    code = exit_code(["generate", *map(str, args)])  # a flag's refused value: argparse's exit code 2
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_cli_greedy_prints_the_library_continuation(checkpoints, capsys):
    code, out, _ = _cli(capsys, "--checkpoint", checkpoints["gpt2"], "--prompt", "ROMEO:", "--temperature", 0,
                        "--max-new-tokens", 8)
    assert code == 0
    model = load_model(checkpoints["gpt2"])
    tok = model.tokenizer
    ids = tok.encode("ROMEO:")
    new = generate(model, torch.tensor([ids]), max_new_tokens=8)[0, len(ids):].tolist()
    if tok.eos_id in new:
        new = new[:new.index(tok.eos_id)]
    assert out == tok.decode(new, skip_special_tokens=True) + "\n"


def test_cli_sampling_is_seeded_and_prints_every_sample(checkpoints, capsys):
    args = ("--checkpoint", checkpoints["gpt2"], "--prompt", "To be", "--max-new-tokens", 6, "--top-p", 0.95,
            "--seed", 3, "--num-samples", 3, "--format", "jsonl")
    code, first, _ = _cli(capsys, *args)
    _, second, _ = _cli(capsys, *args)
    assert code == 0 and first == second
    rows = [json.loads(line) for line in first.splitlines()]
    assert [r["sample"] for r in rows] == [0, 1, 2] and all(isinstance(r["text"], str) for r in rows)


def test_cli_beam_search_and_seq2seq(checkpoints, capsys):
    code, out, _ = _cli(capsys, "--checkpoint", checkpoints["gpt2"], "--prompt", "KING", "--num-beams", 3,
                        "--num-samples", 2, "--max-new-tokens", 5)
    assert code == 0 and out.count("-" * 40 + "\n") == 1
    code, out, _ = _cli(capsys, "--checkpoint", checkpoints["t5"], "--prompt", "summarize: all the world",
                        "--num-beams", 2, "--max-new-tokens", 5)
    assert code == 0 and out.endswith("\n")


@pytest.mark.parametrize("args, message", [
    (("--num-beams", 2, "--top-k", 5), "beam search is deterministic"),
    (("--temperature", 0, "--top-p", 0.9), "greedy decoding"),
    (("--temperature", 0, "--num-samples", 2), "greedy decoding returns one sequence per prompt, not "
                                                "--num-samples 2; use a --temperature above 0"),
    (("--num-beams", 2, "--num-samples", 5),  # was named num_return_sequences, after the model loaded
     "--num-samples 5 exceeds --num-beams 2 (beam search returns its best beams); use --num-beams 5 or more"),
    (("--max-new-tokens", 0), "argument --max-new-tokens: must be at least 1 (got '0')"),
])
def test_cli_bad_options_are_one_line_errors(checkpoints, capsys, args, message):
    code, out, err = _cli(capsys, "--checkpoint", checkpoints["gpt2"], "--prompt", "x", *args)
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1


def test_cli_checkpoint_problems_are_one_line_errors(checkpoints, tmp_path, capsys):
    code, _, err = _cli(capsys, "--checkpoint", checkpoints["no-tokenizer"], "--prompt", "x")
    assert code == 2 and "has no tokenizer" in err and err.count("\n") == 1
    code, _, err = _cli(capsys, "--checkpoint", tmp_path / "missing", "--prompt", "x")
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
