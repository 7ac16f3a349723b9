"""The shared merge learner: golden case, and equality with a naive recount-everything learner."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmlab.errors import LmlabError
from lmlab.tokenizers.merge_trainer import learn_merges

LECTURE = "low low low low lowest lowest newer newer newer newer newer newer wider wider wider new new"
GOLDEN = [("e", "r"), ("er", "_"), ("n", "e"), ("ne", "w"), ("l", "o"), ("lo", "w"), ("new", "er_"),
          ("low", "_")]


def words_of(text: str) -> dict[tuple[str, ...], int]:
    return {(*w, "_"): n for w, n in Counter(text.split()).items()}


def wordpiece_join(a: str, b: str) -> str:
    return a + (b[2:] if b.startswith("##") else b)


def naive_merges(word_counts, num_merges, score="frequency", join=lambda a, b: a + b, min_count=1):
    """Recount every pair of the whole corpus before each merge (the lecture's algorithm, slowly).

    Ties: (ratio and gain: higher count, then) first occurrence = smallest (word index, position in
    initial symbols).
    """
    words = [list(w) for w in word_counts]
    counts = list(word_counts.values())
    units = {s: 1 for w in words for s in w}
    merges = []
    for _ in range(num_merges):
        pair_count: dict = {}
        first: dict = {}
        sym_count: Counter = Counter()
        for wi, (word, n) in enumerate(zip(words, counts)):
            pos = 0
            for s in word:
                sym_count[s] += n
            for i in range(len(word) - 1):
                p = (word[i], word[i + 1])
                pair_count[p] = pair_count.get(p, 0) + n
                first.setdefault(p, (wi, pos))
                pos += units[word[i]]
        live = [p for p, c in pair_count.items() if c >= min_count]
        if not live:
            break
        if score == "frequency":
            best = min(live, key=lambda p: (-pair_count[p], first[p]))
        elif score == "ratio":
            best = min(live, key=lambda p: (-pair_count[p] / (sym_count[p[0]] * sym_count[p[1]]),
                                            -pair_count[p], first[p]))
        else:
            total = sum(sym_count.values())
            best = min(live, key=lambda p: (-naive_gain(pair_count[p], sym_count[p[0]], sym_count[p[1]],
                                                        total, p[0] == p[1]), -pair_count[p], first[p]))
        merges.append(best)
        a, b = best
        new = join(a, b)
        units.setdefault(new, units[a] + units[b])
        for word in words:
            i = 0
            while i < len(word) - 1:
                if word[i] == a and word[i + 1] == b:
                    word[i:i + 2] = [new]
                i += 1
    return merges


def xlogx(x):
    return x * math.log(x) if x > 0 else 0.0


def naive_gain(c, na, nb, total, same):
    """Log-likelihood change sum n log n - N log N when c pairs (a, b) become a new symbol."""
    if same:
        parts = xlogx(max(na - 2 * c, 0)) - xlogx(na)
    else:
        parts = (xlogx(na - c) - xlogx(na)) + (xlogx(nb - c) - xlogx(nb))
    return xlogx(c) + (xlogx(total) - xlogx(total - c)) + parts


def log_likelihood(counts):
    """Corpus log-likelihood under the maximum-likelihood unigram model of its symbol counts."""
    total = sum(counts.values())
    return sum(n * math.log(n / total) for n in counts.values() if n)


def random_corpus(rng: random.Random, n_words: int, alphabet: str) -> dict[tuple[str, ...], int]:
    text = " ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(n_words))
    return words_of(text)


def test_lecture_golden_merges():
    assert learn_merges(words_of(LECTURE), 8) == GOLDEN


def test_golden_continues_like_the_naive_learner():
    wc = words_of(LECTURE)
    assert learn_merges(wc, 100) == naive_merges(wc, 100)
    assert len(learn_merges(wc, 100)) == 16  # every word became one symbol; no pair is left


@pytest.mark.parametrize("seed", range(6))
def test_frequency_matches_naive_recount(seed):
    rng = random.Random(seed)
    wc = random_corpus(rng, 300, "aabbcde" if seed % 2 else "ab")  # tiny alphabets: many ties, repeats
    assert learn_merges(wc, 60) == naive_merges(wc, 60)


@pytest.mark.parametrize("score", ["ratio", "gain"])
@pytest.mark.parametrize("seed", range(4))
def test_likelihood_scores_match_naive_recount(seed, score):
    rng = random.Random(100 + seed)
    text = " ".join("".join(rng.choice("aabbcdde") for _ in range(rng.randint(1, 6))) for _ in range(250))
    # WordPiece-style symbols: first character plain, the rest with the ## continuation prefix
    wc = {(w[0], *("##" + c for c in w[1:])): n for w, n in Counter(text.split()).items()}
    got = learn_merges(wc, 40, score=score, join=wordpiece_join)
    assert got == naive_merges(wc, 40, score=score, join=wordpiece_join)
    assert any(b.startswith("##") for _, b in got)


@pytest.mark.parametrize("score", ["ratio", "gain"])
def test_heap_compaction_keeps_the_result(monkeypatch, score):
    from lmlab.tokenizers import merge_trainer

    wc = random_corpus(random.Random(7), 400, "aabbcdeef")
    expected = learn_merges(wc, 80, score=score)
    monkeypatch.setattr(merge_trainer._MergeLearner, "heap_slack", 0)  # compact after nearly every merge
    assert learn_merges(wc, 80, score=score) == expected == naive_merges(wc, 80, score=score)


def test_parked_rare_pairs_do_not_change_the_result(monkeypatch):
    """Gain: rare pairs are not re-scored when their symbols' counts fall (see _unpark); the merges
    equal both the naive recount and a run that re-scores every pair."""
    from lmlab.tokenizers import merge_trainer

    rng = random.Random(11)  # a few hundred word types drawn with Zipf-like frequencies: big gains
    letters = "aabcdeeefghiklmnoprstu"
    types = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 8))) for _ in range(300)]
    wc = words_of(" ".join(rng.choices(types, weights=[1 / (r + 1) for r in range(300)], k=6000)))
    levels = []
    unpark = merge_trainer._MergeLearner._unpark

    def recording(self, best):
        out = unpark(self, best)
        levels.append(self.parked)
        return out

    monkeypatch.setattr(merge_trainer._MergeLearner, "_unpark", recording)
    parked = learn_merges(wc, 120, score="gain")
    assert max(levels) > 1 and len(set(levels)) > 2  # parking was used and lowered
    assert parked == naive_merges(wc, 120, score="gain")
    monkeypatch.setattr(merge_trainer._MergeLearner, "_unpark", lambda self, best: -math.inf)
    assert learn_merges(wc, 120, score="gain") == parked


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="abc", min_size=1, max_size=6), min_size=1, max_size=40))
def test_gain_property_equals_naive(word_list):
    wc = {(*w, "_"): n for w, n in Counter(word_list).items()}
    assert learn_merges(wc, 30, score="gain") == naive_merges(wc, 30, score="gain")


def test_gain_parking_bound_holds_when_a_pair_fills_half_the_corpus():
    """Runs ``a a a`` make ``(a, a)`` occur 10 times among 16 symbols; the parking bound
    ``f(N) - f(N - c) - f(c)`` falls again past ``c = N / 2``, and taken at c = 10 it let a parked pair
    with a higher gain wait (the third merge was ``aaaa + a`` instead of ``aa + _``)."""
    wc = {(*w, "_"): n for w, n in Counter(["aa", "aaaaa", "aaaaaa"]).items()}
    merges = learn_merges(wc, 30, score="gain")
    assert merges == naive_merges(wc, 30, score="gain")
    assert merges[2] == ("aa", "_")


def test_gain_is_the_log_likelihood_change():
    # 40 x "th", 100 x "t", 2 x "qu": the ratio score prefers the rare pair (2/(2*2) > 40/(140*40)),
    # the likelihood gain the frequent one; both gains are checked against the corpus likelihood
    # recomputed from scratch before and after the merge.
    wc = {("t", "h"): 40, ("t",): 100, ("q", "u"): 2}
    before = {"t": 140, "h": 40, "q": 2, "u": 2}
    after_th = log_likelihood({"t": 100, "th": 40, "q": 2, "u": 2}) - log_likelihood(before)
    after_qu = log_likelihood({"t": 140, "h": 40, "qu": 2}) - log_likelihood(before)
    assert math.isclose(naive_gain(40, 140, 40, 184, False), after_th)
    assert math.isclose(naive_gain(2, 2, 2, 184, False), after_qu)
    assert after_th > after_qu
    assert learn_merges(wc, 1, score="gain") == [("t", "h")]
    assert learn_merges(wc, 1, score="ratio") == [("q", "u")]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="abc", min_size=1, max_size=6), min_size=1, max_size=40),
       st.integers(1, 3))
def test_property_equals_naive(word_list, min_count):
    wc = {(*w, "_"): n for w, n in Counter(word_list).items()}
    assert learn_merges(wc, 30, min_count=min_count) == naive_merges(wc, 30, min_count=min_count)


def test_min_count_stops_early():
    wc = words_of(LECTURE)
    merges = learn_merges(wc, 100, min_count=5)
    assert merges == GOLDEN[:7]  # (low, _) occurs 4 times only


def test_max_new_symbols_counts_distinct_strings():
    # "abc" arises from a+bc in one word and ab+c in another; "bc" is already an initial symbol
    wc = {("a", "b", "y"): 5, ("a", "b", "c"): 2, ("b", "c"): 4, ("a", "bc"): 3}
    merges = learn_merges(wc, 10)
    assert merges == naive_merges(wc, 10)
    assert merges == [("a", "b"), ("ab", "y"), ("b", "c"), ("a", "bc"), ("ab", "c")]
    # new strings: ab, aby, (bc already is a symbol), abc, (abc again)
    assert learn_merges(wc, 10, max_new_symbols=2) == merges[:2]
    assert learn_merges(wc, 10, max_new_symbols=3) == merges[:4]


@pytest.mark.parametrize("score", ["frequency", "ratio", "gain"])
def test_merges_a_symbol_with_itself(score):
    wc = {tuple("aaaa"): 1, tuple("aaa"): 2, tuple("ab"): 3}
    assert learn_merges(wc, 4, score=score) == naive_merges(wc, 4, score=score)


def test_bad_arguments():
    with pytest.raises(LmlabError, match="score"):
        learn_merges(words_of(LECTURE), 3, score="entropy")
    with pytest.raises(LmlabError, match=">= 0"):
        learn_merges(words_of(LECTURE), -1)
    assert learn_merges({}, 5) == []
    assert learn_merges(words_of(LECTURE), 0) == []


def test_progress_bar_does_not_change_result(capsys):
    assert learn_merges(words_of(LECTURE), 8, progress=True) == GOLDEN


def test_progress_without_a_terminal_is_lines_not_a_bar(capsys):
    """stderr that is no terminal (a log file, lmlab demo 2>log) gets the one policy's lines, not a
    bar's carriage returns (lmlab.progress.Progress)."""
    learn_merges(words_of(LECTURE), 8, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and "merge 4/8: about" in err, err


@pytest.mark.parametrize("algo", ["bpe", "bytelevel"])
def test_real_text_slice_matches_naive(shakespeare, algo):
    """The corpus the trainers build from real text (counted through their own pre-tokenizers):
    word types with Zipf-like counts, shared prefixes and suffixes, many ties on small counts."""
    from lmlab.tokenizers.counting import count_chunks, refine_counts
    from lmlab.tokenizers.pretokenize import gpt2_pieces, gpt2_split, to_byte_symbols, whitespace_split

    lines = shakespeare[:6000].splitlines()
    if algo == "bpe":
        wc = {(*w, "_"): n for w, n in count_chunks(lines, whitespace_split).items()}
    else:
        counts = refine_counts(count_chunks(lines, gpt2_pieces), gpt2_split)
        wc = {tuple(to_byte_symbols(c)): n for c, n in counts.items()}
    merges = learn_merges(wc, 150)
    assert len(merges) == 150 and merges == naive_merges(wc, 150)


def test_collector_paused_while_learning_and_restored(monkeypatch):
    import gc

    from lmlab.tokenizers import merge_trainer

    seen = []
    run = merge_trainer._MergeLearner.run
    monkeypatch.setattr(merge_trainer._MergeLearner, "run",
                        lambda self, *a: seen.append(gc.isenabled()) or run(self, *a))
    assert gc.isenabled()
    learn_merges(words_of(LECTURE), 3)
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:  # a caller's own pause is kept
        learn_merges(words_of(LECTURE), 3)
        assert not gc.isenabled()
    finally:
        gc.enable()
