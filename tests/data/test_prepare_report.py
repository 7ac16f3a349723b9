"""What `lmlab data prepare` and pretraining say about the shards they write (issue 27): a folder of
validation text is labelled val (not "train: ... / val: 0 documents"), an empty val split nobody
asked for is not shown, and replacing earlier shards is said."""

from __future__ import annotations

from lmlab.cli import main
from lmlab.data.prepare import prepare_shards
from lmlab.tokenizers import train_tokenizer
from lmlab.train.config import DataConfig
from lmlab.train.data import prepare_run_data


def corpus(tmp_path, name: str, n: int):
    path = tmp_path / name
    paragraphs = [f"{name} paragraph {i}: to be or not to be" for i in range(n)]
    path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    return path


def tokenizer(tmp_path):
    texts = ["to be or not to be paragraph train val"] * 5
    train_tokenizer("bpe", texts, vocab_size=60).save(tmp_path / "tok")
    return tmp_path / "tok"


def test_no_val_line_without_a_val_fraction_and_a_replacement_is_said(tmp_path, capsys):
    text, tok = corpus(tmp_path, "a.txt", 50), tokenizer(tmp_path)
    first = prepare_shards(tok, [text], tmp_path / "shards", workers=1).report().splitlines()
    assert first[0].startswith(f"prepared {tmp_path / 'shards'}/: 50 documents")
    assert [line.split()[0] for line in first[1:]] == ["train:"]      # no "val: 0 documents"
    assert main(["data", "prepare", "--tokenizer", str(tok), "--input", str(text), "--out",
                 str(tmp_path / "shards"), "--val-fraction", "0.2", "--workers", "1"]) == 0
    again = capsys.readouterr().out.splitlines()
    assert again[0].startswith(f"replaced the earlier shards in {tmp_path / 'shards'}/: 50 documents")
    assert [line.split()[0] for line in again[1:]] == ["train:", "val:"]


def test_pretraining_labels_its_validation_folder_val(tmp_path):
    tok = tokenizer(tmp_path)
    train, val = corpus(tmp_path, "train.txt", 40), corpus(tmp_path, "val.txt", 7)
    cfg = DataConfig(train=[str(train)], val=[str(val)], tokenizer=str(tok))
    said: list[str] = []
    data = prepare_run_data(cfg, tmp_path / "run", said.append)
    assert data.val.num_documents == 7
    val_block = said[said.index(next(s for s in said if "data/val" in s and s.startswith("prepared"))):]
    assert val_block[1].split()[:2] == ["val:", "7"] and "train:" not in " ".join(val_block[1:3])
    assert not any("val:" in s and " 0 documents" in s for s in said)
