"""``[data]`` is checked whole before a run does any work (lmlab.train.data.check_data): a recipe
without validation data, or whose data.val mixes shards with text, is one line and leaves no run
folder; it used to train the tokenizer (and tokenise the text) first and leave them behind."""

from __future__ import annotations

import copy

import pytest

from lmlab.errors import LmlabError
from lmlab.train import pretrain


def _text_recipe(tiny_config, tiny_data, **data):
    cfg = tiny_config(max_steps=1)
    cfg["data"] = {"train": [str(tiny_data["root"] / "val.txt")],
                   "tokenizer": {"algo": "bytelevel", "vocab_size": 300}, **data}
    return cfg


@pytest.mark.parametrize(("data", "words"), [
    ({"val_fraction": 0.0}, "^no validation data: data.val is empty and data.val_fraction is 0; "),
    ({"val": ["VAL_SHARDS", "VAL_TEXT"]}, "^data.val mixes token shards with other inputs"),
    ({"val_fraction": 0.1, "tokenizer": {"algo": "bpe-typo", "vocab_size": 300}},
     "^data.tokenizer: unknown tokenizer algorithm 'bpe-typo'"),
])
def test_a_refused_data_table_leaves_no_run_folder(tiny_config, tiny_data, tmp_path, data, words):
    data = copy.deepcopy(data)
    if "val" in data:
        data["val"] = [str(tiny_data["val"]), str(tiny_data["root"] / "train.txt")]
    said: list[str] = []
    with pytest.raises(LmlabError, match=words):
        pretrain(_text_recipe(tiny_config, tiny_data, **data), tmp_path / "run", log=said.append)
    assert not (tmp_path / "run").exists()
    assert not any("training a" in line or "tokenising" in line for line in said), said


def test_val_shards_of_another_tokenizer_are_refused_before_the_train_text_is_tokenised(
        tiny_config, tiny_data, tmp_path):
    from lmlab.tokenizers import train_tokenizer

    other = train_tokenizer("bytelevel", ["to be or not to be, that is the question\n"] * 5, vocab_size=270)
    other.save(tmp_path / "other")
    cfg = _text_recipe(tiny_config, tiny_data, tokenizer=str(tmp_path / "other"), val=[str(tiny_data["val"])])
    with pytest.raises(LmlabError, match=r"^tokenizer .*other and val shards .* were made with different "
                                         "tokenizers"):
        pretrain(cfg, tmp_path / "run", log=lambda m: None)
    assert not (tmp_path / "run").exists()


def test_a_grid_without_validation_data_is_refused_as_it_is_planned(tiny_data):
    from lmlab.lab import load_grid

    grid = {"name": "t", "seeds": [0], "budget": {"tokens": 40_960},
            "pretrain": {"data": {"train": [str(tiny_data["root"] / "val.txt")],
                                  "tokenizer": {"algo": "bytelevel", "vocab_size": 300}},
                         "train": {"batch_size": 8, "seq_len": 32}, "model": {"max_positions": 64}},
            "arms": [{"name": "gpt", "preset": "gpt2-tiny", "objective": "clm"}]}
    with pytest.raises(LmlabError, match="no validation data: pretrain.data.val is empty"):
        load_grid(grid)


@pytest.mark.parametrize(("train", "words"), [
    ({"batch_size": 500}, "a global batch of 500 windows of 32 tokens (train.batch_size 500 x "
                          "train.grad_accum 1) is more than the 100 windows of 32 tokens of the training "
                          "data"),
    ({"batch_size": 4, "grad_accum": 26}, "a global batch of 104 windows of 32 tokens (train.batch_size 4 "
                                          "x train.grad_accum 26) is more than the 100 windows"),
])
def test_a_global_batch_larger_than_the_training_windows_is_refused_before_the_model_is_built(
        tiny_config, tmp_path, train, words):
    """Every step would read the same windows more than once (and report a batch it never had):
    refused once the data is known (lmlab.config.fits.check_global_batch), before the model is built."""
    cfg = tiny_config(max_steps=1, **train)
    cfg["data"]["max_tokens"] = 3200  # 100 windows of 32 tokens
    said: list[str] = []
    with pytest.raises(LmlabError) as e:
        pretrain(cfg, tmp_path / "run", log=said.append)
    assert str(e.value).startswith(words), e.value
    assert "lower train.batch_size or train.grad_accum so that" in str(e.value)
    assert "at most 100, or add training data" in str(e.value)
    assert not any(line.startswith("model:") for line in said), said
    ok = tiny_config(max_steps=1, batch_size=100, eval_batches=1)
    ok["data"]["max_tokens"] = 3200
    pretrain(ok, tmp_path / "ok", log=said.append)  # a batch of all 100 windows: fine


@pytest.mark.parametrize("value", [None, ""])
def test_lmlab_data_unset_or_empty_is_the_default(monkeypatch, value):
    """``LMLAB_DATA=`` (set but empty) is the documented default, as an unset one is (it expanded
    to "", so ``$LMLAB_DATA/pretrain`` became ``/pretrain``)."""
    from lmlab.train.data import DEFAULT_DATA, expand

    if value is None:
        monkeypatch.delenv("LMLAB_DATA", raising=False)
    else:
        monkeypatch.setenv("LMLAB_DATA", value)
    assert expand("$LMLAB_DATA/pretrain") == f"{DEFAULT_DATA}/pretrain"


def _jsonl(root):
    import json

    path = root / "docs.jsonl"
    if not path.exists():
        lines = (root / "train.txt").read_text(encoding="utf-8").split("\n\n")[:200]
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(("data", "words"), [
    # how text is read, with only records to read
    ({"train": "JSONL", "doc_separator": "line"},
     r'^data.doc_separator = "line" has no effect here: .* hold no text files to read \(it cuts a text file'),
    ({"train": "JSONL", "encoding": "latin-1"}, r'^data.encoding = "latin-1" has no effect here'),
    # a record's field, with only text
    ({"text_field": "body"}, r'^data.text_field = "body" has no effect here: .* hold no records files'),
    # what tokenising reads, with shards only
    ({"train": "SHARDS", "val": "VAL_SHARDS", "append_eos": True, "tokenizer": ""},
     r"^data.append_eos = true has no effect here"),
    ({"train": "SHARDS", "val": "VAL_SHARDS"},
     r"^data.tokenizer has no effect with token shards in data.train"),
    ({"train": "SHARDS", "tokenizer": "", "val_fraction": 0.1},
     r"^data.val_fraction has no effect with token shards in data.train"),
    ({"val": "VAL_SHARDS", "val_fraction": 0.1},
     r"^data.val_fraction 0.1 has no effect with data.val given .*; "
     r"drop data.val_fraction, or empty data.val$"),
])
def test_a_data_setting_the_run_would_ignore_is_refused(tiny_config, tiny_data, tmp_path, data, words):
    """``[data]`` settings that only some inputs read (``doc_separator`` and ``encoding`` for text
    files, ``text_field`` for records, what tokenising reads for shards, ``val_fraction`` beside
    ``data.val``) were accepted and ignored in recipes and from Python; ``lmlab data prepare``
    refuses its flags of the same meaning."""
    root = tiny_data["root"]
    named = {"JSONL": str(_jsonl(root)), "SHARDS": str(tiny_data["train"]),
             "VAL_SHARDS": str(tiny_data["val"])}
    data = {k: [named[v]] if v in named else v for k, v in data.items()}
    data.setdefault("val_fraction", 0.0 if "val" in data else 0.1)
    said: list[str] = []
    with pytest.raises(LmlabError, match=words):
        pretrain(_text_recipe(tiny_config, tiny_data, **data), tmp_path / "run", log=said.append)
    assert not (tmp_path / "run").exists()
    assert not any("training a" in line or "tokenising" in line for line in said), said


def test_data_settings_at_their_defaults_are_never_refused(tiny_config, tiny_data):
    """A saved run's config lists every ``[data]`` key (its defaults too): reading it back, as
    ``--resume`` does, refuses none of them."""
    from lmlab.config import load_config
    from lmlab.train.data import check_data

    cfg = load_config(tiny_config())  # token shards: no text, no records
    again = load_config(cfg.to_dict())
    assert "doc_separator" in cfg.to_dict()["data"]
    check_data(again.data)
