"""Metrics against hand-computed golden cases and reference implementations (scipy, the SQuAD
script's logic as shipped in transformers, conlleval's span rules)."""

from __future__ import annotations

import json
import math
import random

import pytest
from scipy import stats

from lmlab.tasks import metrics as M


def test_accuracy_and_f1_golden():
    assert M.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    # tp=2 fp=1 fn=1 -> 2*2 / (2*2 + 1 + 1)
    assert M.binary_f1([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(4 / 6)
    assert M.binary_f1(["a", "b"], ["b", "b"], positive="b") == pytest.approx(2 / 3)
    assert M.binary_f1([0, 0], [0, 0]) == 0.0  # no positives anywhere


def test_matthews_golden_and_against_pearson_of_binary_vectors():
    # TP=2 TN=1 FP=1 FN=1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6
    assert M.matthews_corrcoef([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(1 / 6)
    # sklearn's documented example
    assert M.matthews_corrcoef([1, -1, 1, 1], [1, 1, 1, -1]) == pytest.approx(-1 / 3)
    # three classes, by hand: c=3, s=6, all class counts 2 -> (18-12)/sqrt(24*24)
    assert M.matthews_corrcoef([0, 1, 1, 2, 2, 0], [0, 0, 1, 1, 2, 2]) == pytest.approx(0.25)
    assert M.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0  # constant prediction: undefined -> 0
    rng = random.Random(0)
    for _ in range(20):  # binary MCC equals the Pearson correlation of the 0/1 vectors (phi coefficient)
        y = [rng.randint(0, 1) for _ in range(50)]
        p = [v if rng.random() < 0.7 else 1 - v for v in y]
        assert M.matthews_corrcoef(p, y) == pytest.approx(stats.pearsonr(p, y)[0], abs=1e-12)


def test_pearson_spearman_match_scipy_with_ties():
    rng = random.Random(1)
    for _ in range(20):
        x = [rng.choice([0.0, 0.5, 1.0, 2.0, 3.5]) for _ in range(40)]   # many ties
        y = [v + rng.gauss(0, 1) for v in x]
        assert M.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
        assert M.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
    assert M.rank([5, 1, 5]) == [2.5, 1.0, 2.5]
    assert M.pearson([1, 1, 1], [1, 2, 3]) == 0.0


SQUAD_CASES = [  # (prediction, truth, exact, f1) worked by hand
    ("The Cat", "cat", 1.0, 1.0),
    ("the cat sat", "a cat sat on the mat", 0.0, 2 * 1 * 0.5 / 1.5),
    ("Denver Broncos!", "denver  broncos", 1.0, 1.0),
    ("an apple", "Apple.", 1.0, 1.0),
    ("theory", "the", 0.0, 0.0),   # articles removed only as whole words
]


@pytest.mark.parametrize("pred,truth,em,f1", SQUAD_CASES)
def test_squad_em_f1_golden(pred, truth, em, f1):
    assert M.squad_exact(pred, truth) == em
    assert M.squad_f1(pred, truth) == pytest.approx(f1)


def test_squad_normalisation_order():
    assert M.squad_normalize("  The  Cat, a dog!  ") == "cat dog"
    assert M.squad_normalize("A.B. the") == "ab"   # punctuation first, then the articles


def test_squad_matches_the_official_logic_on_real_answers(data_dir):
    """torchmetrics implements the official v1.1 evaluation (normalisation, exact match, bag-of-
    tokens F1, best over the reference answers); compare on real SQuAD answers, perturbed."""
    from torchmetrics.functional.text import squad as squad_ref

    def reference(prediction: str, answers: list[str]) -> dict[str, float]:
        out = squad_ref([{"prediction_text": prediction, "id": "q"}],
                        [{"answers": {"answer_start": [0] * len(answers), "text": answers}, "id": "q"}])
        return {k: float(v) / 100 for k, v in out.items()}

    doc = json.loads((data_dir / "squad" / "squad_v1.1_dev_partA.json").read_text(encoding="utf-8"))
    rng = random.Random(0)
    refs = [[a["text"] for a in qa["answers"]] for art in doc["data"][:3] for p in art["paragraphs"]
            for qa in p["qas"]][:300]
    preds = []
    for r in refs:
        words = r[0].split()
        cut = rng.randint(0, len(words))
        preds.append(" ".join(["The"] + words[:cut] + (["extra"] if rng.random() < 0.5 else [])))
    for p, rs in zip(preds, refs):
        theirs = reference(p, rs)
        assert max(M.squad_exact(p, t) for t in rs) == theirs["exact_match"]
        assert max(M.squad_f1(p, t) for t in rs) == pytest.approx(theirs["f1"], abs=1e-5)
    scores = M.squad_scores(preds, refs)
    together = squad_ref([{"prediction_text": p, "id": str(i)} for i, p in enumerate(preds)],
                         [{"answers": {"answer_start": [0] * len(rs), "text": rs}, "id": str(i)}
                          for i, rs in enumerate(refs)])
    assert scores["exact_match"] == pytest.approx(float(together["exact_match"]) / 100, abs=1e-5)
    assert scores["f1"] == pytest.approx(float(together["f1"]) / 100, abs=1e-5)
    assert 0 < scores["exact_match"] < scores["f1"] < 1


def test_iob_spans_like_conlleval():
    assert M.iob_spans(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 2), ("LOC", 3, 4)}
    assert M.iob_spans(["B-PER", "B-PER"]) == {("PER", 0, 1), ("PER", 1, 2)}
    # IOB1 / ill-formed: an I- after O or after another type starts an entity
    got = M.iob_spans(["I-PER", "I-PER", "I-LOC", "O", "I-ORG"])
    assert got == {("PER", 0, 2), ("LOC", 2, 3), ("ORG", 4, 5)}
    assert M.iob_spans(["O", "O"]) == set()


def test_entity_prf_golden():
    pred = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG"]]
    true = [["B-PER", "O", "O", "B-LOC"], ["B-ORG"]]
    # predicted {PER 0-2, LOC, ORG}, true {PER 0-1, LOC, ORG}: 2 of 3 either way
    r = M.entity_prf(pred, true)
    assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(2 / 3)
    assert r["f1"] == pytest.approx(2 / 3)
    assert M.entity_prf([["O"]], [["B-PER"]]) == {"precision": 0.0, "recall": 1 * 0.0, "f1": 0.0}


def test_rouge_golden():
    pred, ref = "the cat was found under the bed", "the cat was under the bed"
    # unigrams: 6 of 7 predicted match, all 6 reference ones -> F = 12/13
    assert M.rouge_n(pred, ref, 1) == pytest.approx(12 / 13)
    # bigrams: 4 matches of 6 predicted / 5 reference -> F = 2*(4/6)(4/5)/((4/6)+(4/5)) = 8/11
    assert M.rouge_n(pred, ref, 2) == pytest.approx(8 / 11)
    assert M.lcs_length(pred.split(), ref.split()) == 6
    assert M.rouge_l(pred, ref) == pytest.approx(12 / 13)
    assert M.rouge_l("A-B c", "a b C") == 1.0   # lower-cased, punctuation separates
    assert M.rouge_n("", "x", 1) == 0.0
    s = M.rouge_scores([pred, "x y"], [ref, "z"])
    assert s["rouge1"] == pytest.approx((12 / 13 + 0) / 2)


def test_corpus_bleu_golden():
    assert M.corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(1.0)
    # all n-gram precisions 1, c=4 < r=6: BP = exp(1 - 6/4)
    assert M.corpus_bleu(["the cat sat on"], ["the cat sat on the mat"]) == pytest.approx(math.exp(-0.5))
    # no bigram match: mteval's smoothing, 1/(2^k * predicted n-grams) for the k-th order without one
    smoothed = (1 / 4 * 1 / 6 * 1 / 8 * 1 / 8) ** 0.25
    assert M.corpus_bleu(["the the the the"], ["the cat"]) == pytest.approx(smoothed)
    assert M.corpus_bleu(["the"], ["the cat"]) == 0.0  # no 2-gram predicted at all
    # corpus level: matches summed before dividing: p1=8/9 p2=5/7 p3=2/5 p4=1/3, c=r=9
    got = M.corpus_bleu(["a b c d", "a b x d e"], ["a b c d", "a b c d e"])
    assert got == pytest.approx((8 / 9 * 5 / 7 * 2 / 5 * 1 / 3) ** 0.25)
    assert M.bleu_tokens("Hello, world!") == ["Hello", ",", "world", "!"]


def test_roc_auc_matches_the_mann_whitney_statistic_with_ties_and_ignores_shifts():
    # by hand: positives {0.9, 0.4}, negatives {0.4, 0.1}: pairs 1 + 1 + 0.5 (tie) + 1 of 4
    assert M.roc_auc([0.9, 0.4, 0.4, 0.1], [True, True, False, False]) == pytest.approx(3.5 / 4)
    rng = random.Random(3)
    for _ in range(20):
        y = [rng.random() < 0.4 for _ in range(60)]
        s = [round(rng.gauss(1.0 if v else 0.0, 1.0), 1) for v in y]       # rounded: many ties
        u = stats.mannwhitneyu([a for a, v in zip(s, y) if v], [a for a, v in zip(s, y) if not v]).statistic
        auc = M.roc_auc(s, y)
        assert auc == pytest.approx(u / (sum(y) * (len(y) - sum(y))), abs=1e-12)
        assert M.roc_auc([a - 7.5 for a in s], y) == pytest.approx(auc)    # a constant bias changes nothing
        assert M.roc_auc([-a for a in s], y) == pytest.approx(1 - auc)
    with pytest.raises(M.LmlabError, match="positive and negative"):
        M.roc_auc([0.1, 0.2], [True, True])
