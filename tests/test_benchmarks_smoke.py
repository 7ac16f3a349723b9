"""Smoke tests of the benchmark harness: corpus loading, report sections, and each script's
``--quick`` run producing its table with lmlab and peer figures. No timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402

ALGOS = ("bpe", "bytelevel", "wordpiece", "unigram")
NUMBER = re.compile(r"^\d+(\.\d+)?$")


def test_corpus_files_decode_cleanly(data_dir):
    """Latin-1 files decode as latin-1, the BOM is dropped, CRLF becomes LF."""
    files = common.corpus_files(data_dir)
    names = {f.name for f in files}
    assert common.LATIN1_FILES <= names and "pg52834_guernsey_folk_lore.txt" in names
    for f in files:
        text = common.read_corpus_file(f)
        assert "\r\n" not in text and not text.startswith("\ufeff") and "\ufffd" not in text, f.name
    path = data_dir / "pretrain" / "english-mix" / "gutenberg_shakespeare-caesar.txt"
    caesar, raw = common.read_corpus_file(path), path.read_bytes()
    assert any(b >= 0x80 for b in raw)  # really has non-ASCII bytes, so the decode choice matters
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    assert len(caesar) == len(raw.replace(b"\r\n", b"\n"))  # latin-1: one character per byte


def test_capped_corpus_mixes_every_source(data_dir):
    lines = common.load_corpus(0.5, data_dir)
    assert 0.4 < common.corpus_mb(lines) <= 0.55
    assert all(line.strip() and "\n" not in line for line in lines)
    joined = "\n".join(lines)
    assert "@-@" in joined or " @,@ " in joined  # WikiText is in the slice
    assert "First Citizen" in joined  # tinyshakespeare is in the slice


def test_update_section_rewrites_only_its_own_section(tmp_path):
    md = tmp_path / "B.md"
    common.update_section("a", "alpha 1", md)
    common.update_section("b", "beta 1", md)
    common.update_section("a", "alpha 2", md)
    text = md.read_text()
    assert text.startswith("# Benchmarks")
    assert "alpha 2" in text and "alpha 1" not in text and "beta 1" in text
    assert text.index("<!-- a:start -->") < text.index("<!-- b:start -->")
    assert text.count("<!-- a:start -->") == 1


def _table_rows(report: str, columns: int) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in report.splitlines()
            if line.startswith("| ") and not line.startswith("| algorithm")]
    assert rows and all(len(r) == columns for r in rows), report
    return rows


def _run(script: str, md: Path) -> str:
    proc = subprocess.run([sys.executable, str(BENCH / script), "--quick", "--markdown", str(md)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_training_quick_produces_the_table(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    common.update_section("tokenizer_encoding", "other section kept", md)
    out = _run("tokenizer_training.py", md)
    rows = _table_rows(out, 19)
    assert {r[0] for r in rows} == set(ALGOS)
    for row in rows:
        algo, _vocab, peer, ours, theirs, ratio, ours_cpu, theirs_cpu, cpu_ratio, *_rest, _target, verdict = \
            row[:-3]
        assert NUMBER.match(ours_cpu) and NUMBER.match(theirs_cpu) and cpu_ratio.endswith("x")
        mem_ratio, mem_target, mem_verdict = row[-3:]
        assert mem_ratio.endswith("x") and mem_verdict in ("met", "**missed**", "—")
        assert (mem_target != "—") == (algo in ("wordpiece", "unigram") and peer != "HF Unigram")
        assert NUMBER.match(theirs), f"{peer} did not train: {out}"
        assert NUMBER.match(ours), f"lmlab {algo} did not train: {out}"
        assert ratio.endswith("x")
        for cell in _rest[-2:]:  # held-out text, training text
            lmlab_cpt, peer_cpt = (float(x) for x in cell.split(" / "))
            assert 1.0 < lmlab_cpt < 10.0 and 1.0 < peer_cpt < 10.0  # English subwords: a few chars each
        assert verdict in ("met", "**missed**", "—")
    targeted = {r[0]: r[2] for r in rows if r[-5] != "—"}
    assert targeted == {"bpe": "HF BPE", "bytelevel": "HF ByteLevelBPE", "wordpiece": "HF WordPiece",
                        "unigram": "sentencepiece unigram"}
    text = md.read_text()
    assert "<!-- tokenizer_training:start -->" in text and "other section kept" in text
    assert "| algorithm | vocab | peer |" in text


def test_encoding_quick_produces_the_table(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    out = _run("tokenizer_encoding.py", md)
    assert "held-out" in out and "disjoint from" in out
    per_thread, bulk = out.split("Bulk encoding on both cores")
    rows = _table_rows(per_thread, 14)
    assert [r[0] for r in rows] == list(ALGOS)
    for r in rows:
        algo, ours, hf_one, hf_batch, ratio, verdict = r[0], r[2], r[3], r[4], r[7], r[9]
        assert NUMBER.match(hf_one) and NUMBER.match(hf_batch), out
        assert NUMBER.match(ours), f"lmlab {algo} did not encode: {out}"
        assert ratio.endswith("x") and verdict in ("met", "**missed**")
    by_algo = {r[0]: r for r in rows}
    assert NUMBER.match(by_algo["unigram"][5])  # sentencepiece measured
    assert by_algo["wordpiece"][5] == "—"  # no sentencepiece analogue of WordPiece
    bulk_rows = _table_rows(bulk, 8)
    assert [r[0] for r in bulk_rows] == list(ALGOS)
    for algo, _vocab, ours, hf, ratio, target, verdict, same in bulk_rows:
        assert ours.endswith("(`encode_many`)") and NUMBER.match(ours.split()[0]), f"{algo}: {out}"
        assert NUMBER.match(hf) and ratio.endswith("x") and target == "≥ 1.5x", out
        assert verdict in ("met", "**missed**") and same == "100%", out
    assert "<!-- tokenizer_encoding:start -->" in md.read_text()


def test_training_and_held_out_parts_are_disjoint(data_dir):
    train, capped = common.split_corpus(0.3, 0.2, data_dir)
    assert 0.25 < common.corpus_mb(train) <= 0.33 and 0.1 < common.corpus_mb(capped) <= 0.22
    train, held = common.split_corpus(0.3, None, data_dir)
    assert set(capped) <= set(held) and common.corpus_mb(held) > 10 * common.corpus_mb(capped)
    assert train == common.load_corpus(0.3, data_dir)  # the training part is the usual leading slice
    assert not set(train) & set(held)
    held_set = set(held)
    for f in common.corpus_files(data_dir):  # every source is held out too
        assert any(line in held_set for line in common.read_corpus_file(f).split("\n")), f.name


def test_multi_variant_quick_produces_the_table(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    out = _run("multi_variant.py", md)
    rows = [r for r in _table_rows(out, 7) if not r[0].startswith("variants")]
    assert [r[1].split(",")[0] for r in rows] == ["scoring", "greedy generation"] * 2
    for _, _, n, batched, alone, ratio, plain in rows:
        assert all(NUMBER.match(x) for x in (n, batched, alone, plain)) and ratio.endswith("x"), out
    assert "<!-- multi_variant:start -->" in md.read_text()
