"""The generation and NER metrics give the numbers of the libraries people publish with:
sacreBLEU (BLEU), rouge-score (ROUGE-1/2/L/Lsum, no stemming) and seqeval (entity P/R/F1), on
real text with realistic errors."""

from __future__ import annotations

import gzip
import random

import pytest
from rouge_score import rouge_scorer
from sacrebleu import corpus_bleu as sacre_bleu
from seqeval.metrics import f1_score, precision_score, recall_score

from lmlab.tasks import metrics as M


def _corrupt(sentence: str, rng: random.Random, vocab: list[str]) -> str:
    """A system-like output: words dropped, replaced, repeated or swapped, punctuation kept."""
    words = sentence.split()
    out = []
    for w in words:
        r = rng.random()
        if r < 0.1:
            continue
        if r < 0.2:
            out.append(rng.choice(vocab))
        elif r < 0.25:
            out += [w, w]
        else:
            out.append(w)
    if len(out) > 3 and rng.random() < 0.3:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return " ".join(out)


@pytest.fixture(scope="module")
def references(data_dir) -> list[str]:
    with gzip.open(data_dir / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f][:400]


def test_bleu_equals_sacrebleu(references):
    rng = random.Random(0)
    vocab = sorted({w for s in references for w in s.split()})
    predictions = [_corrupt(s, rng, vocab) for s in references]
    ours = M.corpus_bleu(predictions, references)
    assert 0.3 < ours < 0.9
    assert ours == pytest.approx(sacre_bleu(predictions, [references]).score / 100, rel=1e-9)
    # short corpora without a 4-gram match (smoothing), with a brevity penalty, with nothing in common
    for preds, refs in ((["A dog runs ."], ["A dog is running on the grass ."]), (["a b c d"], ["w x y z"]),
                        (["Two men , one woman"], ["Two men and one woman ."]),
                        (predictions[:3], references[:3])):
        assert M.corpus_bleu(preds, refs) == pytest.approx(sacre_bleu(preds, [refs]).score / 100, rel=1e-9)


@pytest.mark.parametrize("stem", [False, True])
def test_rouge_equals_rouge_score(references, stem):
    rng = random.Random(1)
    vocab = sorted({w for s in references for w in s.split()})
    # three-sentence "summaries", one sentence per line, for ROUGE-Lsum
    refs = ["\n".join(references[i:i + 3]) for i in range(0, 300, 3)]
    preds = ["\n".join(_corrupt(s, rng, vocab) for s in r.split("\n")[::-1]) for r in refs]
    if stem:  # inflect some words, which only stemming matches again
        preds = [" ".join(w + "s" if len(w) > 4 and rng.random() < 0.3 else w for w in p.split(" "))
                 for p in preds]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=stem)
    theirs = {k: 0.0 for k in ("rouge1", "rouge2", "rougeL", "rougeLsum")}
    for p, r in zip(preds, refs):
        for k, score in scorer.score(r, p).items():
            theirs[k] += score.fmeasure / len(refs)
    ours = M.rouge_scores(preds, refs, stem=stem)
    assert ours.keys() == theirs.keys()
    for k in theirs:
        assert ours[k] == pytest.approx(theirs[k], rel=1e-9), k
    assert ours["rougeLsum"] > ours["rougeL"]  # sentences reordered: only the summary-level LCS sees it
    if stem:
        assert M.rouge_scores(preds, refs)["rouge1"] < ours["rouge1"] - 0.01  # stemming matters here


def test_entity_scores_equal_seqeval(data_dir):
    sentences, tags = [], []
    for line in (data_dir / "conll2003" / "valid.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("-DOCSTART-"):
            if tags:
                sentences.append(tags)
                tags = []
            continue
        tags.append(line.split()[-1])
    true = sentences[:1500]
    rng = random.Random(2)
    kinds = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    pred = [[rng.choice(kinds) if rng.random() < 0.08 else t for t in s] for s in true]
    ours = M.entity_prf(pred, true)
    assert 0.5 < ours["f1"] < 0.95
    assert ours["precision"] == pytest.approx(precision_score(true, pred), rel=1e-12)
    assert ours["recall"] == pytest.approx(recall_score(true, pred), rel=1e-12)
    assert ours["f1"] == pytest.approx(f1_score(true, pred), rel=1e-12)
