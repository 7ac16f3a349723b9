"""How examples become model inputs: segment ids, SQuAD windows and offsets, NER first sub-token
labels, GPT-style decoder inputs, text-to-text sources; and head swapping keeps the body."""

from __future__ import annotations

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.tasks import attach_head, make_task
from lmlab.tasks.qa import char_span_to_tokens, oracle_predictions
from lmlab.tasks.readers import Example
from lmlab.tokenizers import load_tokenizer


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return load_tokenizer(minilm_dir)


def test_pair_features_have_segment_ids_and_truncate(tok):
    task = make_task("mrpc", max_length=12)
    task.labels = ["0", "1"]
    ex = [Example("the cat sat on the mat today", "a dog", "1")]
    f = task.features(ex, tok)[0]
    toks = tok.convert_ids_to_tokens(f["input_ids"])
    assert len(toks) == 12 and toks[0] == "[CLS]" and toks.count("[SEP]") == 2
    second = toks.index("[SEP]") + 1
    assert f["token_type_ids"] == [0] * second + [1] * (12 - second)
    assert toks[second:] == ["a", "dog", "[SEP]"] and f["labels"] == 1


def test_char_span_to_tokens():
    offsets = [(0, 5), (6, 9), (9, 10), (11, 16)]
    assert char_span_to_tokens(offsets, 6, 10) == (1, 2)
    assert char_span_to_tokens(offsets, 7, 8) == (1, 1)      # inside one token
    assert char_span_to_tokens(offsets, 20, 25) is None


def test_squad_windows_and_offsets_recover_the_answers(tok, data_dir):
    """Short windows force long contexts to split; the gold token labels of the windows, mapped
    back through the offsets, must reproduce the reference answers (EM near 1)."""
    task = make_task("squad", max_length=96, doc_stride=32)
    examples = task.read(data_dir / "squad" / "squad_v1.1_dev_partA.json")[:300]
    feats = task.features(examples, tok)
    assert len(feats) > 1.5 * len(examples)            # contexts were split
    assert all(len(f["input_ids"]) <= 96 for f in feats)
    per_example = {}
    for f in feats:
        per_example.setdefault(f["example_index"], []).append(f)
    for fs in per_example.values():                    # every answer lies whole in some window
        assert any(f["start_positions"] > 0 for f in fs)
        for f in fs:
            if f["start_positions"]:
                assert f["offsets"][f["start_positions"]] is not None
                assert f["token_type_ids"][f["start_positions"]] == 1
    oracle = oracle_predictions(task, examples, tok)
    scores = task.score(oracle, examples)
    assert scores["exact_match"] > 0.95
    for pred, ex in zip(oracle, examples):   # misses: answers ending inside a token ("gold" in "golden")
        if pred not in ex.extra["answers"]:
            assert ex.extra["answers"][0] in pred and len(pred) <= len(ex.extra["answers"][0]) + 5


def test_squad_best_span_respects_limits():
    task = make_task("squad", max_answer_length=2)
    offsets = [None, None, (0, 3), (4, 7), (8, 12), None]
    start = [9.0, 0, 1.0, 0.5, 0.0, 9]
    end = [9.0, 0, 0.0, 0.2, 3.0, 9]
    # (2, 4) scores best but is 3 tokens long; [CLS]/question/[SEP] positions are never answers
    assert task.best_span(start, end, offsets)[1:] == (3, 4)


def test_ner_labels_first_subtoken_only(tok, data_dir):
    task = make_task("conll")
    examples = task.read(data_dir / "conll2003" / "valid.txt")[:200]
    task.fit(examples)
    assert task.labels[0] == "O" and "B-PER" in task.labels and "I-MISC" in task.labels
    feats = task.features(examples, tok)
    for ex, f in zip(examples, feats):
        labelled = [i for i, y in enumerate(f["labels"]) if y != -100]
        assert labelled == [p for p in f["word_starts"] if p is not None]
        assert [task.labels[f["labels"][p]] for p in labelled] == ex.label[:len(labelled)]
    multi = next(f for f in feats if len(f["input_ids"]) - 2 > len(f["word_starts"]))   # some word split
    assert any(y == -100 for y in multi["labels"][1:-1])
    # predicting the gold tags back through word_starts gives F1 = 1
    assert task.score([e.label for e in examples], examples)["f1"] == 1.0


def test_decoder_gpt_inputs(tok):
    task = make_task("rte", "decoder", max_length=10)
    task.labels = ["entailment", "not_entailment"]
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size), heads=())
    model.tokenizer = tok_copy(tok)
    model = task.prepare_model(model)
    t = model.tokenizer
    assert model.config.vocab_size == t.vocab_size == tok.vocab_size + 3
    assert model.head_names == ("cls", "lm")
    f = task.features([Example("one two three four five six", "seven", "entailment")], t)[0]
    toks = t.convert_ids_to_tokens(f["input_ids"])
    assert toks[0] == "[START]" and toks[-1] == "[EXTRACT]" and "[DELIM]" in toks and len(toks) == 10
    assert toks[toks.index("[DELIM]") + 1] == "seven" and f["labels"] == 0
    last = make_task("sst2", "decoder", decoder_style="last")
    last.labels = ["0", "1"]
    f = last.features([Example("good film", None, "1")], tok)[0]
    assert tok.convert_ids_to_tokens(f["input_ids"]) == ["good", "film"]
    assert make_task("sst2", "decoder", decoder_style="last", lm_weight=0.5).heads == ("cls",)


def tok_copy(tok):
    """A fresh copy of the tokenizer (prepare_model adds tokens to the model's own tokenizer)."""
    from lmlab.tokenizers.wordpiece import WordPieceTokenizer

    data = tok.to_hf_json()
    return WordPieceTokenizer._from_hf(data, tok.tokenizer_config())


def test_text2text_sources_and_targets(tok):
    task = make_task("rte", "seq2seq")
    ex = Example("A man sleeps.", "Someone rests.", "entailment")
    from lmlab.tasks.text2text import source_text

    assert source_text("rte", ex) == "rte sentence1: A man sleeps. sentence2: Someone rests."
    assert source_text("sst2", Example("nice", None, "1")) == "sst2 sentence: nice"
    assert task.target_text(ex) == "entailment"
    assert make_task("sst2", "seq2seq").target_text(Example("x", None, "1")) == "positive"
    assert make_task("stsb", "seq2seq").target_text(Example("a", "b", 3.27)) == "3.2"
    task.end = tok.sep_id
    f = task.features([ex], tok)[0]
    assert f["labels"][-1] == tok.sep_id
    assert tok.decode(f["labels"][:-1]) == "entailment"


def test_attach_head_keeps_the_body_and_grows_vocab(tok):
    torch.manual_seed(0)
    base = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size)).eval()   # MLM head
    ids = torch.randint(5, 1000, (2, 7))
    h0 = base.encode(ids)[0]
    cls = attach_head(base, ("seq_cls",), 3)
    assert cls.head_names == ("seq_cls",) and cls.config.num_labels == 3 and "mlm" not in cls.heads
    assert torch.equal(cls.encode(ids)[0], h0)
    assert cls(ids).logits.shape == (2, 3)
    gpt = build_model(get_preset("gpt2-tiny", vocab_size=100))
    grown = attach_head(gpt, ("cls", "lm"), 2, vocab_size=103)
    assert torch.equal(grown.tok_embed.weight[:100], gpt.tok_embed.weight)
    assert grown.heads["lm"].proj.weight is grown.tok_embed.weight                   # still tied
    with pytest.raises(LmlabError, match="needs an encoder model|needs a decoder"):
        make_task("conll").prepare_model(gpt)
