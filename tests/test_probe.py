"""`lmlab probe`: fill-mask and contextual word similarity, on real weights and on lmlab models."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.interop import hf_import
from lmlab.loading import load_model
from lmlab.models import build_model, get_preset
from lmlab.probe import fill_mask, word_similarity
from lmlab.tokenizers import train_tokenizer

BAT = ["A bat flew out of the cave.", "He hit the ball with a bat."]


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return hf_import(minilm_dir)


@pytest.fixture(scope="module")
def tok():
    text = "the cat sat on the mat. the dog ate the bone. a bat flew out of the cave.\n" * 30
    return train_tokenizer("bytelevel", [text], vocab_size=300, special_tokens=[
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<extra_id_0>", "<extra_id_1>", "</s>"])


def test_minilm_is_contextual_the_two_bats_differ(minilm):
    res = word_similarity(minilm, "bat", BAT)
    (pair,) = res["pairs"]
    assert res["layers"] == 7 and pair["static"] == 1.0
    assert pair["cosine_by_layer"][-1] < 0.95  # the context moved the word
    same = word_similarity(minilm, "bat", [BAT[0], BAT[0]])["pairs"][0]["cosine_by_layer"]
    assert same == pytest.approx([1.0] * 7, abs=1e-5)  # same context, same vector: the measure is sound


def test_similarity_matches_transformers_hidden_states(minilm, minilm_dir):
    from transformers import AutoModel, AutoTokenizer

    hf = AutoModel.from_pretrained(minilm_dir).eval()
    hft = AutoTokenizer.from_pretrained(minilm_dir)
    vecs = []
    for text in BAT:
        enc = hft(text, return_tensors="pt", return_offsets_mapping=True)
        start = text.index("bat")
        spans = enc.pop("offset_mapping")[0].tolist()
        cover = [i for i, (a, b) in enumerate(spans) if b > a and a < start + 3 and b > start]
        with torch.no_grad():
            states = hf(**enc, output_hidden_states=True).hidden_states
        vecs.append([h[0, cover].mean(0) for h in states])
    want = [float(torch.nn.functional.cosine_similarity(a, b, dim=0)) for a, b in zip(*vecs)]
    got = word_similarity(minilm, "bat", BAT)["pairs"][0]["cosine_by_layer"]
    assert got == pytest.approx(want, abs=1e-4)


def test_two_occurrences_in_one_sentence_and_too_few(minilm):
    res = word_similarity(minilm, "record", ["I record the record."])
    assert len(res["pairs"]) == 1 and res["pairs"][0]["cosine_by_layer"][-1] < 0.99
    with pytest.raises(LmlabError, match="occurs 1 time"):
        word_similarity(minilm, "cave", BAT)


def test_encoder_fill_mask_equals_transformers_masked_lm(tok, tmp_path):
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size), heads=("mlm",))
    model.save(tmp_path / "ck", tokenizer=tok)
    assert main(["export", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")]) == 0
    text = "the cat sat on the [MASK]."
    guesses = fill_mask(load_model(tmp_path / "ck"), text, top_k=4)
    ids = tok.encode_plus("the cat sat on the[MASK].").ids  # the space joins the blank (byte-level)
    where = ids.index(tok.role_id("mask"))
    with torch.no_grad():
        logits = BertForMaskedLM.from_pretrained(tmp_path / "hf").eval()(torch.tensor([ids])).logits[0, where]
    logits[sorted(tok.special_ids)] = float("-inf")
    probs, top = torch.softmax(logits, -1).topk(4)
    assert [tok.id_of(g.token) for g in guesses] == top.tolist()
    assert [g.probability for g in guesses] == pytest.approx(probs.tolist(), abs=1e-5)


def test_decoder_and_t5_fill_mask_rank_real_tokens(tok):
    torch.manual_seed(0)
    gpt = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size))
    gpt.tokenizer = tok
    guesses = fill_mask(gpt, "the dog ate the [MASK]", top_k=3)
    with torch.no_grad():
        logits = gpt(input_ids=torch.tensor([tok.encode("the dog ate the")])).logits[0, -1]
    logits[sorted(tok.special_ids)] = float("-inf")
    assert [tok.id_of(g.token) for g in guesses] == logits.topk(3).indices.tolist()
    t5 = build_model(get_preset("t5-tiny", vocab_size=tok.vocab_size, decoder_start_token_id=0,
                                eos_token_id=7))
    t5.tokenizer = tok
    out = fill_mask(t5, "the dog ate the [MASK].", top_k=5)
    probs = [g.probability for g in out]
    assert len(out) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
    assert not {tok.id_of(g.token) for g in out} & set(tok.special_ids)


def test_asking_for_more_guesses_than_real_tokens_never_lists_a_special_one(tok):
    """``--top-k`` above the vocabulary listed the special tokens last, at probability 0 (probe.md:
    special tokens are never guessed): the guesses stop at the real tokens."""
    torch.manual_seed(0)
    gpt = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size))
    gpt.tokenizer = tok
    guesses = fill_mask(gpt, "the dog ate the [MASK]", top_k=tok.vocab_size + 10)
    assert len(guesses) == tok.vocab_size - len(set(tok.special_ids))
    assert not {tok.id_of(g.token) for g in guesses} & set(tok.special_ids)


def test_cli_tables_json_run_directories_and_one_line_errors(tok, minilm_dir, tmp_path, capsys):
    torch.manual_seed(0)
    run = tmp_path / "run" / "checkpoints" / "step_10"  # what `lmlab pretrain` leaves
    build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size), heads=("mlm",)).save(run, tokenizer=tok)
    (run / "train_state.json").write_text("{}")
    save_file({"rng.torch": torch.zeros(1)}, run / "train_state.safetensors")  # read whole, not empty
    assert main(["probe", "fill-mask", "--checkpoint", str(tmp_path / "run"), "--text", "the [MASK] sat",
                 "--top-k", "3", "--json"]) == 0
    cap = capsys.readouterr()
    assert len(json.loads(cap.out)) == 3 and "using its newest checkpoint" in cap.err
    cases = (("no blank here", "exactly one [MASK], it holds 0"), ("[MASK] [MASK]", "it holds 2"))
    for text, needle in cases:
        assert main(["probe", "fill-mask", "--checkpoint", str(run), "--text", text]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and needle in err and err.count("\n") == 1
    assert main(["import", "--hf", str(minilm_dir), "--out", str(tmp_path / "minilm")]) == 0
    capsys.readouterr()
    assert main(["probe", "similarity", "--checkpoint", str(tmp_path / "minilm"), "--word", "bat",
                 "--text", BAT[0], "--text", BAT[1]]) == 0
    out = capsys.readouterr().out
    assert "L6 " in out and "static 1.000" in out
    assert main(["probe", "fill-mask", "--checkpoint", str(tmp_path / "minilm"), "--text", "a [MASK] b"]) == 2
    assert "no MLM head" in capsys.readouterr().err
