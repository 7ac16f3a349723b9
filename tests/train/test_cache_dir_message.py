"""A cache folder that cannot be written is named by its setting (data.cache_dir or $LMLAB_CACHE_DIR),
before any tokenizer is trained: the output folder is not the problem, so "choose a --out" misled."""

from __future__ import annotations

from lmlab.cli import main
from tests.assertions import assert_one_line_error


def _recipe(tmp_path, shakespeare):
    (tmp_path / "tiny.txt").write_text(shakespeare[:20_000], encoding="utf-8")
    recipe = tmp_path / "tiny.toml"
    recipe.write_text('[model]\npreset = "gpt2-tiny"\n[objective]\nname = "clm"\n[data]\n'
                      f'train = "{tmp_path / "tiny.txt"}"\nval_fraction = 0.1\n'
                      'tokenizer = { algo = "bytelevel", vocab_size = 300 }\n'
                      "[train]\nmax_steps = 4\nbatch_size = 4\nseq_len = 32\n")
    return recipe


def test_an_unwritable_cache_dir_names_the_setting(tmp_path, shakespeare, capsys, monkeypatch):
    recipe = _recipe(tmp_path, shakespeare)
    monkeypatch.delenv("LMLAB_CACHE_DIR", raising=False)
    out = tmp_path / "run"
    argv = ["pretrain", "--config", str(recipe), "--out", str(out)]
    assert main([*argv, "--set", "data.cache_dir=/proc/x"]) == 2
    err = assert_one_line_error(capsys, "data.cache_dir /proc/x/data-", "the folder /proc is not writable",
                                "choose a data.cache_dir path you may write to")
    assert "--out" not in err and "training a" not in err  # refused before the tokenizer is trained
    monkeypatch.setenv("LMLAB_CACHE_DIR", "/proc/y")
    assert main(["pretrain", "--config", str(recipe), "--out", str(out)]) == 2
    assert_one_line_error(capsys, "$LMLAB_CACHE_DIR /proc/y/data-", "choose a $LMLAB_CACHE_DIR path")
