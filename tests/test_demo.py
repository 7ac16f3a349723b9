"""`lmlab demo` runs end to end: tokenizer, a short pretraining that lowers the loss, a sample."""

from lmlab.cli import main


def test_demo_trains_tokenizer_pretrains_and_samples(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "30", "--vocab-size", "600"]) == 0
    printed = capsys.readouterr().out
    assert "bytes per token" in printed and "ROMEO:" in printed
    from lmlab.loading import load_model
    from lmlab.tokenizers import load_tokenizer

    tok = load_tokenizer(out / "tokenizer")
    assert tok.vocab_size == 600
    ckpts = sorted((out / "run" / "checkpoints").iterdir())
    model = load_model(ckpts[-1])
    assert model.config.vocab_size >= 600
    assert (out / "run" / "loss.png").stat().st_size > 1000
    import json

    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["val_loss"] < summary["initial_val_loss"] - 0.5


def test_a_wordpiece_sample_reads_as_text_without_its_pieces():
    """Issue 27: `lmlab demo --algo wordpiece` showed raw `##` pieces in its sample. A continuation
    is decoded with its prompt (a `##` piece joins the word before it) and without special tokens
    (each cut the text into runs decoded apart)."""
    from lmlab.demo import continuation_text
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("wordpiece", ["romeo wherefore art thou romeo", "thou art"] * 5, vocab_size=60)
    prompt = tok.encode("romeo")
    pieces = [t for t in tok.vocab if t.startswith("##")][:2]
    new = [tok.token_to_id[pieces[0]], tok.sep_id, tok.token_to_id[pieces[1]], *tok.encode(" thou art")]
    text = continuation_text(tok, prompt, new)
    assert "##" in tok.decode(new, skip_special_tokens=True)  # the old way
    assert "##" not in text and text.endswith(" thou art")
    assert text.startswith(pieces[0][2:] + pieces[1][2:])     # glued to "romeo", and to each other


def test_a_vocabulary_too_small_is_refused_by_its_flag_before_any_work(tmp_path, capsys):
    """demo and tokenizer train name --vocab-size (not vocab_size) and refuse before any line or
    folder (the demo printed "[1/3] training..." first)."""
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n" * 20)
    for argv in (["demo", "--out", str(tmp_path / "d"), "--steps", "2", "--vocab-size", "5"],
                 ["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "5", "--input", str(text),
                  "--out", str(tmp_path / "d")]):
        capsys.readouterr()
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured
        assert captured.err.startswith("error: --vocab-size 5 is too small for bytelevel") and \
            captured.err.rstrip().endswith("set --vocab-size >= 263"), captured.err
        assert not (tmp_path / "d").exists()


def test_an_edited_demo_tokenizer_is_refused_before_the_earlier_run_is_deleted(tmp_path, capsys):
    """probe10b #2: with the demo's tokenizer edited by the user, a second demo deleted the whole
    earlier run (checkpoints, metrics, summary), trained a tokenizer, and only then refused, saying
    "nothing was written". Every entry the demo replaces is checked before the first is touched."""
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--steps", "2", "--vocab-size", "300"]
    assert main(argv) == 0
    (out / "tokenizer" / "tokenizer_config.json").write_text('{"x": 1}')
    before = sorted(p.relative_to(out) for p in (out / "run").rglob("*"))
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "tokenizer_config.json" in captured.err, captured.err
    assert "[1/3]" not in captured.out
    assert sorted(p.relative_to(out) for p in (out / "run").rglob("*")) == before
    assert (out / "tokenizer" / "tokenizer_config.json").read_text() == '{"x": 1}'
