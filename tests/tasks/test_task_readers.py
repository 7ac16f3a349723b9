"""Readers on the real files (counts from PROVENANCE.md) and on malformed input."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from lmlab.errors import LmlabError
from lmlab.tasks import make_task
from lmlab.tasks.readers import BadLines, read_conll, read_glue, read_pairs, read_squad


def test_glue_files_as_distributed(data_dir):
    g = data_dir / "glue"
    sst = read_glue(g / "sst2" / "dev.tsv", "single")
    assert len(sst) == 872 and Counter(e.label for e in sst) == {"1": 444, "0": 428}
    assert sst[0].text.startswith("it 's a charming and often affecting journey")
    cola = read_glue(g / "cola" / "train.tsv", "single")
    assert len(cola) == 8551 and Counter(e.label for e in cola) == {"1": 6023, "0": 2528}
    mrpc = read_glue(g / "mrpc" / "train.tsv", "pair")            # headerless 5 columns
    assert len(mrpc) == 2576 and Counter(e.label for e in mrpc) == {"1": 1753, "0": 823}
    assert mrpc[0].pair and mrpc[0].text != mrpc[0].pair
    mrpc_test = read_glue(g / "mrpc" / "test.tsv", "pair")        # header with a BOM
    assert len(mrpc_test) == 1725 and Counter(e.label for e in mrpc_test) == {"1": 1147, "0": 578}
    rte = read_glue(g / "rte" / "dev.tsv", "pair")
    assert len(rte) == 139 and Counter(e.label for e in rte) == {"entailment": 70, "not_entailment": 69}
    stsb = read_glue(g / "stsb" / "dev.tsv", "regression")        # headerless 10 GLUE columns
    assert len(stsb) == 1500 and all(0.0 <= e.label <= 5.0 for e in stsb)
    assert len(read_glue(g / "stsb" / "test.tsv", "regression")) == 1500   # headed


def test_squad_and_conll_as_distributed(data_dir):
    sq = read_squad(data_dir / "squad" / "squad_v1.1_dev_partA.json")
    assert len(sq) == 4961
    e = sq[0]
    for text, start in zip(e.extra["answers"], e.extra["answer_starts"]):
        assert e.extra["context"][start:start + len(text)] == text
    conll = read_conll(data_dir / "conll2003" / "valid.txt")
    assert len(conll) == 3250 and sum(len(s.extra["words"]) for s in conll) == 51362
    assert all(len(s.label) == len(s.extra["words"]) for s in conll)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_malformed_tsv_error_names_file_and_line(tmp_path):
    p = _write(tmp_path, "bad.tsv", "sentence\tlabel\ngood one\t1\nno tab here\nfine\t0\n\t1\n")
    with pytest.raises(LmlabError, match=r"bad\.tsv line 3: expected 2 tab-separated fields, found 1"):
        read_glue(p, "single")
    warnings = []
    got = read_glue(p, "single", BadLines("skip", warnings.append, max_fraction=0.5))
    assert [e.text for e in got] == ["good one", "fine"]
    assert len(warnings) == 3 and "line 3" in warnings[0] and "line 5" in warnings[1]
    assert warnings[2].endswith("bad.tsv: skipped 2 of 4 rows (50.0%) as malformed")
    with pytest.raises(LmlabError, match=r"bad\.tsv: 2 of 4 rows \(50\.0%\) are malformed, more than"):
        read_glue(p, "single", BadLines("skip", warnings.append))   # default: at most 1% of the rows


def test_bad_regression_score_and_unknown_layout(tmp_path):
    p = _write(tmp_path, "s.tsv", "a\tb\t1.5\nc\td\thigh\n")
    with pytest.raises(LmlabError, match=r"s\.tsv line 2: score 'high' is not a number"):
        read_glue(p, "regression")
    q = _write(tmp_path, "w.tsv", "a\tb\tc\td\te\tf\n")
    with pytest.raises(LmlabError, match="6 tab-separated fields is not a known single GLUE layout"):
        read_glue(q, "single")


def test_squad_bad_json_and_bad_records(tmp_path):
    p = _write(tmp_path, "bad.json", '{"data": [\n{"title": "x",\n "paragraphs": [}\n]}')
    with pytest.raises(LmlabError, match=r"bad\.json line 3 column \d+: invalid JSON"):
        read_squad(p)
    rec = {"id": "q1", "context": "Paris is in France.", "question": "Where is Paris?",
           "answers": [{"text": "France", "answer_start": 12}]}
    wrong = dict(rec, answers=[{"text": "France", "answer_start": 3}])
    lines = [json.dumps(rec), "{not json", json.dumps(wrong), json.dumps(rec)]
    q = _write(tmp_path, "qa.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(LmlabError, match=r"qa\.jsonl line 2: invalid JSON"):
        read_squad(q)
    warnings = []
    got = read_squad(q, BadLines("skip", warnings.append, max_fraction=1))
    assert len(got) == 2 and got[0].extra["answers"] == ["France"]
    assert "line 3" in warnings[1] and "not at character 3" in warnings[1]
    # a negative start that Python's slicing would count from the end, and an empty answer
    for answer in ({"text": "France", "answer_start": -7}, {"text": "", "answer_start": 0}):
        q = _write(tmp_path, "neg.jsonl", json.dumps(dict(rec, answers=[answer])) + "\n")
        with pytest.raises(LmlabError, match=r"neg\.jsonl line 1: answer .* is not at character"):
            read_squad(q)


def test_conll_bad_tag_and_skip_drops_the_sentence(tmp_path):
    p = _write(tmp_path, "c.txt", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n"
                                  "Peter NNP B-NP X-PER\nBlackburn NNP I-NP I-PER\n\nLondon NNP B-NP B-LOC\n")
    with pytest.raises(LmlabError, match=r"c\.txt line 6: tag 'X-PER' is not an IOB tag"):
        read_conll(p)
    got = read_conll(p, BadLines("skip", lambda m: None, max_fraction=1))
    assert [e.extra["words"] for e in got] == [["EU", "rejects"], ["London"]]
    assert got[0].label == ["B-ORG", "O"]


def test_pairs_tsv_and_jsonl(tmp_path):
    p = _write(tmp_path, "p.tsv", "source\ttarget\na long text\tshort\nonly one field\n")
    with pytest.raises(LmlabError, match=r"p\.tsv line 3"):
        read_pairs(p)
    q = _write(tmp_path, "p.jsonl", '{"source": "ein Haus", "target": "a house"}\n')
    assert read_pairs(q)[0].label == "a house"


def test_unseen_dev_label_is_one_line_error(tmp_path):
    task = make_task("rte")
    train = task.read(_write(tmp_path, "t.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
                                                 "1\tc\td\tnot_entailment\n"))
    dev = task.read(_write(tmp_path, "d.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tcontradiction\n"))
    task.fit(train)
    with pytest.raises(LmlabError, match=r"d\.tsv line 2: label 'contradiction' never occurs in the train"):
        task.check(dev)
    one = task.read(_write(tmp_path, "o.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"))
    with pytest.raises(LmlabError, match="only the label"):
        task.fit(one)


def test_a_header_without_the_task_columns_names_the_file_and_line(tmp_path):
    """rte (pairs) on a 2-column sentence/label TSV: the error said which header, not which file."""
    f = tmp_path / "two.tsv"
    f.write_text("sentence\tlabel\nhello there\t1\n", encoding="utf-8")
    with pytest.raises(LmlabError) as e:
        read_glue(f, "pair")
    assert str(e.value).startswith(f"{f} line 1: header ['sentence', 'label'] does not name the sentence1, "
                                   "sentence2 and label columns")
