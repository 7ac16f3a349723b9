"""Evaluation metrics of the fine-tuning tasks, written out so each formula can be read.

All scores are fractions in [0, 1] (SQuAD's official script prints EM/F1 x 100; we do not).

* Classification (GLUE; Wang et al. 2019): :func:`accuracy`, :func:`binary_f1` (F1 of the
  positive class, as GLUE reports for MRPC), :func:`matthews_corrcoef` (CoLA).
* Regression (STS-B): :func:`pearson`, :func:`spearman` (Pearson of average ranks, ties shared).
* Extractive QA (SQuAD v1.1; Rajpurkar et al. 2016): :func:`squad_normalize`, :func:`squad_exact`,
  :func:`squad_f1` behave as the official ``evaluate-v1.1.py``: lower-case, drop punctuation,
  drop the articles a/an/the, collapse whitespace; F1 over the bag of normalised tokens; each
  prediction is scored against every reference answer and the best score counts.
* NER (CoNLL-2003; Tjong Kim Sang & De Meulder 2003): :func:`iob_spans` reads entity spans the
  way ``conlleval`` does and :func:`entity_prf` scores exact span+type matches.
* Generation: :func:`rouge_n`, :func:`rouge_l`, :func:`rouge_lsum` (Lin 2004; F-measure per
  example, averaged; equal to ``rouge-score`` without stemming) and :func:`corpus_bleu`
  (Papineni et al. 2002, as sacreBLEU computes it by default: 13a tokens, clipped n-gram
  precisions up to 4-grams, exp smoothing, brevity penalty, over the whole corpus; equal to
  ``sacrebleu.corpus_bleu(...).score / 100``). Entity F1 equals ``seqeval``'s default mode.
"""

from __future__ import annotations

import functools
import math
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

from lmlab.errors import LmlabError

# --------------------------------------------------------------------------- classification


def accuracy(preds: Sequence, labels: Sequence) -> float:
    """Share of predictions equal to the label."""
    _same_length(preds, labels)
    return sum(p == y for p, y in zip(preds, labels)) / len(labels) if labels else 0.0


def binary_f1(preds: Sequence, labels: Sequence, positive=1) -> float:
    """F1 of the ``positive`` class: ``2·TP / (2·TP + FP + FN)`` (0 when there is no positive at all)."""
    _same_length(preds, labels)
    tp = sum(p == positive and y == positive for p, y in zip(preds, labels))
    fp = sum(p == positive and y != positive for p, y in zip(preds, labels))
    fn = sum(p != positive and y == positive for p, y in zip(preds, labels))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def matthews_corrcoef(preds: Sequence, labels: Sequence) -> float:
    """Matthews correlation (Matthews 1975; Gorodkin's multi-class form), 0 when undefined.

    From the confusion matrix C (rows = truth): with s = total, c = correct, p_k = predicted
    count of class k, t_k = true count of class k::

        MCC = (c·s - Σ p_k t_k) / sqrt((s² - Σ p_k²) (s² - Σ t_k²))

    For two classes this is ``(TP·TN - FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))``.
    """
    _same_length(preds, labels)
    s = len(labels)
    c = sum(p == y for p, y in zip(preds, labels))
    pc, tc = Counter(preds), Counter(labels)
    classes = set(pc) | set(tc)
    cov_pt = c * s - sum(pc[k] * tc[k] for k in classes)
    cov_pp = s * s - sum(v * v for v in pc.values())
    cov_tt = s * s - sum(v * v for v in tc.values())
    if cov_pp == 0 or cov_tt == 0:
        return 0.0
    return cov_pt / math.sqrt(cov_pp * cov_tt)


# --------------------------------------------------------------------------- regression


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation ``cov(x, y) / (σx σy)``; 0 when either side is constant."""
    _same_length(x, y)
    n = len(x)
    if n < 2:
        return 0.0
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return 0.0
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def rank(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the mean of the ranks they span (``[5, 1, 5] -> [2.5, 1, 2.5]``)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson correlation of the (average) ranks."""
    _same_length(x, y)
    return pearson(rank(x), rank(y))


def roc_auc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """Area under the ROC curve: the chance that a random positive example scores above a random
    negative one (ties count half), via the Mann-Whitney rank sum. Threshold-free, so a score that
    only shifts every example (a bias towards one answer word) leaves it unchanged."""
    _same_length(scores, positive)
    n_pos = sum(bool(p) for p in positive)
    n_neg = len(positive) - n_pos
    if not n_pos or not n_neg:
        raise LmlabError("ROC AUC needs positive and negative examples", "evaluate on both classes")
    rank_sum = sum(r for r, p in zip(rank(scores), positive) if p)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


# --------------------------------------------------------------------------- SQuAD

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def squad_normalize(text: str) -> str:
    """The official SQuAD v1.1 answer normalisation, in its order: lower-case, remove
    punctuation, remove articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def squad_exact(prediction: str, truth: str) -> float:
    return float(squad_normalize(prediction) == squad_normalize(truth))


def squad_f1(prediction: str, truth: str) -> float:
    """Token-level F1 between normalised prediction and reference (bag of tokens)."""
    p, t = squad_normalize(prediction).split(), squad_normalize(truth).split()
    common = Counter(p) & Counter(t)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(t)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean exact match and F1, each the max over an example's reference answers."""
    _same_length(predictions, references)
    if not predictions:
        return {"exact_match": 0.0, "f1": 0.0}
    em = sum(max(squad_exact(p, t) for t in refs) for p, refs in zip(predictions, references))
    f1 = sum(max(squad_f1(p, t) for t in refs) for p, refs in zip(predictions, references))
    n = len(predictions)
    return {"exact_match": em / n, "f1": f1 / n}


# --------------------------------------------------------------------------- NER


def iob_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """Entity spans ``(type, start, end_exclusive)`` of a tag sequence, read as ``conlleval`` does.

    An entity starts at ``B-X``, or at ``I-X`` when the previous tag is not of type X (so IOB1
    files and ill-formed IOB2 sequences are read the same way as by the CoNLL script); it ends
    before ``O``, ``B-*`` or a tag of another type. ``E-``/``S-`` (IOBES) are read as ``I-``/``B-``
    followed by an end.
    """
    spans = set()
    start, kind = None, None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, typ = tag.partition("-")
        if tag == "O" or not typ:
            prefix, typ = "O", None
        begins = prefix in ("B", "S") or (prefix in ("I", "E") and typ != kind)
        if kind is not None and (prefix == "O" or begins):
            spans.add((kind, start, i))
            start, kind = None, None
        if prefix != "O" and begins:
            start, kind = i, typ
        if prefix in ("E", "S") and kind is not None:
            spans.add((kind, start, i + 1))
            start, kind = None, None
    return spans


def entity_prf(pred_tags: Sequence[Sequence[str]], true_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level micro precision, recall and F1: a predicted entity counts only when its type,
    start and end all match a reference entity (CoNLL-2003 evaluation)."""
    _same_length(pred_tags, true_tags)
    tp = n_pred = n_true = 0
    for p, t in zip(pred_tags, true_tags):
        ps, ts = iob_spans(p), iob_spans(t)
        tp += len(ps & ts)
        n_pred += len(ps)
        n_true += len(ts)
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_true if n_true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


# --------------------------------------------------------------------------- generation


def rouge_tokens(text: str, stem: Callable[[str], str] | None = None) -> list[str]:
    """ROUGE tokenisation (as the ``rouge-score`` package): lower-case, every run of characters
    other than a-z/0-9 is a separator; with ``stem`` (:func:`porter_stemmer`), words longer than
    three characters are stemmed, so "models" and "model" match."""
    tokens = re.sub(r"[^a-z0-9]+", " ", text.lower()).split()
    return tokens if stem is None else [stem(t) if len(t) > 3 else t for t in tokens]


def porter_stemmer() -> Callable[[str], str]:
    """The Porter stemmer the published ROUGE numbers use (NLTK's, as ``rouge-score``'s
    ``use_stemmer=True``), memoised per word; needs the ``metrics`` extra (``nltk``)."""
    try:
        from nltk.stem import porter
    except ImportError:
        raise LmlabError("ROUGE with stemming needs the nltk package (the Porter stemmer)",
                         "pip install 'lmlab[metrics]'") from None
    return functools.lru_cache(maxsize=65536)(porter.PorterStemmer().stem)


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _f(overlap: float, n_pred: int, n_ref: int) -> float:
    if overlap == 0 or n_pred == 0 or n_ref == 0:
        return 0.0
    p, r = overlap / n_pred, overlap / n_ref
    return 2 * p * r / (p + r)


def rouge_n(prediction: str, reference: str, n: int, stem: Callable[[str], str] | None = None) -> float:
    """ROUGE-N F-measure: clipped n-gram overlap over prediction and reference n-gram counts."""
    p, r = _ngrams(rouge_tokens(prediction, stem), n), _ngrams(rouge_tokens(reference, stem), n)
    return _f(sum((p & r).values()), sum(p.values()), sum(r.values()))


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence (dynamic programming, O(len(a)·len(b)))."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(prediction: str, reference: str, stem: Callable[[str], str] | None = None) -> float:
    """ROUGE-L F-measure: LCS length over prediction and reference lengths."""
    p, r = rouge_tokens(prediction, stem), rouge_tokens(reference, stem)
    return _f(lcs_length(p, r), len(p), len(r))


def _lcs_positions(a: Sequence, b: Sequence) -> list[int]:
    """Indices into ``a`` of one longest common subsequence with ``b`` (walking back from the
    end, preferring to drop from ``a`` on ties, as ``rouge-score`` does)."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a, 1):
        for j, y in enumerate(b, 1):
            table[i][j] = table[i - 1][j - 1] + 1 if x == y else max(table[i - 1][j], table[i][j - 1])
    out, i, j = [], len(a), len(b)
    while i > 0 and j > 0:
        if a[i - 1] == b[j - 1]:
            out.append(i - 1)
            i, j = i - 1, j - 1
        elif table[i][j - 1] > table[i - 1][j]:
            j -= 1
        else:
            i -= 1
    return out[::-1]


def rouge_lsum(prediction: str, reference: str, stem: Callable[[str], str] | None = None) -> float:
    """ROUGE-Lsum F-measure (Lin 2004, summary-level LCS): prediction and reference are split into
    sentences at newlines; each reference sentence's LCS hits with all prediction sentences are
    united, and a token counts at most as often as it occurs on both sides."""
    ref = [t for t in (rouge_tokens(s, stem) for s in reference.split("\n")) if t]
    pred = [t for t in (rouge_tokens(s, stem) for s in prediction.split("\n")) if t]
    m, n = sum(map(len, ref)), sum(map(len, pred))
    if not m or not n:
        return 0.0
    left_ref, left_pred = Counter(t for s in ref for t in s), Counter(t for s in pred for t in s)
    hits = 0
    for sentence in ref:
        union = sorted(set().union(*(_lcs_positions(sentence, p) for p in pred)))
        for token in (sentence[k] for k in union):
            if left_ref[token] > 0 and left_pred[token] > 0:
                hits += 1
                left_ref[token] -= 1
                left_pred[token] -= 1
    return _f(hits, n, m)


def rouge_scores(predictions: Sequence[str], references: Sequence[str],
                 stem: bool = False) -> dict[str, float]:
    """Mean ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum F-measures, equal to ``rouge-score``'s
    ``RougeScorer(use_stemmer=stem)`` (tested both ways; published summarisation numbers usually
    stem)."""
    _same_length(predictions, references)
    n = len(predictions) or 1
    pairs = list(zip(predictions, references))
    s = porter_stemmer() if stem else None
    return {
        "rouge1": sum(rouge_n(p, r, 1, s) for p, r in pairs) / n,
        "rouge2": sum(rouge_n(p, r, 2, s) for p, r in pairs) / n,
        "rougeL": sum(rouge_l(p, r, s) for p, r in pairs) / n,
        "rougeLsum": sum(rouge_lsum(p, r, s) for p, r in pairs) / n,
    }


#: mteval-v13a's language-independent tokenisation (the WMT standard, sacreBLEU's default "13a"),
#: as the Perl script states it: punctuation and symbols split off; "." and "," split off unless
#: between digits; "-" split off after a digit
_13A = (
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
)
_ENTITIES = (("&quot;", '"'), ("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"))


def bleu_tokens(text: str) -> list[str]:
    """BLEU tokenisation ``13a`` (mteval-v13a; sacreBLEU's default), case kept."""
    line = text.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    for entity, char in _ENTITIES:
        line = line.replace(entity, char)
    line = f" {line} "
    for pattern, repl in _13A:
        line = pattern.sub(repl, line)
    return line.split()


def corpus_bleu(predictions: Sequence[str], references: Sequence[str], max_n: int = 4) -> float:
    """Corpus BLEU (Papineni et al. 2002) with one reference per sentence, as sacreBLEU computes
    it by default (``13a`` tokens, ``exp`` smoothing), on a 0-1 scale (sacreBLEU prints x 100).

    ``p_n`` = clipped n-gram matches / predicted n-grams, summed over the corpus for n = 1..4;
    ``BLEU = BP · exp(mean log p_n)`` with brevity penalty ``BP = exp(1 - r/c)`` when the total
    prediction length c is below the reference length r (else 1). An order with no match counts
    ``1 / (2^k · predicted n-grams)`` for the k-th such order (mteval's smoothing), so a short
    corpus with no 4-gram match does not score 0; an order with no predicted n-gram at all does.
    """
    _same_length(predictions, references)
    matches, totals = [0] * max_n, [0] * max_n
    c = r = 0
    for pred, ref in zip(predictions, references):
        p, t = bleu_tokens(pred), bleu_tokens(ref)
        c, r = c + len(p), r + len(t)
        for n in range(1, max_n + 1):
            pn, tn = _ngrams(p, n), _ngrams(t, n)
            matches[n - 1] += sum((pn & tn).values())
            totals[n - 1] += sum(pn.values())
    if c == 0 or min(totals) == 0 or not any(matches):  # nothing in common: 0, as sacreBLEU
        return 0.0
    log_p, halvings = 0.0, 0
    for m, t in zip(matches, totals):
        if m == 0:
            halvings += 1
            log_p += math.log(1.0 / (2**halvings * t))
        else:
            log_p += math.log(m / t)
    bp = 1.0 if c >= r else math.exp(1 - r / c)
    return bp * math.exp(log_p / max_n)


def _same_length(a: Sequence, b: Sequence) -> None:
    if len(a) != len(b):
        raise ValueError(f"{len(a)} predictions but {len(b)} references")
