"""JSON Lines and Parquet as training data: one record = one document, read by the real
libraries' formats (gzip, zstandard, pyarrow), the same shards as the same documents in a text
file, and a one-line error for every way a record file can read wrong."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from lmlab.cli import main
from lmlab.data import TokenShards, iter_documents, prepare_shards
from lmlab.errors import LmlabError
from lmlab.tokenizers import load_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def paragraphs(shakespeare) -> list[str]:
    """Real documents with inner newlines: the speeches of 60 KB of Shakespeare."""
    return [p.strip() for p in shakespeare[:60_000].split("\n\n") if p.strip()]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, shakespeare):
    return train_tokenizer("bytelevel", [shakespeare[:50_000]], vocab_size=300).save(
        tmp_path_factory.mktemp("tok") / "tok")


def _records(paragraphs):
    return [{"id": i, "text": p, "source": "shakespeare"} for i, p in enumerate(paragraphs)]


def write_formats(d, paragraphs) -> dict:
    lines = "".join(json.dumps(r) + "\n" for r in _records(paragraphs))
    (d / "a.jsonl").write_text(lines, encoding="utf-8")
    with gzip.open(d / "a.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(lines)
    (d / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    table = pa.table({"id": list(range(len(paragraphs))), "text": paragraphs})
    pq.write_table(table, d / "a.parquet", row_group_size=50)  # several row groups
    (d / "a.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return {k: d / f"a.{k}" for k in ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "txt")}


def test_every_format_gives_the_records_as_documents_and_the_same_shards(tmp_path, paragraphs, tok_dir):
    files = write_formats(tmp_path, paragraphs)
    assert len(paragraphs) > 100 and pq.ParquetFile(files["parquet"]).num_row_groups > 1
    for kind, path in files.items():
        if kind != "txt":
            assert list(iter_documents(path)) == paragraphs, kind
    reference = None
    for kind, path in files.items():
        prepare_shards(tok_dir, [path], tmp_path / f"shards-{kind}", workers=1, progress=False)
        ids = np.asarray(TokenShards(tmp_path / f"shards-{kind}", "train").read(0, 10**9))
        if reference is None:
            reference = ids
        assert np.array_equal(ids, reference), kind  # the text file's blank-line paragraphs = the records
    text = TokenShards(tmp_path / "shards-jsonl", "train").tokenizer().decode(reference[:200].tolist())
    assert text.startswith(paragraphs[0][:40])  # the record's text, not the JSON around it


def test_every_zstandard_frame_is_read_and_a_broken_stream_is_one_line(tmp_path):
    frames = [zstandard.ZstdCompressor().compress(f'{{"text": "review {i}"}}\n'.encode()) for i in range(3)]
    (tmp_path / "multi.jsonl.zst").write_bytes(b"".join(frames))  # as pzstd or `cat a.zst b.zst` write
    assert list(iter_documents(tmp_path / "multi.jsonl.zst")) == ["review 0", "review 1", "review 2"]
    (tmp_path / "broken.jsonl.zst").write_bytes(frames[0][:-6] + b"garbage!")
    with pytest.raises(LmlabError, match="could not be read to the end"):
        list(iter_documents(tmp_path / "broken.jsonl.zst"))


def test_a_datasets_folder_is_read_as_its_records(tmp_path, paragraphs, tok_dir):
    from datasets import Dataset, DatasetDict

    ds = Dataset.from_dict({"id": list(range(len(paragraphs))), "text": paragraphs})
    ds.save_to_disk(str(tmp_path / "hf"), num_shards=3)  # several Arrow files, in order
    assert list(iter_documents(tmp_path / "hf")) == paragraphs
    (tmp_path / "a.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    for name in ("hf", "a.txt"):
        prepare_shards(tok_dir, [tmp_path / name], tmp_path / f"shards-{name}", workers=1, progress=False)
    a, b = (np.asarray(TokenShards(tmp_path / f"shards-{n}", "train").read(0, 10**9))
            for n in ("hf", "a.txt"))
    assert np.array_equal(a, b)
    from lmlab.train import pretrain

    summary = pretrain({"model": {"preset": "gpt2-tiny", "d_model": 32, "n_layers": 1, "n_heads": 2,
                                  "d_ff": 64, "max_positions": 64},
                        "objective": {"name": "clm"},
                        "data": {"train": [str(tmp_path / "hf")], "val_fraction": 0.1,
                                 "tokenizer": str(tok_dir)},
                        "train": {"max_steps": 1, "batch_size": 2, "seq_len": 32, "eval_batches": 1,
                                  "threads": 1, "progress": "off", "warmup_steps": 1}},
                       tmp_path / "run", log=lambda m: None)
    assert summary["steps"] == 1  # data.train takes the folder as it is
    DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "both"))
    with pytest.raises(LmlabError, match=r"several splits \(train, test\)"):
        list(iter_documents(tmp_path / "both"))
    assert list(iter_documents(tmp_path / "both" / "test"))[:2] == paragraphs[:2]
    with pytest.raises(LmlabError, match="no column 'body'"):
        list(iter_documents(tmp_path / "hf", text_field="body"))


def test_another_field_holds_the_text(tmp_path, tok_dir):
    path = tmp_path / "b.jsonl"
    path.write_text('{"body": "first review"}\n\n{"body": "second one"}\n', encoding="utf-8")
    assert list(iter_documents(path, text_field="body")) == ["first review", "second one"]
    with pytest.raises(LmlabError, match=r"line 1 has no field 'text' \(it has: body\)"):
        list(iter_documents(path))


@pytest.mark.parametrize("content, message", [
    ('{"text": "ok"}\n{"text": "broken\n', "line 2 is not JSON"),
    ('{"text": "ok"}\n["a", "list"]\n', "line 2 is a JSON list, not an object"),
    ('{"text": 3}\n', "field 'text' is int, not text"),
])
def test_a_jsonl_file_that_reads_wrong_stops_the_run(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LmlabError, match=message):
        list(iter_documents(path))


def test_a_parquet_file_that_reads_wrong_stops_the_run(tmp_path):
    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "no_text.parquet")
    with pytest.raises(LmlabError, match=r"no column 'text' \(it has: body\)"):
        list(iter_documents(tmp_path / "no_text.parquet"))
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "numbers.parquet")
    with pytest.raises(LmlabError, match="is int64, not text"):
        list(iter_documents(tmp_path / "numbers.parquet"))
    pq.write_table(pa.table({"text": ["a", None]}), tmp_path / "null.parquet")
    with pytest.raises(LmlabError, match="row 2"):
        list(iter_documents(tmp_path / "null.parquet"))
    (tmp_path / "fake.parquet").write_text("not parquet")
    with pytest.raises(LmlabError, match="not a readable Parquet file"):
        list(iter_documents(tmp_path / "fake.parquet"))


def test_cli_prepare_and_pretrain_read_records(tmp_path, paragraphs, tok_dir, capsys):
    files = write_formats(tmp_path, paragraphs)
    code = main(["data", "prepare", "--tokenizer", str(tok_dir), "--input", str(files["parquet"]),
                 "--out", str(tmp_path / "cli"), "--workers", "1"])
    assert code == 0 and TokenShards(tmp_path / "cli", "train").num_tokens > 1000
    code = main(["data", "prepare", "--tokenizer", str(tok_dir), "--input", str(files["jsonl"]),
                 "--out", str(tmp_path / "cli2"), "--text-field", "source"])
    assert code == 0  # every document is the word "shakespeare"
    one_word = TokenShards(tmp_path / "cli2", "train").num_tokens
    word = load_tokenizer(tok_dir).encode_plus("shakespeare", add_special_tokens=False).ids
    assert one_word == len(paragraphs) * len(word)
    assert one_word < 0.1 * TokenShards(tmp_path / "cli", "train").num_tokens
    capsys.readouterr()
    from lmlab.train import pretrain

    summary = pretrain({"model": {"preset": "gpt2-tiny", "d_model": 32, "n_layers": 1, "n_heads": 2,
                                  "d_ff": 64, "max_positions": 64},
                        "objective": {"name": "clm"},
                        "data": {"train": [str(files["jsonl.gz"])], "val_fraction": 0.1,
                                 "tokenizer": {"algo": "bytelevel", "vocab_size": 300}},
                        "train": {"max_steps": 2, "batch_size": 2, "seq_len": 32, "eval_batches": 1,
                                  "threads": 1, "progress": "off", "warmup_steps": 1}},
                       tmp_path / "run", log=lambda m: None)
    assert summary["steps"] == 2
    vocab = TokenShards(tmp_path / "run" / "data" / "train", "train").tokenizer()
    pieces = {vocab.decode([i]) for i in range(vocab.vocab_size)}
    assert '"text"' not in "".join(pieces)  # trained on the text, not the JSON
