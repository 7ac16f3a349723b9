"""The README's Python API refuses a wrong kind of argument in one line (LmlabError), at the entry of
each function: None or a number where a path goes, a bare string where a list of strings goes
(``lmlab.fileio.path_argument``, ``text_list_argument``, ``path_list_argument``)."""

from __future__ import annotations

import pytest

from lmlab.errors import LmlabError

TEXT = ["to be or not to be, that is the question " * 20]


@pytest.fixture(scope="module")
def tok():
    from lmlab.tokenizers import train_tokenizer

    return train_tokenizer("bytelevel", TEXT, vocab_size=270)


@pytest.fixture(scope="module")
def model(tok):
    from lmlab.models import build_model, get_preset

    return build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size))


def _calls(tmp):
    from lmlab.data import TokenShards, prepare_shards
    from lmlab.finetune import finetune
    from lmlab.lab import load_grid, run_grid
    from lmlab.loading import load_model
    from lmlab.tokenizers import load_tokenizer, train_tokenizer
    from lmlab.train import pretrain

    small = tmp / "small.txt"
    small.write_text("to be or not to be\n", encoding="utf-8")
    cfg = {"model": {"preset": "gpt2-tiny"}, "objective": {"name": "clm"}, "data": {"train": [str(small)]}}
    return {
        "load_tokenizer(None)": (lambda t, m: load_tokenizer(None),
                                 "must be a path (str or os.PathLike), got NoneType"),
        "load_tokenizer(5)": (lambda t, m: load_tokenizer(5), "got int 5"),
        "tok.save(None)": (lambda t, m: t.save(None), "tokenizer.save's directory must be a path"),
        "model.save(None)": (lambda t, m: m.save(None), "model.save's directory must be a path"),
        "load_model(None)": (lambda t, m: load_model(None), "load_model's path must be a path"),
        "TokenShards(None)": (lambda t, m: TokenShards(None), "TokenShards' directory must be a path"),
        "prepare_shards(None, ...)": (lambda t, m: prepare_shards(None, [small], tmp / "o"),
                                      "tokenizer must be"),
        "prepare_shards(tok, [None], out)": (lambda t, m: prepare_shards("tok", [None], tmp / "o"),
                                             "inputs[0] must be a path"),
        "prepare_shards(tok, files, None)": (lambda t, m: prepare_shards("tok", [small], None),
                                             "out must be"),
        "prepare_shards(tok, 'small.txt', out)": (lambda t, m: prepare_shards("tok", str(small), tmp / "o"),
                                                  "pass a list: ["),
        "pretrain(cfg, None)": (lambda t, m: pretrain(cfg, None), "pretrain's out_dir must be a path"),
        "pretrain(5, out)": (lambda t, m: pretrain(5, tmp / "run"), "the config (a recipe path"),
        "pretrain(overrides=str)": (lambda t, m: pretrain(cfg, tmp / "run", overrides="train.max_steps=1"),
                                    'pass a list: ["train.max_steps=1"]'),
        "load_grid(None)": (lambda t, m: load_grid(None), "load_grid's source"),
        "load_grid(overrides=str)": (lambda t, m: load_grid({}, "budget.tokens=5"), "pass a list"),
        "run_grid(G, None)": (lambda t, m: run_grid(None, None), "run_grid's grid must be a Grid"),
        "train_tokenizer(str)": (lambda t, m: train_tokenizer("bpe", "low lower", num_merges=4),
                                 'pass a list: ["low lower"]'),
        "finetune(None, ...)": (lambda t, m: finetune(None, "sst2", small, small, tmp / "o"),
                                "finetune's checkpoint (a directory or a model) must be a path"),
        "finetune(m, task, None, ...)": (lambda t, m: finetune(m, "sst2", None, small, tmp / "o"),
                                         "finetune's train must be a path"),
        "finetune(..., out=5)": (lambda t, m: finetune(m, "sst2", small, small, 5), "finetune's out must be"),
        "train_tokenizer(5)": (lambda t, m: train_tokenizer("bpe", 5, num_merges=4), "got int 5"),
        "special_tokens=str": (lambda t, m: train_tokenizer("bpe", TEXT, num_merges=4,
                                                             special_tokens="[CLS]"),
                               'special_tokens must be a list of strings, got the string'),
    }




@pytest.mark.parametrize("name", [
    "load_tokenizer(None)", "load_tokenizer(5)", "tok.save(None)", "model.save(None)", "load_model(None)",
    "TokenShards(None)", "prepare_shards(None, ...)", "prepare_shards(tok, [None], out)",
    "prepare_shards(tok, files, None)", "prepare_shards(tok, 'small.txt', out)", "pretrain(cfg, None)",
    "pretrain(5, out)", "pretrain(overrides=str)", "load_grid(None)", "load_grid(overrides=str)",
    "run_grid(G, None)", "finetune(None, ...)", "finetune(m, task, None, ...)", "finetune(..., out=5)",
    "train_tokenizer(str)", "train_tokenizer(5)", "special_tokens=str",
])
def test_a_wrong_kind_of_argument_is_a_one_line_lmlab_error(name, tok, model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    call, words = _calls(tmp_path)[name]
    with pytest.raises(LmlabError) as e:
        call(tok, model)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists() and not (tmp_path / "o").exists()  # refused before any work


def test_the_helpers_accept_what_they_should(tmp_path):
    from lmlab.fileio import path_argument, path_list_argument, text_list_argument

    assert path_argument(tmp_path, "x") == tmp_path and str(path_argument("a/b", "x")) == "a/b"
    assert text_list_argument(("a", "b"), "x") == ["a", "b"]
    assert path_list_argument(["a", tmp_path], "x")[1] == tmp_path
    with pytest.raises(LmlabError, match=r"x must be a path, got ''"):
        path_argument("", "x")
    with pytest.raises(LmlabError, match=r"x\[1\] must be a string, got int 3"):
        text_list_argument(["a", 3], "x")
