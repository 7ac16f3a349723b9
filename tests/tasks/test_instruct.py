"""Instruction tuning (lmlab.tasks.instruct): records, template, response-only loss, packing identities."""

from __future__ import annotations

import json

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.tasks import collate, load_task, make_task
from lmlab.tasks.instruct import DEFAULT_TEMPLATE, IGNORE, pack, read_instructions, render_prompt
from lmlab.tokenizers import train_tokenizer

RECORDS = [
    {"instruction": "Reverse the words.", "input": "red green blue", "output": "blue green red"},
    {"instruction": "Say hello.", "output": "hello there"},
    {"instruction": "Copy the input.", "input": "the king", "output": "the king"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                  {"role": "user", "content": "and again"}, {"role": "assistant", "content": "hello again"}]},
]


@pytest.fixture(scope="module")
def tok(shakespeare):
    return train_tokenizer("bytelevel", [shakespeare[:20000], json.dumps(RECORDS), DEFAULT_TEMPLATE],
                           vocab_size=320)


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def tiny_gpt(tok, preset="gpt2-tiny", **kw):
    torch.manual_seed(0)
    model = build_model(get_preset(preset, vocab_size=tok.vocab_size, dropout=0.0, **kw), heads=("lm",))
    model.tokenizer = tok
    return model.eval()


def test_template_drops_the_empty_input_paragraph():
    assert render_prompt(DEFAULT_TEMPLATE, "Do it.", "x") == \
        "### Instruction:\nDo it.\n\n### Input:\nx\n\n### Response:\n"
    assert render_prompt(DEFAULT_TEMPLATE, "Do it.") == "### Instruction:\nDo it.\n\n### Response:\n"


def test_reader_renders_records_and_chat_and_names_bad_lines(tmp_path):
    ex = read_instructions(write(tmp_path / "a.jsonl", RECORDS), DEFAULT_TEMPLATE)
    assert [e.label for e in ex] == ["blue green red", "hello there", "the king", "hello again"]
    assert ex[3].text == "### User:\nhi\n\n### Assistant:\nhello### User:\nand again\n\n### Assistant:\n"
    assert [r for _, r in ex[3].extra["segments"]] == [False, False, False, True, False, False, False, True]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps({"instruction": "x"}) + "\n")
    with pytest.raises(LmlabError, match=r"bad.jsonl line 2: needs a non-empty string 'output'"):
        read_instructions(bad, DEFAULT_TEMPLATE)
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(LmlabError, match=r"line 1: the last message must be a non-empty assistant turn"):
        read_instructions(bad, DEFAULT_TEMPLATE)
    with pytest.raises(LmlabError, match="no {instruction} placeholder"):
        make_task("instruct", "decoder", template="Q: {input}\nA:")
    with pytest.raises(LmlabError, match="packing is for decoders"):
        make_task("instruct", "seq2seq", packing=True)


def test_loss_only_on_response_tokens_and_eos(tok, tmp_path):
    task = make_task("instruct", "decoder", packing=False)
    task.prepare_model(tiny_gpt(tok))
    ex = task.read(write(tmp_path / "a.jsonl", RECORDS[:1]))
    (f,) = task.features(ex, tok)
    want = tok.encode("blue green red") + [task.end]
    assert [x for x in f["labels"] if x != IGNORE] == want
    assert f["input_ids"][-len(want):] == want            # response + EOS at the end, prompt before
    assert tok.decode(f["input_ids"][:-len(want)], skip_special_tokens=True).endswith("### Response:\n")


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])   # learned positions; rotary
def test_packed_loss_and_logits_equal_unpacked(tok, tmp_path, preset):
    """Identity: packing changes only the layout (same logits per example, same token-weighted loss)."""
    model = tiny_gpt(tok, preset)
    path = write(tmp_path / "a.jsonl", RECORDS)
    plain, packed = make_task("instruct", "decoder", packing=False), make_task("instruct", "decoder")
    for t in (plain, packed):
        t.prepare_model(model)
    ex = plain.read(path)
    single = plain.features(ex, tok)
    rows = packed.features(ex, tok)
    assert len(rows) == 1 and rows[0]["doc_ids"][-1] == len(ex) - 1
    with torch.no_grad():
        lp = packed.loss(model, collate(rows, 0))
        b = collate(single, 0)
        lu = plain.loss(model, b)
        n = [(torch.tensor(f["labels"][1:]) != IGNORE).sum() for f in single]
        per = [plain.loss(model, collate([f], 0)) for f in single]
        mean = sum(p * k for p, k in zip(per, n)) / sum(n)
        assert lp == pytest.approx(float(lu), abs=1e-5) and lp == pytest.approx(float(mean), abs=1e-5)
        unlabelled = lambda batch: {k: v for k, v in batch.items() if k != "labels"}  # noqa: E731
        logits = model(**unlabelled(packed.model_inputs(model, collate(rows, 0)))).logits[0]
        start = 0
        for f in single:
            alone = model(input_ids=torch.tensor([f["input_ids"]])).logits[0]
            here = logits[start:start + len(f["input_ids"])]
            torch.testing.assert_close(here, alone, atol=1e-4, rtol=1e-4)
            start += len(f["input_ids"])
        # without doc_ids/positions the second example would see the first: the identity is not trivial
        rows[0].pop("doc_ids"), rows[0].pop("position_ids")
        leaky = model(**unlabelled(packed.model_inputs(model, collate(rows, 0)))).logits[0]
        n0 = len(single[0]["input_ids"])
        assert not torch.allclose(leaky[n0:n0 + 3], logits[n0:n0 + 3], atol=1e-3)


def test_pack_respects_the_row_budget():
    feats = [{"input_ids": [1] * n, "attention_mask": [1] * n, "labels": [5] * n} for n in (3, 4, 5, 2)]
    rows = pack(feats, 8)
    assert [len(r["input_ids"]) for r in rows] == [7, 7]
    assert rows[0]["doc_ids"] == [0] * 3 + [1] * 4 and rows[0]["position_ids"] == [0, 1, 2, 0, 1, 2, 3]
    assert rows[0]["labels"][0] == IGNORE and rows[0]["labels"][3] == IGNORE


def test_seq2seq_prompt_to_encoder_response_to_decoder(tok, tmp_path):
    task = make_task("instruct", "seq2seq")
    torch.manual_seed(0)
    cfg = get_preset("t5-tiny", vocab_size=tok.vocab_size)
    model = build_model(cfg, heads=("lm",), architecture="seq2seq")
    model.tokenizer = tok
    task.prepare_model(model)
    ex = task.read(write(tmp_path / "a.jsonl", RECORDS[:2]))
    f = task.features(ex, tok)
    assert f[0]["labels"] == tok.encode("blue green red") + [task.end]
    assert f[1]["input_ids"] == tok.encode(ex[1].text) + [task.end] and "labels" in f[1]
    with torch.no_grad():
        assert float(task.loss(model, collate(f, 0))) > 0
    preds, metrics = task.predict_and_score(model, ex)
    assert len(preds) == 2 and all(isinstance(p, str) for p in preds)
    assert set(metrics) == {"response_logprob", "loss", "exact_match", "rouge1", "rouge2", "rougeL",
                            "rougeLsum"}
    assert metrics["loss"] == pytest.approx(-metrics["response_logprob"]) and metrics["loss"] > 0
    again = load_task(json.loads(json.dumps(task.state())))
    assert again.architecture == "seq2seq" and again.template == DEFAULT_TEMPLATE and not again.packing


def test_truncation_cuts_the_prompt_from_the_left_and_keeps_the_response(tok, tmp_path):
    task = make_task("instruct", "decoder", packing=False, max_length=24)
    task.prepare_model(tiny_gpt(tok))
    long = {"instruction": "Copy the input.", "input": "the king " * 40, "output": "blue green red"}
    (f,) = task.features(task.read(write(tmp_path / "a.jsonl", [long])), tok)
    response = tok.encode("blue green red") + [task.end]
    assert len(f["input_ids"]) == 24 and f["input_ids"][-len(response):] == response
    assert [x for x in f["labels"] if x != IGNORE] == response
