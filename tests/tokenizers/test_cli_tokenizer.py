"""`lmlab tokenizer train | encode | inspect` end to end, for every algorithm, and its bad-input contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.tokenizers import ALGORITHMS, load_tokenizer

VOCAB = 400  # above 256 bytes + 7 specials, so every algorithm can reach it on 50 KB of text
SAMPLE = "Thou art more lovely and more temperate."


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err[len("error: "):].lower()


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory, shakespeare) -> Path:
    p = tmp_path_factory.mktemp("corpus") / "shakespeare-50k.txt"
    p.write_text(shakespeare[:50_000], encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_file):
    """Train each algorithm once through the CLI; ``trained(algo)`` -> its directory."""
    cache: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("toks")

    def get(algo: str) -> Path:
        if algo not in cache:
            out = root / algo
            code = main(["tokenizer", "train", "--algo", algo, "--vocab-size", str(VOCAB),
                         "--input", str(corpus_file), "--out", str(out)])
            assert code == 0, f"training {algo} failed"
            cache[algo] = out
        return cache[algo]

    return get


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_train_encode_inspect(algo, trained, capsys, tmp_path):
    out = trained(algo)
    assert f"trained {algo} tokenizer" in capsys.readouterr().out  # trained just now, by this test
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    tok = load_tokenizer(out)
    assert tok.algo == algo and tok.vocab_size <= VOCAB
    assert tok.vocab_size >= VOCAB * 0.9  # 50 KB of text is enough to fill the vocabulary

    # encode --text --format json agrees with the Python API, offsets point into the text
    code, stdout, err = run(capsys, "tokenizer", "encode", "--tokenizer", out, "--text", SAMPLE,
                            "--format", "json")
    assert code == 0, err
    row = json.loads(stdout)
    assert row["ids"] == tok.encode(SAMPLE) and len(row["ids"]) < len(SAMPLE)
    assert row["tokens"] == tok.convert_ids_to_tokens(row["ids"])
    assert all(0 <= s <= e <= len(SAMPLE) for s, e in row["offsets"])
    decoded = tok.decode(row["ids"])
    if algo == "bytelevel":
        assert decoded == SAMPLE
    else:  # normalising algorithms give the same words back
        assert decoded.split() == SAMPLE.split() or decoded.replace(" ", "") == SAMPLE.replace(" ", "")

    # the saved tokenizer.json is the Hugging Face format: the reference library gives the same ids
    hf = pytest.importorskip("tokenizers").Tokenizer.from_file(str(out / "tokenizer.json"))
    assert hf.encode(SAMPLE, add_special_tokens=False).ids == row["ids"]

    # encode --input: one line of ids per input line; pretty format; --add-special-tokens
    lines = tmp_path / "lines.txt"
    lines.write_text("To be, or not to be\nthat is the question\n")
    code, stdout, err = run(capsys, "tokenizer", "encode", "--tokenizer", out, "--input", lines)
    assert code == 0, err
    assert [list(map(int, r.split())) for r in stdout.splitlines()] == [
        tok.encode("To be, or not to be"), tok.encode("that is the question")]
    code, stdout, _ = run(capsys, "tokenizer", "encode", "--tokenizer", out, "--text", "to be",
                          "--add-special-tokens", "--format", "ids")
    assert list(map(int, stdout.split())) == tok.encode("to be", add_special_tokens=True)
    assert len(stdout.split()) == len(tok.encode("to be")) + 2  # [CLS] ... [SEP]

    # inspect summarises it
    code, stdout, err = run(capsys, "tokenizer", "inspect", out)
    assert code == 0, err
    assert f"algorithm:      {algo}" in stdout and f"{tok.vocab_size} tokens" in stdout and "[MASK]" in stdout


def test_bpe_num_merges_reproduces_the_lecture_example(tmp_path, capsys):
    """SPEC golden case through the CLI: 8 merges on the lecture corpus, `newer` -> `newer_`."""
    toy = tmp_path / "toy.txt"
    toy.write_text("low low low low lowest lowest newer newer newer newer newer newer "
                   "wider wider wider new new\n")
    code, _, err = run(capsys, "tokenizer", "train", "--algo", "bpe", "--num-merges", 8, "--special-tokens",
                       "--input", toy, "--out", tmp_path / "bpe")
    assert code == 0, err
    code, stdout, _ = run(capsys, "tokenizer", "encode", "--tokenizer", tmp_path / "bpe",
                          "--text", "newer lower", "--format", "tokens")
    assert stdout.split() == ["newer_", "low", "er_"]


def test_wordpiece_score_option(tmp_path, capsys, corpus_file, trained):
    """--score ratio gives the textbook learner's vocabulary; the default is the likelihood gain."""
    from lmlab.tokenizers import train_tokenizer

    code, _, err = run(capsys, "tokenizer", "train", "--algo", "wordpiece", "--vocab-size", VOCAB, "--score",
                       "ratio", "--input", corpus_file, "--out", tmp_path / "ratio")
    assert code == 0, err
    text = corpus_file.read_text(encoding="utf-8").splitlines()
    ratio = train_tokenizer("wordpiece", text, vocab_size=VOCAB, score="ratio")
    gain = train_tokenizer("wordpiece", text, vocab_size=VOCAB)
    assert load_tokenizer(tmp_path / "ratio").vocab == ratio.vocab != gain.vocab
    assert load_tokenizer(trained("wordpiece")).vocab == gain.vocab
    err = one_line_error(*run(capsys, "tokenizer", "train", "--algo", "bpe", "--vocab-size", VOCAB, "--score",
                              "gain", "--input", corpus_file, "--out", tmp_path / "bpe")[::2])
    assert "--score applies only with --algo wordpiece" in err and not (tmp_path / "bpe").exists()


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_train_bad_inputs(algo, tmp_path, capsys, corpus_file):
    out = tmp_path / "tok"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"plain line\n" * 3 + b"na\xefve caf\xe9\n")
    train = ["tokenizer", "train", "--algo", algo, "--out", out]

    missing = tmp_path / "missing.txt"
    err = one_line_error(*run(capsys, *train, "--vocab-size", VOCAB, "--input", missing)[::2])
    assert "missing.txt does not exist" in err
    err = one_line_error(*run(capsys, *train, "--vocab-size", VOCAB, "--input", empty)[::2])
    assert "empty.txt is empty" in err
    err = one_line_error(*run(capsys, *train, "--vocab-size", VOCAB, "--input", latin)[::2])
    assert "latin.txt line 4" in err and "--encoding" in err
    # too small for the alphabet (bytes or characters) plus the 7 special tokens
    err = one_line_error(*run(capsys, *train, "--vocab-size", 10, "--input", corpus_file)[::2])
    assert "vocab" in err and "10" in err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "latin.txt"]  # no temp leftovers

    # the fix the message suggests works
    code, _, err = run(capsys, *train, "--vocab-size", 300, "--input", latin, "--encoding", "latin-1")
    assert code == 0, err
    assert "caf\u00e9" in load_tokenizer(out).decode(load_tokenizer(out).encode("caf\u00e9")).lower()


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_a_whitespace_corpus_is_refused_as_data_prepare_refuses_it(algo, tmp_path, capsys, corpus_file):
    """Trained a tokenizer of the specials and bytes alone (rc 0) where `data prepare` refused the file."""
    blank = tmp_path / "ws.txt"
    blank.write_text("   \n\t\n    \n")
    err = one_line_error(*run(capsys, "tokenizer", "train", "--algo", algo, "--vocab-size", VOCAB, "--input",
                              corpus_file, blank, "--out", tmp_path / "tok")[::2])
    assert err == f"input file {blank} holds only whitespace; pass files that contain text\n".lower()
    assert not (tmp_path / "tok").exists()


def test_a_vocabulary_far_below_the_request_is_a_warning(tmp_path, capsys, corpus_file):
    """bpe on a one-character corpus gave 10 tokens for --vocab-size 300, silently."""
    one = tmp_path / "one.txt"
    one.write_text("a\n")
    code, out, err = run(capsys, "tokenizer", "train", "--algo", "bpe", "--vocab-size", 300, "--input", one,
                         "--out", tmp_path / "tok")
    assert code == 0 and "10 tokens" in out
    assert err == ("warning: the bpe tokenizer learned 10 tokens, far fewer than the 300 asked for: its "
                   "training text holds no more to learn (pass more, or varied, text for that vocabulary "
                   "size)\n")
    code, _, err = run(capsys, "tokenizer", "train", "--algo", "bpe", "--vocab-size", VOCAB, "--input",
                       corpus_file, "--out", tmp_path / "tok2")
    assert code == 0 and err == ""  # a vocabulary of the size asked for: nothing to say


def test_unknown_algorithm_names_the_choices(tmp_path, capsys, corpus_file):
    with pytest.raises(SystemExit) as e:  # argparse: usage line + one error line, exit 2
        main(["tokenizer", "train", "--algo", "sentencepiece", "--vocab-size", "100",
              "--input", str(corpus_file), "--out", str(tmp_path / "t")])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "invalid choice: 'sentencepiece'" in last and all(a in last for a in ALGORITHMS)
    assert not (tmp_path / "t").exists()
    with pytest.raises(LmlabError, match="unknown tokenizer algorithm 'sentencepiece'; choose one of: bpe"):
        load_tokenizer_class("sentencepiece")


def load_tokenizer_class(name):
    from lmlab.tokenizers import tokenizer_class

    return tokenizer_class(name)


def test_missing_or_corrupt_tokenizer_directory(tmp_path, capsys, trained):
    good = trained("bytelevel")
    missing = tmp_path / "nowhere"
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    data = (good / "tokenizer.json").read_bytes()
    (truncated / "tokenizer.json").write_bytes(data[: len(data) // 2])
    (truncated / "tokenizer_config.json").write_bytes((good / "tokenizer_config.json").read_bytes())
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    cases = [(missing, "does not exist"), (truncated, "corrupt"), (empty_dir, "neither tokenizer.json")]
    for path, needle in cases:
        for argv in (["tokenizer", "encode", "--tokenizer", path, "--text", "hi"],
                     ["tokenizer", "inspect", path]):
            err = one_line_error(*run(capsys, *argv)[::2])
            assert needle in err and path.name in err, err


def test_decode_rejects_out_of_range_ids(trained):
    tok = load_tokenizer(trained("bytelevel"))
    for bad in ([tok.vocab_size], [-1], [5, 10**9]):
        with pytest.raises(LmlabError) as e:
            tok.decode(bad)
        msg = str(e.value)
        assert "out of range" in msg and str(tok.vocab_size - 1) in msg and "\n" not in msg
