"""Lists as written: one reader of comma-separated items (lmlab.values.comma_list), which refuses an
empty item (``1,2,,3``, ``"0, "``) instead of dropping it, and one refusal of a repeat where a
repeat means nothing (lmlab.values.NoRepeats / check_distinct): a layer copied twice, a rate swept
twice, a run counted twice, a file read twice, validation text that is training text."""

from __future__ import annotations

import pytest
from assertions import assert_one_line_error, exit_code

from lmlab import values
from lmlab.cli import build_parser
from lmlab.errors import LmlabError


def _comma_flags():
    """(command path, flag) of every flag whose value is a comma-separated list."""
    import argparse

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*path, name))
            elif getattr(action.type, "__name__", "") == "comma_ints":
                flag = action.option_strings[-1]
                yield pytest.param(path, flag, id=" ".join((*path, flag)))

    return list(walk(build_parser(), ()))


COMMA_FLAGS = _comma_flags()


def test_the_comma_flags_are_found():
    assert {(*p.values[0], p.values[1]) for p in COMMA_FLAGS} >= {("tokenizer", "decode", "--ids"),
                                                    ("compress", "distill", "--student-layers")}


@pytest.mark.parametrize("path, flag", COMMA_FLAGS)
def test_every_comma_list_flag_refuses_empty_items(capsys, path, flag):
    for text in ("1,2,,3", "0, ", ",1", " , "):
        assert exit_code([*path, f"{flag}={text}"]) == 2
        assert_one_line_error(capsys, f"argument {flag}: ", f"(got '{text}')")


def test_repeats_are_refused_where_they_mean_nothing(capsys):
    """--student-layers 0,0 built a student with a layer copied twice; --ids 7,7 is two tokens."""
    assert exit_code(["compress", "distill", "--student-layers=0,0"]) == 2
    assert_one_line_error(capsys, "argument --student-layers: lists 0 twice")
    assert values.flag(values.TokenIds, values.comma_ints)("7,7") == [7, 7]
    for kind, value in ((values.LearningRates, (1e-3, 1e-3)), (values.Seeds, [0, 1, 0]),
                        (values.Layers, [2, 2])):
        with pytest.raises(LmlabError, match="twice"):
            values.check(kind, value, "x")


def test_lr_sweep_with_a_repeated_rate_is_refused_naming_the_flag(tmp_path, capsys):
    argv = ["finetune", "--checkpoint", str(tmp_path / "ck"), "--task", "sst2", "--train", "t.tsv",
            "--dev", "d.tsv", "--out", str(tmp_path / "o"), "--lr", "auto", "--lr-sweep", "1e-3", "1e-3"]
    assert exit_code(argv) == 2
    assert_one_line_error(capsys, "--lr-sweep lists 0.001 twice")


def test_the_same_run_or_file_given_twice_is_refused(tmp_path, capsys):
    from lmlab.scaling import read_runs

    run = tmp_path / "run1"
    run.mkdir()
    assert exit_code(["scale", "fit", str(run), str(run), str(run)]) == 2
    assert_one_line_error(capsys, "is given twice in RUN_DIR")
    with pytest.raises(LmlabError, match="given twice"):
        read_runs([run, tmp_path / "." / "run1"])         # one run, two spellings: refused before reading
    text = tmp_path / "a.txt"
    text.write_text("some text\n")
    assert exit_code(["tokenizer", "train", "--algo", "bpe", "--vocab-size", "40", "--input", str(text),
                      str(tmp_path / "." / "a.txt"), "--out", str(tmp_path / "tok")]) == 2
    assert_one_line_error(capsys, "is given twice in --input")
    assert not (tmp_path / "tok").exists()


def test_harness_tasks_option_lists_and_set_lists_are_read_by_the_one_reader():
    from lmlab.adapt import resolve_options
    from lmlab.config.fields import coerce
    from lmlab.icl.harness import split_tasks

    assert split_tasks(["a, b", "c"]) == ["a", "b", "c"]
    for bad, words in (("a,,b", "empty item"), ("a,b,a", "given twice")):
        with pytest.raises(LmlabError, match=words):
            split_tasks(bad)
    with pytest.raises(LmlabError, match="empty item"):
        resolve_options("lora", {"target_modules": "q_proj,,v_proj"})
    assert coerce("1, 2", values.Seeds, "grid.seeds", text=True) == [1, 2]
    for bad in ("1,,2", "1,"):
        with pytest.raises(LmlabError, match="grid.seeds has an empty item"):
            coerce(bad, values.Seeds, "grid.seeds", text=True)


def test_validation_text_may_not_be_training_text(tmp_path, capsys):
    """data.val = the data.train file trained a tokenizer, then scored the model on its own training
    text; data.train naming a file twice tokenised it twice. Both refused before any work."""
    text = tmp_path / "t.txt"
    text.write_text("To be or not to be.\n\nThat is the question.\n" * 20)
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\npreset = "gpt2-tiny"\n[objective]\nname = "clm"\n'
                      f'[data]\ntrain = ["{text}"]\nval_fraction = 0.1\n'
                      'tokenizer = { algo = "bytelevel", vocab_size = 280 }\n'
                      "[train]\nmax_steps = 1\nbatch_size = 2\nseq_len = 8\n")
    for setting, words in ((f"data.val=['{text}']", "is also in data.train"),
                           (f"data.train=['{text}', '{tmp_path}/./t.txt']", "given twice in data.train")):
        assert exit_code(["pretrain", "--config", str(recipe), "--out", str(tmp_path / "run"),
                          "--set", setting]) == 2
        assert_one_line_error(capsys, words)
        assert not (tmp_path / "run").exists()
