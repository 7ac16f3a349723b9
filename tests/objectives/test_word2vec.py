"""Classic embeddings: word2vec pieces checked by hand, and neighbours that make sense on real text
for skip-gram, CBOW and PPMI-SVD (random vectors fail the same check)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmlab.embeddings import WordVectors, train_svd, train_word2vec, words
from lmlab.errors import LmlabError
from lmlab.objectives.word2vec import (
    cbow_loss,
    context_matrix,
    keep_probability,
    noise_distribution,
    skipgram_loss,
    skipgram_pairs,
    subsample,
)

#: query word -> words of which at least one should be among its 10 nearest neighbours
EXPECTED = {
    "thou": {
        "thee",
        "thy",
        "art",
        "hast",
        "dost",
        "wilt",
        "canst",
        "didst",
        "thyself",
        "wert",
        "shalt",
        "wouldst",
    },
    "father": {
        "mother",
        "son",
        "brother",
        "sister",
        "husband",
        "wife",
        "daughter",
        "uncle",
        "cousin",
        "heir",
    },
    "daughter": {
        "mother",
        "son",
        "sister",
        "wife",
        "husband",
        "father",
        "brother",
        "niece",
        "child",
        "widow",
    },
    "three": {
        "two",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "twenty",
        "thousand",
        "hundred",
        "twelve",
    },
    "he": {"she"},
    "king": {
        "queen",
        "prince",
        "duke",
        "henry",
        "richard",
        "edward",
        "ii",
        "iii",
        "iv",
        "vi",
        "lewis",
        "bolingbroke",
    },
}


def sensible(wv: WordVectors) -> int:
    """How many of the EXPECTED queries have an expected word among their 10 nearest neighbours."""
    return sum(bool({w for w, _ in wv.nearest(q, 10)} & want) for q, want in EXPECTED.items())


@pytest.fixture(scope="module")
def shakespeare_text(shakespeare) -> str:
    return shakespeare


def test_noise_and_subsampling_follow_word2vec():
    counts = np.array([1000, 100, 10, 1])
    p = noise_distribution(counts)
    np.testing.assert_allclose(p, counts**0.75 / (counts**0.75).sum())
    keep = keep_probability(counts, threshold=1e-2)
    f = counts / counts.sum()
    np.testing.assert_allclose(keep[0], (np.sqrt(f[0] / 1e-2) + 1) * 1e-2 / f[0])
    assert keep[-1] == 1.0 and keep[0] < keep[1] <= 1.0
    ids = np.repeat(np.arange(4), counts)
    rng = np.random.default_rng(0)
    kept = np.bincount(subsample(ids, keep, rng), minlength=4)
    assert abs(kept[0] / 1000 - keep[0]) < 0.05 and kept[3] == 1


def test_dynamic_window_contexts():
    ids = np.arange(100, 140)
    rng = np.random.default_rng(0)
    ctx = context_matrix(ids, 4, rng)
    assert ctx.shape == (40, 8)
    for i in range(40):
        left = [c for c in ctx[i, :4] if c >= 0]
        right = [c for c in ctx[i, 4:] if c >= 0]
        # contexts are the nearest words, contiguous around the centre, within the window
        assert left == list(ids[max(0, i - len(left)) : i]) and right == list(ids[i + 1 : i + 1 + len(right)])
        if 4 <= i < 36:
            assert len(left) == len(right) >= 1  # one sampled b for both sides
    sizes = [len([c for c in ctx[i, 4:] if c >= 0]) for i in range(4, 36)]
    assert set(sizes) == {1, 2, 3, 4}  # b ~ U{1..4}
    centres, contexts = skipgram_pairs(ids, 4, np.random.default_rng(0))
    assert len(centres) == (ctx >= 0).sum() and np.all(np.abs(centres - contexts) <= 4)


def test_negative_sampling_losses_by_hand():
    g = torch.Generator().manual_seed(0)
    w_in, w_out = torch.randn(2, 6, 3, generator=g)
    centres, contexts, negs = torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([[4, 5], [5, 0]])

    def logsig(x):
        return float(torch.nn.functional.logsigmoid(torch.tensor(x)))

    want = 0.0
    for c, o, ns in zip(centres.tolist(), contexts.tolist(), negs.tolist()):
        want -= logsig(float(w_in[c] @ w_out[o])) + sum(logsig(-float(w_in[c] @ w_out[n])) for n in ns)
    assert float(skipgram_loss(w_in, w_out, centres, contexts, negs)) == pytest.approx(want, rel=1e-5)
    ctx = torch.tensor([[0, 1, -1], [2, -1, -1]])
    h = torch.stack([(w_in[0] + w_in[1]) / 2, w_in[2]])
    want = 0.0
    for k, (o, ns) in enumerate(zip([4, 5], [[1, 2], [3, 4]])):
        want -= logsig(float(h[k] @ w_out[o])) + sum(logsig(-float(h[k] @ w_out[n])) for n in ns)
    got = cbow_loss(w_in, w_out, ctx, torch.tensor([4, 5]), torch.tensor([[1, 2], [3, 4]]))
    assert float(got) == pytest.approx(want, rel=1e-5)


def test_neighbours_make_sense_on_real_text(shakespeare_text, tmp_path):
    torch.manual_seed(0)
    svd = train_svd(shakespeare_text, dim=50, window=4)
    sg = train_word2vec(
        shakespeare_text, mode="skipgram", dim=50, window=3, epochs=3, batch_size=4096, lr=0.05
    )
    cbow = train_word2vec(shakespeare_text, mode="cbow", dim=50, window=5, epochs=5, lr=0.1)
    rand = WordVectors(sg.words, np.random.default_rng(0).normal(size=sg.vectors.shape))
    scores = {
        name: sensible(wv) for name, wv in (("svd", svd), ("skipgram", sg), ("cbow", cbow), ("random", rand))
    }
    assert scores["svd"] >= 5 and scores["skipgram"] >= 5 and scores["cbow"] >= 4, scores
    assert scores["random"] <= 1, scores
    assert svd.nearest("he", 3)[0][0] == "she" or "she" in {w for w, _ in sg.nearest("he", 3)}
    # save / load round trip keeps the neighbours
    sg.save(tmp_path / "sg")
    again = WordVectors.load(tmp_path / "sg")
    assert again.nearest("thou", 5) == sg.nearest("thou", 5)


def test_bad_input_is_a_clear_error(shakespeare_text):
    wv = WordVectors(["a", "b", "c"], np.eye(3))
    with pytest.raises(LmlabError, match="not in the vocabulary"):
        wv.nearest("zebra")
    with pytest.raises(LmlabError, match="k must be"):
        wv.nearest("a", 0)
    with pytest.raises(LmlabError, match="mode"):
        train_word2vec("a b c", mode="glove")
    with pytest.raises(LmlabError, match="min_count"):
        train_word2vec("a b c", min_count=5)
    with pytest.raises(LmlabError, match="dim"):
        train_svd(shakespeare_text[:2000], dim=500)
    assert words("Don't STOP, 3 men!") == ["don't", "stop", "men"]
