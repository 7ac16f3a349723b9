"""`lmlab data prepare` end to end: real tokenizers on slices of real text, through the CLI."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from assertions import exit_code

from lmlab.data import TokenShards, val_score
from lmlab.tokenizers import load_tokenizer, train_tokenizer


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def bytelevel_dir(tmp_path_factory, shakespeare) -> Path:
    """A small byte-level BPE (exact round trip on any text), trained on 100 KB of Shakespeare."""
    tok = train_tokenizer("bytelevel", [shakespeare[:100_000]], vocab_size=400)
    return tok.save(tmp_path_factory.mktemp("tok") / "bytelevel")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shakespeare, data_dir) -> list[Path]:
    """Two real files: 60 KB of Shakespeare (LF) and 40 KB of a Gutenberg book (UTF-8 BOM, CRLF)."""
    d = tmp_path_factory.mktemp("corpus")
    a = d / "shakespeare.txt"
    a.write_text(shakespeare[200_000:260_000], encoding="utf-8")
    b = d / "guernsey.txt"
    book = data_dir / "pretrain" / "gutenberg" / "pg52834_guernsey_folk_lore.txt"
    b.write_bytes(book.read_bytes()[:40_000])
    return [a, b]


def expected_documents(path: Path) -> list[str]:
    """Blank-line separated paragraphs, written independently of lmlab: BOM dropped, CRLF -> LF."""
    text = path.read_bytes().decode("utf-8-sig").replace("\r\n", "\n")
    groups = itertools.groupby(text.split("\n"), key=lambda line: bool(line.strip()))
    return ["\n".join(lines) for nonblank, lines in groups if nonblank]


def prepare(capsys, tok, inputs, out, *extra) -> tuple[int, str, str]:
    code = exit_code(["data", "prepare", "--tokenizer", str(tok), "--input", *map(str, inputs), "--out",
                      str(out), *map(str, extra)])  # a refused flag value: argparse's SystemExit(2)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def all_files(directory: Path) -> dict[str, bytes]:
    """Every file's bytes; lmlab's manifests aside (they record when each file was written)."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != ".lmlab-manifest.json")
    return {str(p.relative_to(directory)): p.read_bytes() for p in files}


# --------------------------------------------------------------------------- behaviour
def test_round_trip_split_and_index(tmp_path, capsys, bytelevel_dir, corpus):
    out = tmp_path / "shards"
    code, stdout, err = prepare(capsys, bytelevel_dir, corpus, out, "--val-fraction", 0.2, "--workers", 1)
    assert code == 0, err
    assert "MB/s" in stdout and "train:" in stdout and "val:" in stdout and "bytes/token" in stdout

    docs = expected_documents(corpus[0]) + expected_documents(corpus[1])
    want = {"train": [d for d in docs if val_score(d) >= 0.2], "val": [d for d in docs if val_score(d) < 0.2]}
    assert 0.1 < len(want["val"]) / len(docs) < 0.3

    index = json.loads((out / "index.json").read_text())
    tok = load_tokenizer(bytelevel_dir)
    assert index["dtype"] == "uint16" and index["vocab_size"] == tok.vocab_size
    assert [i["documents"] for i in index["inputs"]] == [len(expected_documents(p)) for p in corpus]
    for split, texts in want.items():
        data = TokenShards(out, split)
        saved = data.tokenizer()  # the copy inside the shards directory
        assert saved.vocab == tok.vocab
        assert data.num_documents == len(texts) == index["splits"][split]["documents"]
        assert data.num_bytes == sum(len(t.encode("utf-8")) for t in texts)
        assert data.num_tokens == sum(len(tok.encode(t)) for t in texts)
        decoded = [saved.decode(data.document(i).tolist()) for i in range(data.num_documents)]
        assert decoded == texts  # every document comes back exactly, in input order
        assert np.asarray(data.tokens).dtype == np.uint16


def test_uint32_shards_for_a_vocabulary_above_65536(tmp_path, capsys, minilm_dir):
    """A real BERT vocab.txt padded past 65,536 entries: ids above 65,535 must survive."""
    bert = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    extra = [f"zzword{i}" for i in range(70_000 - len(bert))]
    tok_dir = tmp_path / "bigvocab"
    tok_dir.mkdir()
    (tok_dir / "vocab.txt").write_text("\n".join(bert + extra) + "\n", encoding="utf-8")
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    hi, mid = extra[-1], extra[len(extra) // 2]  # ids 69,999 and about 50,000
    text = tmp_path / "t.txt"
    text.write_text(f"the {hi} rose\nby any {mid} name\n\n{extra[0]} would smell as sweet\n")
    code, _, err = prepare(capsys, tok_dir, [text], tmp_path / "out", "--workers", 1)
    assert code == 0, err
    data = TokenShards(tmp_path / "out")
    tok = load_tokenizer(tok_dir)
    assert tok.vocab_size == 70_000 and data.dtype == np.uint32
    stored = np.asarray(data.tokens).tolist()
    want = tok.encode(f"the {hi} rose\nby any {mid} name") + tok.encode(f"{extra[0]} would smell as sweet")
    assert stored == want
    assert tok.token_to_id[hi] == 69_999 and 69_999 in stored
    assert data.tokenizer().decode(data.document(0).tolist()) == f"the {hi} rose by any {mid} name"


def test_val_split_is_deterministic_seeded_and_near_fraction(tmp_path, capsys, bytelevel_dir, shakespeare):
    # The fraction on all 7,222 paragraphs of Shakespeare (no tokenizing needed): within 4 sigma.
    paragraphs = [p for p in shakespeare.split("\n\n") if p.strip()]
    for f in (0.05, 0.3):
        frac = np.mean([val_score(p) < f for p in paragraphs])
        assert abs(frac - f) < 4 * np.sqrt(f * (1 - f) / len(paragraphs))

    src = tmp_path / "s.txt"
    src.write_text(shakespeare[:30_000])
    runs = {}
    for name, seed in [("a", 0), ("b", 0), ("c", 1)]:
        code, _, err = prepare(capsys, bytelevel_dir, [src], tmp_path / name, "--val-fraction", 0.3,
                               "--seed", seed, "--workers", 1)
        assert code == 0, err
        runs[name] = all_files(tmp_path / name)
    assert runs["a"] == runs["b"]  # same input and seed: same bytes
    assert runs["a"]["val_000.bin"] != runs["c"]["val_000.bin"]  # another seed: another split
    idx = json.loads(runs["a"]["index.json"])
    n_val, n_train = idx["splits"]["val"]["documents"], idx["splits"]["train"]["documents"]
    assert 0.15 < n_val / (n_val + n_train) < 0.45


def test_two_workers_write_byte_identical_output(tmp_path, capsys, bytelevel_dir, corpus, monkeypatch):
    from lmlab import values

    # shards far below the 2**20 tokens a user may ask for, so that this small corpus is cut in several
    monkeypatch.setattr(values, "ShardTokens", values.Count)
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        code, stdout, err = prepare(capsys, bytelevel_dir, corpus, out, "--val-fraction", 0.1,
                                    "--workers", workers, "--shard-tokens", 5000)
        assert code == 0, err
        assert f"{workers} worker" in stdout
        outs.append(all_files(out))
    assert len([f for f in outs[0] if f.startswith("train_0")]) > 2  # several shards were cut
    assert outs[0] == outs[1]


def test_separate_runs_write_identical_bytes(tmp_path, bytelevel_dir, corpus):
    """Across processes with different hash seeds (set iteration order differs), output is identical."""
    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"run{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        cmd = [sys.executable, "-c", "import sys; from lmlab.cli import main; sys.exit(main(sys.argv[1:]))",
               "data", "prepare", "--tokenizer", str(bytelevel_dir), "--input", str(corpus[0]),
               "--out", str(out), "--val-fraction", "0.2", "--workers", "1"]
        assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
        outs.append(all_files(out))
    assert outs[0] == outs[1]


def test_append_eos_and_positions_restart_per_document(tmp_path, capsys, bytelevel_dir, corpus):
    code, _, err = prepare(capsys, bytelevel_dir, corpus[:1], tmp_path / "o", "--append-eos", "--workers", 1)
    assert code == 0, err
    data = TokenShards(tmp_path / "o")
    eos = data.tokenizer().eos_id
    ends = np.append(data.doc_starts[1:], data.num_tokens) - 1
    assert (np.asarray(data.tokens)[ends] == eos).all()
    assert (np.asarray(data.tokens) == eos).sum() == data.num_documents
    ids, pos = data.window(0, 2000)
    starts = set(data.doc_starts.tolist())
    assert [i for i in range(len(pos)) if pos[i] == 0] == [i for i in range(len(pos)) if i in starts]
    assert all(pos[i] == pos[i - 1] + 1 for i in range(1, len(pos)) if i not in starts)


def test_line_and_file_document_modes(tmp_path, capsys, bytelevel_dir):
    src = tmp_path / "x.txt"
    src.write_text("first line\nsecond line\n\n  third, indented\n", encoding="utf-8")
    counts = {}
    for mode in ("blank-line", "line", "file"):
        code, _, err = prepare(capsys, bytelevel_dir, [src], tmp_path / mode, "--doc-separator", mode,
                               "--workers", 1)
        assert code == 0, err
        data = TokenShards(tmp_path / mode)
        tok = data.tokenizer()
        counts[mode] = [tok.decode(data.document(i).tolist()) for i in range(data.num_documents)]
    assert counts["blank-line"] == ["first line\nsecond line", "  third, indented"]
    assert counts["line"] == ["first line", "second line", "  third, indented"]
    assert counts["file"] == ["first line\nsecond line\n\n  third, indented\n"]


# --------------------------------------------------------------------------- atomicity
def test_failed_run_leaves_no_output_and_keeps_an_existing_one(tmp_path, capsys, bytelevel_dir, corpus):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine first paragraph\n\n" * 2000 + b"caf\xe9 au lait\n")  # latin-1 byte at the end
    out = tmp_path / "out"
    code, _, err = prepare(capsys, bytelevel_dir, [corpus[0], bad], out, "--workers", 2)
    assert code == 2 and "bad.txt line 4001" in err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp leftovers

    code, _, err = prepare(capsys, bytelevel_dir, [corpus[0]], out, "--workers", 1)
    assert code == 0, err
    before = all_files(out)
    stat_before = {p: os.stat(out / p).st_mtime_ns for p in before}
    code, _, err = prepare(capsys, bytelevel_dir, [corpus[0], bad], out, "--workers", 1)
    assert code == 2
    assert all_files(out) == before
    assert {p: os.stat(out / p).st_mtime_ns for p in before} == stat_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "out"]

    # latin-1 is the fix the message suggests, and it works
    code, _, err = prepare(capsys, bytelevel_dir, [bad], out, "--encoding", "latin-1", "--workers", 1)
    assert code == 0, err
    data = TokenShards(out)
    assert data.tokenizer().decode(data.document(data.num_documents - 1).tolist()) == "café au lait"


# --------------------------------------------------------------------------- bad input
def one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_bad_inputs_are_one_line_errors(tmp_path, capsys, bytelevel_dir, corpus):
    out = tmp_path / "out"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"line one\nline two\nna\xefve\n")
    truncated = tmp_path / "truncated_tok"
    truncated.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        data = (bytelevel_dir / f).read_bytes()
        (truncated / f).write_bytes(data[: len(data) // 2] if f == "tokenizer.json" else data)
    not_shards = tmp_path / "mine"
    not_shards.mkdir()
    (not_shards / "notes.txt").write_text("keep me")

    cases = [
        ([tmp_path / "missing.txt"], [], "missing.txt does not exist"),
        ([empty], [], "empty.txt is empty"),
        ([blank], [], "blank.txt holds only whitespace"),
        ([latin], [], "latin.txt line 3"),
        ([corpus[0]], ["--val-fraction", "1.0"], "argument --val-fraction: must be less than 1 (got '1.0')"),
        ([corpus[0]], ["--val-fraction", "-0.1"], "argument --val-fraction: must be at least 0 (got '-0.1')"),
        ([corpus[0]], ["--workers", "0"], "argument --workers: must be at least 1 (got '0')"),
        ([corpus[0]], ["--encoding", "klingon"], "is not a text encoding Python knows (got 'klingon')"),
    ]
    for inputs, extra, needle in cases:
        err = one_line_error(*prepare(capsys, bytelevel_dir, inputs, out, *extra)[::2])
        assert needle in err, (needle, err)
        assert not out.exists()
    assert "--encoding" in one_line_error(*prepare(capsys, bytelevel_dir, [latin], out)[::2])

    for tok, needle in [(tmp_path / "no_tok", "does not exist"), (truncated, "corrupt")]:
        err = one_line_error(*prepare(capsys, tok, [corpus[0]], out)[::2])
        assert needle in err and str(tok.name) in err, err
        assert not out.exists()

    err = one_line_error(*prepare(capsys, bytelevel_dir, [corpus[0]], not_shards)[::2])
    assert "was not written by lmlab" in err
    assert (not_shards / "notes.txt").read_text() == "keep me"

    tiny = tmp_path / "tiny.txt"
    tiny.write_text("just one paragraph\n")
    err = one_line_error(*prepare(capsys, bytelevel_dir, [tiny], out, "--val-fraction", 0.01)[::2])
    assert "no document went to the val split" in err and not out.exists()


def test_gzipped_text_gives_the_same_shards_as_the_plain_file(tmp_path, capsys, bytelevel_dir, corpus):
    import gzip

    packed = tmp_path / "corpus.txt.gz"
    packed.write_bytes(gzip.compress(corpus[0].read_bytes()))
    plain_out, gz_out = tmp_path / "plain", tmp_path / "gz"
    assert prepare(capsys, bytelevel_dir, corpus[:1], plain_out, "--workers", 1)[0] == 0
    assert prepare(capsys, bytelevel_dir, [packed], gz_out, "--workers", 1)[0] == 0
    shards = lambda d: {k: v for k, v in all_files(d).items() if k != "index.json"}  # noqa: E731
    assert shards(plain_out) == shards(gz_out) and shards(gz_out)
    (tmp_path / "cut.txt.gz").write_bytes(packed.read_bytes()[:-20])  # a truncated download
    code, _, err = prepare(capsys, bytelevel_dir, [tmp_path / "cut.txt.gz"], tmp_path / "cut", "--workers", 1)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert "not a complete gzip file" in err


@pytest.mark.parametrize("shard_tokens", [1, 5000, 2**20 - 1])
def test_a_shard_size_below_2_20_tokens_is_refused_up_front(tmp_path, capsys, bytelevel_dir, corpus,
                                                            shard_tokens):
    """--shard-tokens 1 cut 60 KB of text into 48,891 files; a shard holds at least 2**20 tokens
    (lmlab.values.ShardTokens), on the command line and in the Python API alike."""
    from lmlab.data.prepare import prepare_shards
    from lmlab.errors import LmlabError

    out = tmp_path / "o"
    code, _, err = prepare(capsys, bytelevel_dir, corpus[:1], out, "--shard-tokens", shard_tokens)
    assert code == 2 and not out.exists()
    assert err.startswith("error: argument --shard-tokens: must be at least 1048576") and err.count("\n") == 1
    assert "at least 1,048,576 (2**20)" in err
    with pytest.raises(LmlabError, match="shard_tokens must be at least 1048576"):
        prepare_shards(bytelevel_dir, [str(corpus[0])], out, shard_tokens=shard_tokens)
    assert not out.exists()
    assert prepare(capsys, bytelevel_dir, corpus[:1], out, "--shard-tokens", 2**20)[0] == 0

