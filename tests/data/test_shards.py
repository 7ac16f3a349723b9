"""The shards format on its own: ShardWriter -> index.json -> TokenShards (no tokenizer involved)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lmlab.data.shards import ConcatenatedTokens, ShardWriter, TokenShards, dtype_for_vocab, write_index
from lmlab.errors import LmlabError


def write_split(directory, docs, vocab_size, shard_tokens, num_bytes=None, split="train"):
    """Write ``docs`` (lists of ids) as one split with a minimal index; return the index entry."""
    dtype = dtype_for_vocab(vocab_size)
    w = ShardWriter(directory, split, dtype, shard_tokens)
    # mix the one-document and the batched entry points
    w.add_document(docs[0], 11)
    rest = docs[1:]
    if rest:
        flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in rest])
        w.add(flat, [len(d) for d in rest], 100 if num_bytes is None else num_bytes)
    entry = w.close()
    write_index(directory, dtype, vocab_size, {split: entry})
    return entry


@pytest.fixture
def random_docs():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 1000, size=int(n)).tolist() for n in rng.integers(1, 30, size=40)]


def test_dtype_is_uint16_up_to_65536_tokens_then_uint32():
    assert dtype_for_vocab(256) == np.uint16
    assert dtype_for_vocab(65536) == np.uint16  # ids 0..65535 fit
    assert dtype_for_vocab(65537) == np.uint32
    assert dtype_for_vocab(200_000) == np.uint32


def test_writer_cuts_shards_and_reader_sees_one_stream(tmp_path, random_docs):
    entry = write_split(tmp_path, random_docs, vocab_size=1000, shard_tokens=50)
    total = sum(map(len, random_docs))
    assert entry["tokens"] == total and entry["documents"] == len(random_docs)
    assert [s["tokens"] for s in entry["shards"]][:-1] == [50] * (len(entry["shards"]) - 1)
    assert len(entry["shards"]) == math.ceil(total / 50)
    for s in entry["shards"]:  # flat little-endian uint16 files of exactly that many tokens
        assert (tmp_path / s["file"]).stat().st_size == 2 * s["tokens"]

    data = TokenShards(tmp_path, "train")
    flat = np.concatenate([np.asarray(d) for d in random_docs])
    assert data.num_tokens == total and data.dtype == np.uint16 and data.vocab_size == 1000
    assert isinstance(data.tokens, ConcatenatedTokens)
    np.testing.assert_array_equal(np.asarray(data.tokens), flat)
    # slices across shard boundaries, negative and single indices
    for a, b in [(0, 50), (45, 55), (49, 151), (3, total), (total - 5, total + 10)]:
        np.testing.assert_array_equal(data.tokens[a:b], flat[a:b])
    assert data.tokens[-1] == flat[-1] and data.tokens[50] == flat[50]
    with pytest.raises(IndexError):
        data.tokens[total]
    # documents and their boundaries
    np.testing.assert_array_equal(data.doc_starts, np.cumsum([0] + [len(d) for d in random_docs])[:-1])
    for i in (0, 7, len(random_docs) - 1):
        assert data.document(i).tolist() == random_docs[i]
    assert not data.doc_starts.flags.writeable


def test_single_shard_is_a_read_only_memmap(tmp_path, random_docs):
    write_split(tmp_path, random_docs, vocab_size=1000, shard_tokens=10**6)
    data = TokenShards(tmp_path)
    assert isinstance(data.tokens, np.memmap)
    with pytest.raises(ValueError):
        data.tokens[0] = 1


def test_window_positions_restart_at_every_document(tmp_path, random_docs):
    write_split(tmp_path, random_docs, vocab_size=1000, shard_tokens=37)
    data = TokenShards(tmp_path)
    # brute force: position of each token inside its own document
    want_pos = np.concatenate([np.arange(len(d)) for d in random_docs])
    flat = np.concatenate([np.asarray(d) for d in random_docs])
    for start, n in [(0, 64), (20, 100), (len(flat) - 10, 64)]:
        ids, pos = data.window(start, n)
        assert ids.dtype == np.int64
        np.testing.assert_array_equal(ids, flat[start:start + n])
        np.testing.assert_array_equal(pos, want_pos[start:start + n])
    with pytest.raises(LmlabError):
        data.window(len(flat), 4)


def test_uint32_ids_above_65535_survive(tmp_path):
    docs = [[70_000, 65_536, 3], [99_999, 0]]
    write_split(tmp_path, docs, vocab_size=100_000, shard_tokens=4)
    data = TokenShards(tmp_path)
    assert data.dtype == np.uint32
    assert (tmp_path / "train_000.bin").stat().st_size == 4 * 4
    assert data.read(0, 5).tolist() == [70_000, 65_536, 3, 99_999, 0]


def test_bits_per_byte_uses_token_and_byte_counts(tmp_path, random_docs):
    write_split(tmp_path, random_docs, vocab_size=1000, shard_tokens=100, num_bytes=989)
    data = TokenShards(tmp_path)
    assert data.num_bytes == 11 + 989
    nll = 2.5  # nats per token
    assert data.bits_per_byte(nll) == pytest.approx(nll * data.num_tokens / math.log(2) / 1000)


def test_truncated_shard_is_a_clear_error(tmp_path, random_docs):
    entry = write_split(tmp_path, random_docs, vocab_size=1000, shard_tokens=50)
    shard = tmp_path / entry["shards"][1]["file"]
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(LmlabError, match="truncated.*lmlab data prepare"):
        TokenShards(tmp_path)


def test_missing_or_foreign_index_and_unknown_split(tmp_path, random_docs):
    with pytest.raises(LmlabError, match="does not exist"):
        TokenShards(tmp_path / "nope")
    with pytest.raises(LmlabError, match="does not exist"):
        TokenShards(tmp_path)  # directory without index.json
    write_split(tmp_path, random_docs, vocab_size=1000, shard_tokens=50)
    with pytest.raises(LmlabError, match="unknown split 'val'"):
        TokenShards(tmp_path, "val")
    index = json.loads((tmp_path / "index.json").read_text())
    index["format_version"] = 99
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(LmlabError, match="format version"):
        TokenShards(tmp_path)
    (tmp_path / "index.json").write_text('{"format": ')
    with pytest.raises(LmlabError, match="corrupt"):
        TokenShards(tmp_path)


def test_empty_split_is_a_clear_error(tmp_path):
    w = ShardWriter(tmp_path, "val", np.uint16, 10)
    write_index(tmp_path, np.uint16, 10, {"val": w.close()})
    with pytest.raises(LmlabError, match="holds no tokens.*--val-fraction"):
        TokenShards(tmp_path, "val")


@pytest.mark.parametrize("bad", ["/etc/hostname", "../outside.bin", "sub/../../outside.bin"])
def test_an_index_pointing_outside_its_directory_is_refused(tmp_path, random_docs, bad):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_split(shards, random_docs, vocab_size=1000, shard_tokens=10_000)
    (tmp_path / "outside.bin").write_bytes(b"\0" * 4)
    index = json.loads((shards / "index.json").read_text())
    index["splits"]["train"]["shards"][0]["file"] = bad
    (shards / "index.json").write_text(json.dumps(index))
    with pytest.raises(LmlabError, match="not a file inside"):
        TokenShards(shards, "train")


def test_a_file_given_as_token_shards_is_called_a_file(tmp_path):
    """probe10a M3: ``TokenShards("corpus.txt")`` said the path "does not exist"; it does, as a file."""
    text = tmp_path / "corpus.txt"
    text.write_text("to be or not to be\n")
    with pytest.raises(LmlabError, match=r"corpus.txt is a file, not a token shards directory; pass the"):
        TokenShards(text)
    with pytest.raises(LmlabError, match=r"nowhere does not exist: no token shards directory"):
        TokenShards(tmp_path / "nowhere")
