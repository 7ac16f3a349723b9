"""In-context learning: prompt format, likelihood scoring by hand, SST-2 loop, few > zero shot."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.icl import PromptTemplate, continuation_logprobs, evaluate_icl, normalize_answer
from lmlab.models import build_model, get_preset
from lmlab.tokenizers import train_tokenizer


class BigramLM(torch.nn.Module):
    """A fake decoder whose next-token logits depend only on the current token: ``table[token]``."""

    architecture = "decoder"

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone(), requires_grad=False)
        self.config = SimpleNamespace(positions="rotary", vocab_size=table.shape[0])

    def forward(self, input_ids, **_):
        return SimpleNamespace(logits=self.table[input_ids])


@pytest.fixture(scope="module")
def tok(shakespeare):
    return train_tokenizer("bytelevel", [shakespeare[:30000], "positive negative => sea otter loutre de mer"],
                           vocab_size=350)


def test_prompt_golden_string():
    t = PromptTemplate("Translate English to French:")
    prompt = t.build([("sea otter", "loutre de mer"), ("peppermint", "menthe poivr\u00e9e")], "cheese")
    assert prompt == ("Translate English to French:\nsea otter => loutre de mer\n"
                      "peppermint => menthe poivr\u00e9e\ncheese =>")
    assert t.continuation("cheese", "fromage") == " fromage"
    qa = PromptTemplate(example="Q: {input}\nA: {answer}", separator="\n\n")
    assert qa.build([], "2+2?") == "Q: 2+2?\nA:"
    with pytest.raises(LmlabError, match="answer"):
        PromptTemplate(example="{input} only")


def test_likelihood_scoring_matches_a_hand_computation_and_picks_the_preferred_label(tok):
    torch.manual_seed(0)
    table = torch.randn(tok.vocab_size, tok.vocab_size) * 3
    model = BigramLM(table)
    prompt, labels = "sea otter =>", [" loutre de mer", " positive", " negative"]
    got = continuation_logprobs(model, tok, prompt, labels)
    logp = table.log_softmax(-1)
    for (total, n), lab in zip(got, labels):
        seq = [tok.bos_id] + tok.encode(prompt + lab)
        ctx = len([tok.bos_id] + tok.encode(prompt))
        hand = sum(float(logp[seq[i - 1], seq[i]]) for i in range(ctx, len(seq)))
        assert n == len(seq) - ctx and total == pytest.approx(hand, abs=1e-4)
    examples = [("sea otter", "loutre de mer")]
    for scoring, reduce in (("likelihood", lambda s, n: s), ("likelihood-mean", lambda s, n: s / n)):
        res = evaluate_icl(model, tok, examples, [], 0, scoring=scoring,
                           labels=[lab.strip() for lab in labels])
        best = max(range(3), key=lambda i: reduce(*got[i]))
        assert res["predictions"] == [labels[best].strip()]
    # make the model love the first token of " negative": the likelihood pick follows
    first_neg = tok.encode(prompt + " negative")[len(tok.encode(prompt))]
    table[:, first_neg] += 50
    res = evaluate_icl(BigramLM(table), tok, examples, [], 0,
                       labels=["positive", "negative", "loutre de mer"])
    assert res["predictions"] == ["negative"] and res["accuracy"] == 0.0


def _sst2(path, n):
    rows = [line.rstrip("\n").split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:n + 1]]
    return [(s.strip(), {"0": "negative", "1": "positive"}[y]) for s, y in rows]


def test_sst2_prompt_format_and_evaluation_loop(data_dir, tok):
    dev = _sst2(data_dir / "glue" / "sst2" / "dev.tsv", 24)
    train = _sst2(data_dir / "glue" / "sst2" / "train.tsv", 40)
    t = PromptTemplate("Is the sentiment of each review positive or negative?", "Review: {input} => {answer}")
    prompt = t.build(train[:2], dev[0][0])
    assert prompt.splitlines() == [
        "Is the sentiment of each review positive or negative?",
        "Review: hide new secretions from the parental units => negative",
        "Review: contains no wit , only labored gags => negative",
        "Review: it 's a charming and often affecting journey . =>"]
    # a unigram "model" that prefers the tokens of " positive": always predicts positive
    bias = torch.zeros(tok.vocab_size)
    for t_id in tok.encode(" positive"):
        bias[t_id] += 20
    model = BigramLM(bias.expand(tok.vocab_size, -1))
    res = evaluate_icl(model, tok, dev, train, 4, t, labels=["negative", "positive"], seed=1)
    share = sum(y == "positive" for _, y in dev) / len(dev)
    assert res["predictions"] == ["positive"] * len(dev) and res["accuracy"] == pytest.approx(share)
    assert 0 < share < 1 and res["n"] == 24 and res["k"] == 4
    # same seed, same demonstrations; a real tiny decoder runs through the loop too
    real = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size))
    a = evaluate_icl(real, tok, dev[:6], train, 2, t, seed=3)
    b = evaluate_icl(real, tok, dev[:6], train, 2, t, seed=3)
    assert a == b and set(a["predictions"]) <= {"negative", "positive"}


# --------------------------------------------------------------------------- few-shot beats zero-shot
COLORS = ["red", "blue", "green", "gold"]
LETTERS = "abcdefgh"


def _word(rng):
    return rng.choice(LETTERS)


def _document(rng, lines=6):
    """Every line of a document has the same answer, chosen at random: a task given only in context."""
    color = rng.choice(COLORS)
    return "\n".join(f"{_word(rng)} => {color}" for _ in range(lines))


@pytest.fixture(scope="module")
def icl_model():
    rng = random.Random(0)
    docs = [_document(rng) for _ in range(3000)]
    tok = train_tokenizer("bytelevel", docs[:300], vocab_size=300)
    torch.manual_seed(0)
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size, max_positions=64, dropout=0.0))
    # lr 3e-3 for 500 steps: induction forms for every init seed tried (0, 1, 2); at lr 1e-2 for 250
    # steps it formed for one seed in three, so any change to the random stream (dropout's) broke it
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    seqs = [[tok.bos_id] + tok.encode(d) for d in docs]
    width = max(len(s) for s in seqs)
    data = torch.tensor([s + [tok.pad_id] * (width - len(s)) for s in seqs])
    model.train()
    for step in range(500):
        batch = data[torch.randint(0, len(data), (32,), generator=torch.Generator().manual_seed(step))]
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 batch[:, 1:].reshape(-1), ignore_index=tok.pad_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok


def test_few_shot_beats_zero_shot_on_a_task_shown_only_in_context(icl_model):
    model, tok = icl_model
    rng = random.Random(1)
    acc = {0: [], 3: []}
    gen = {0: [], 3: []}
    for color in COLORS:          # one task per answer: zero-shot cannot know which one is asked
        task = [(_word(rng), color) for _ in range(8)]
        pool = [(_word(rng), color) for _ in range(10)]
        for k in acc:
            acc[k].append(evaluate_icl(model, tok, task, pool, k, labels=COLORS, seed=k)["accuracy"])
            gen[k].append(evaluate_icl(model, tok, task[:4], pool, k, scoring="generate", seed=k)["accuracy"])
    zero, few = sum(acc[0]) / 4, sum(acc[3]) / 4
    assert few >= 0.9 and zero <= 0.5 and few > zero, (acc, gen)
    assert sum(gen[3]) / 4 >= 0.75 and sum(gen[3]) > sum(gen[0])


def test_bad_input_is_a_one_line_error(tok):
    model = BigramLM(torch.zeros(tok.vocab_size, tok.vocab_size))
    with pytest.raises(LmlabError, match="K=2 few-shot examples asked for, but the shots pool has 1 "):
        evaluate_icl(model, tok, [("a", "b")], [("c", "d")], 2)
    with pytest.raises(LmlabError, match="unknown scoring"):
        evaluate_icl(model, tok, [("a", "b")], [("c", "d")], 0, scoring="vote")
    with pytest.raises(LmlabError, match="pair"):
        evaluate_icl(model, tok, ["just text"], [], 0)
    assert normalize_answer("  Loutre de MER. ") == "loutre de mer"


def test_the_few_shot_count_is_checked_against_the_pool_by_one_rule(tok):
    """K above the documents there are, or negative, is one rule (icl.evaluate.check_fewshot) for
    evaluate_icl and the harness; a query that is in the pool is not its own example, so a pool
    of 2 holding the query gives 1 (the old check let K=2 through and drew 1 in silence)."""
    from lmlab.icl.evaluate import check_fewshot

    model = BigramLM(torch.zeros(tok.vocab_size, tok.vocab_size))
    pool = [("a", "b"), ("c", "d")]
    with pytest.raises(LmlabError, match="K=2 few-shot.*has 2 document.*less the query itself"):
        evaluate_icl(model, tok, [("a", "b")], pool, 2)
    for bad in (-1, 1.5, True):
        with pytest.raises(LmlabError, match=r"^evaluate_icl's k must be .*; use a whole number of at least"):
            evaluate_icl(model, tok, [("a", "b")], pool, bad)
    assert evaluate_icl(model, tok, [("a", "b")], pool, 1)["k"] == 1
    with pytest.raises(LmlabError) as e:
        check_fewshot(100_000, 2, "task 'quiz'")
    assert str(e.value).startswith("K=100,000 few-shot examples asked for, but task 'quiz' has 2 document(s)")
    assert "--num-fewshot 2 or fewer" in e.value.fix
