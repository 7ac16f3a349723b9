"""The zero-shot benchmark's scoring helpers (benchmarks/instruct_zero_shot.py): which answer word
is the positive class, the margin, the per-template AUC, the paired bootstrap and the overlap
baseline, on hand-made records (no model)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import instruct_zero_shot as Z  # noqa: E402

from lmlab.tasks.instruct_mixture import SPECS  # noqa: E402
from lmlab.tasks.metrics import roc_auc  # noqa: E402


def record(task, template, label, text="a b c\na b d"):
    words = SPECS[task].answer_words(template)
    return {"task": task, "template": template, "label": label, "input": text,
            "output": words[label], "options": sorted(set(words.values()))}


def test_positive_word_follows_each_template():
    assert Z.positive_word(record("mrpc", 0, "0")) == "yes"
    assert Z.positive_word(record("mrpc", 4, "0")) == "paraphrase"
    assert Z.positive_word(record("rte", 1, "not_entailment")) == "true"      # rte: entailment is positive
    assert Z.positive_word(record("stsb", 3, "1")) == "same"


def test_margin_is_positive_minus_negative_word_and_auc_is_the_mean_over_templates():
    recs = [record("mrpc", t, lab) for t in (0, 4) for lab in ("1", "0", "1", "0")]
    scores = [{"yes": -1.0, "no": -3.0}, {"yes": -2.0, "no": -1.0}, {"yes": -4.0, "no": -5.0},
              {"yes": -1.0, "no": -0.5},
              {"paraphrase": -2.0, "different": -1.0}, {"paraphrase": -1.0, "different": -2.0},
              {"paraphrase": -3.0, "different": -3.0}, {"paraphrase": -3.0, "different": -3.0}]
    m = Z.margins(recs, scores)
    assert m == [2.0, -1.0, 1.0, -0.5, -1.0, 1.0, 0.0, 0.0]
    first = roc_auc(m[:4], [True, False, True, False])          # 1.0: both positives above
    second = roc_auc(m[4:], [True, False, True, False])         # pairs: 0, 0, 0, 0.5 of 4
    assert (first, second) == (1.0, 0.125)
    assert Z.template_auc(recs, m) == pytest.approx((first + second) / 2)
    res = Z.evaluate(recs, scores)["mrpc"]
    assert res["auc"] == pytest.approx(0.5625) and res["accuracy"] == pytest.approx(5 / 8)


def test_paired_bootstrap_brackets_the_change_and_is_zero_for_identical_models():
    recs = [record("mrpc", t, str(i % 2)) for t in range(5) for i in range(40)]
    before = [0.0 + (i % 7) * 0.1 for i in range(200)]                       # unrelated to the label
    after = [float(r["label"] == "1") + (i % 7) * 0.1 for i, r in enumerate(recs)]   # separates them
    lo, hi = Z.paired_bootstrap(recs, before, after, reps=200)
    change = Z.template_auc(recs, after) - Z.template_auc(recs, before)
    assert lo <= change <= hi and lo > 0.2
    assert Z.paired_bootstrap(recs, before, before, reps=50) == (0.0, 0.0)


def test_overlap_is_the_jaccard_of_the_two_lines_words():
    assert Z.overlap(record("mrpc", 0, "1", "The cat sat\nthe cat ran")) == pytest.approx(2 / 4)
