"""`lmlab align` from the command line: the preference reader's one-line errors, the output
directory, pairs made from a labelled task, and RLHF's reward model and policy step."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from align_fixtures import synthetic_pairs, tiny_model, write_pairs
from assertions import exit_code

from lmlab.align import align, read_preferences
from lmlab.align.from_task import task_pairs
from lmlab.align.reward import RewardModel, bradley_terry_loss
from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.loading import load_model

QUIET = {"progress": False, "log": lambda m: None}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    model = tiny_model()
    d = tmp_path_factory.mktemp("ck") / "gpt"
    model.save(d, tokenizer=model.tokenizer)
    return d


@pytest.mark.parametrize("line, problem", [
    ('{"prompt": "a", "chosen": " b"', "invalid JSON"),
    ('{"prompt": "a", "chosen": " b"}', "missing 'rejected'"),
    ('{"prompt": "a", "chosen": " b", "rejected": 3}', "'rejected' must be strings"),
    ('{"prompt": "a", "chosen": " b", "rejected": " b"}', "the same text"),
    ('{"prompt": "a", "chosen": "", "rejected": " b"}', "must not be empty"),
    ('["a", " b", " c"]', "expected a JSON object"),
])
def test_bad_pair_lines_name_file_and_line(tmp_path, line, problem):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "x", "chosen": " y", "rejected": " z"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(LmlabError) as e:
        read_preferences(f)
    msg = str(e.value)
    assert msg.startswith(f"{f} line 3: ") and problem in msg and "\n" not in msg
    kept = read_preferences(f, "skip", warn=lambda m: None)
    assert [(p.prompt, p.chosen, p.rejected) for p in kept] == [("x", " y", " z")]


def test_an_empty_pair_file_is_an_error(tmp_path):
    f = tmp_path / "e.jsonl"
    f.write_text("\n", encoding="utf-8")
    with pytest.raises(LmlabError, match="holds no preference pairs"):
        read_preferences(f)


def test_sst2_pairs_prefer_the_right_label(data_dir):
    pairs = task_pairs("sst2", data_dir / "glue" / "sst2" / "dev.tsv")
    assert len(pairs) == 872
    first = pairs[0]      # "it 's a charming and often affecting journey ." label 1
    assert first.prompt == "Review: it 's a charming and often affecting journey .\nSentiment:"
    assert (first.chosen, first.rejected) == (" positive", " negative")
    assert sum(p.chosen == " positive" for p in pairs) == 444          # PROVENANCE: 444 pos / 428 neg
    rte = task_pairs("rte", data_dir / "glue" / "rte" / "dev.tsv")
    assert {(p.chosen, p.rejected) for p in rte} == {(" True", " False"), (" False", " True")}


def test_a_task_file_without_its_columns_suggests_no_flag_align_lacks(tmp_path):
    f = tmp_path / "pairs.jsonl"
    f.write_text(json.dumps({"prompt": "Q:", "chosen": " a", "rejected": " b"}) + "\n", encoding="utf-8")
    with pytest.raises(LmlabError, match="no field for the text") as err:
        task_pairs("sst2", f)
    assert "-field" not in str(err.value) and "without --task" in str(err.value)


def test_align_cli_writes_a_loadable_model_and_its_numbers(ckpt, tmp_path, capsys):
    train = write_pairs(tmp_path / "train.jsonl", synthetic_pairs(48, 0))
    dev = write_pairs(tmp_path / "dev.jsonl", synthetic_pairs(16, 1))
    out = tmp_path / "aligned"

    def args(to):
        return ["align", "--method", "dpo", "--checkpoint", str(ckpt), "--train", str(train),
                "--dev", str(dev), "--out", str(to), "--max-steps", "4", "--batch-size", "8", "--lr", "1e-3",
                "--eval-every", "2", "--no-progress"]

    assert main(args(out)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["start"]["margin"] == 0 and printed["dev"] == json.loads((out / "eval.json").read_text())
    summary = json.loads((out / "align.json").read_text())
    assert summary["method"] == "dpo" and summary["config"]["beta"] == 0.1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "dev_margin" in r] == [0, 2, 4]
    model = load_model(out)
    assert model.architecture == "decoder" and model.tokenizer is not None
    assert not list(tmp_path.glob(".aligned*"))                         # no live log left beside it
    # running again replaces the earlier output; a directory of other files is never replaced
    assert main(args(out)) == 0
    other = tmp_path / "mine"
    other.mkdir()
    (other / "thesis.txt").write_text("keep me")
    capsys.readouterr()
    assert main(args(other)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert (other / "thesis.txt").read_text() == "keep me"


def test_align_cli_makes_pairs_from_a_labelled_task(ckpt, data_dir, tmp_path, capsys):
    g = data_dir / "glue" / "sst2"
    out = tmp_path / "sst2"
    assert main(["align", "--task", "sst2", "--checkpoint", str(ckpt), "--train", str(g / "train.tsv"),
                 "--dev", str(g / "dev.tsv"), "--out", str(out), "--max-train-examples", "16",
                 "--max-eval-examples", "8", "--max-steps", "2", "--batch-size", "8", "--no-progress"]) == 0
    summary = json.loads((out / "align.json").read_text())
    assert summary["train_pairs"] == 16 and summary["dev_pairs"] == 8 and summary["config"]["task"] == "sst2"
    assert json.loads(capsys.readouterr().out)["start"]["loss"] == pytest.approx(0.6931, abs=1e-4)


def test_align_cli_rejects_bad_settings_before_any_work(ckpt, tmp_path, capsys):
    train = write_pairs(tmp_path / "t.jsonl", synthetic_pairs(4, 0))
    base = ["align", "--checkpoint", str(ckpt), "--train", str(train), "--dev", str(train),
            "--out", str(tmp_path / "o")]
    for extra, words in [(["--beta", "0"], "argument --beta: must be greater than 0 (got '0')"),
                         (["--batch-size", "0"], "argument --batch-size: must be at least 1 (got '0')"),
                         (["--max-length", "1"], "argument --max-length: must be at least 2 (got '1')"),
                         (["--grad-accum", "1000000000"],  # the global batch is bounded: no hang
                          "argument --grad-accum: must be at most 65536 (got '1000000000')"),
                         (["--loss", "ipo", "--label-smoothing", "0.1"], "applies only with --loss sigmoid")]:
        assert exit_code(base + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and words in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit):
        main(["align", "--help"])
    assert "lmlab align --method dpo" in capsys.readouterr().out


def test_an_encoder_cannot_be_preference_tuned(tmp_path):
    from lmlab.models import build_model, get_preset

    tok = tiny_model().tokenizer
    enc = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size))
    enc.tokenizer = tok
    with pytest.raises(LmlabError, match="needs a model that writes text"):
        align(enc, synthetic_pairs(4, 0), synthetic_pairs(4, 1), None, **QUIET)


def test_bradley_terry_loss_is_the_reference_formula():
    g = torch.Generator().manual_seed(0)
    rc, rr = torch.randn(7, generator=g) * 3, torch.randn(7, generator=g) * 3
    expected = torch.log1p(torch.exp(-(rc - rr))).mean()           # -log sigma(x) = log(1 + e^-x)
    assert torch.allclose(bradley_terry_loss(rc, rr), expected, atol=1e-6)
    as_bce = F.binary_cross_entropy_with_logits(rc - rr, torch.ones(7))   # "chosen wins" as a label
    assert torch.allclose(bradley_terry_loss(rc, rr), as_bce)


def test_reward_model_reads_the_last_response_token():
    model = tiny_model()
    rm = RewardModel(model).eval()
    tok = model.tokenizer
    ids = tok.encode("cat: yes")
    labels = [-100] * (len(ids) - 1) + ids[-1:] + [-100, -100]            # right padding after it
    row = {"input_ids": torch.tensor([ids + [0, 0]]), "labels": torch.tensor([labels])}
    with torch.no_grad():
        got = rm(row)
        hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
    assert torch.allclose(got, rm.score(hidden), atol=1e-5)
    assert next(rm.body.parameters()).data_ptr() != next(model.parameters()).data_ptr()


def test_rlhf_learns_a_reward_model_and_raises_the_reward_of_its_answers():
    res = align(tiny_model(), synthetic_pairs(200, 0), synthetic_pairs(40, 1), None, method="rlhf",
                max_steps=50, batch_size=8, lr=3e-3, reward_steps=100, reward_lr=3e-3, max_new_tokens=1,
                samples=4, eval_every=50, **QUIET)
    rm = res.extra["reward_numbers"]
    assert rm["after"]["accuracy"] > 0.9 and rm["after"]["loss"] < rm["before"]["loss"]
    assert res.metrics["reward"] > res.start["reward"]
    assert res.metrics["sample_reward"] > res.start["sample_reward"]
    ref = res.reference
    assert all(not p.requires_grad and p.grad is None for p in ref.parameters())
    assert all(not p.requires_grad for p in res.extra["reward_model"].parameters())


def test_supervised_warmup_teaches_the_chosen_responses_before_rlhf():
    res = align(tiny_model(), synthetic_pairs(200, 0), synthetic_pairs(40, 1), None, method="rlhf",
                sft_steps=40, lr=3e-3, max_steps=1, batch_size=8, reward_steps=1, max_new_tokens=1, **QUIET)
    sft = [r["loss"] for r in res.history if r.get("phase") == "sft"]
    assert len(sft) == 4 and sft[-1] < sft[0] / 2
    # the policy phase starts from the warmed-up model: its greedy answer is the chosen one
    assert res.start["chosen_rate"] > 0.9 and res.start["accuracy"] > 0.9


def test_a_global_batch_larger_than_the_training_pairs_is_refused_before_the_model_loads(
        ckpt, tmp_path, capsys):
    """16 pairs, --grad-accum 50: a step of 800 "pairs" would visit every pair 50 times; refused in
    one line (lmlab.config.fits.check_global_batch), before the model's weights are read."""
    train = write_pairs(tmp_path / "t.jsonl", synthetic_pairs(16, 0))
    bare = tmp_path / "bare"  # the checkpoint without its weights: reading them would fail
    bare.mkdir()
    for f in ckpt.iterdir():
        if f.name != "model.safetensors":
            (bare / f.name).symlink_to(f)
    args = ["align", "--checkpoint", str(bare), "--train", str(train), "--dev", str(train), "--out",
            str(tmp_path / "o"), "--max-steps", "1", "--no-progress"]
    assert exit_code([*args, "--grad-accum", "50"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: a global batch of 800 pairs (--batch-size 16 x --grad-accum 50) is more than the 16 pairs "
        "of the training data; lower --batch-size or --grad-accum so that --batch-size x --grad-accum is "
        "at most 16, or add training data"), err
    assert exit_code([*args, "--batch-size", "8", "--grad-accum", "3"]) == 2  # 2 batches an epoch, 3 a step
    assert "a global batch of 24 pairs" in capsys.readouterr().err
    # one batch larger than the pairs is all of them once (as in fine-tuning), and batches of 9 and
    # 7 make one step of 2: not this refusal (the missing weights stop them later)
    for more in (["--batch-size", "17"], ["--batch-size", "9", "--grad-accum", "2"]):
        exit_code([*args, *more])
        assert "global batch" not in capsys.readouterr().err
    pairs = synthetic_pairs(16, 0)
    prompts = len({p.prompt for p in pairs})  # RLHF's items: the distinct prompts
    with pytest.raises(LmlabError, match=f"a global batch of {2 * prompts} prompts .* more than the "
                                         f"{prompts} prompts"):
        align(tiny_model(), pairs, synthetic_pairs(4, 1), None, method="rlhf", batch_size=prompts,
              grad_accum=2, **QUIET)
    assert not (tmp_path / "o").exists()


def test_a_dpo_batch_larger_than_the_pairs_is_one_batch_of_all_of_them(ckpt, tmp_path, capsys):
    """--batch-size 100 on 16 pairs at --grad-accum 1: one batch of the 16 (lmlab.config.fits.
    batch_for_data), said once in a note; the plan and the summary count 16, not 100."""
    train = write_pairs(tmp_path / "t.jsonl", synthetic_pairs(16, 0))
    out = tmp_path / "o"
    assert main(["align", "--checkpoint", str(ckpt), "--train", str(train), "--dev", str(train), "--out",
                 str(out), "--max-steps", "1", "--batch-size", "100", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("note: --batch-size 100 is more than the 16 pairs of the training data; each batch "
                     "holds all 16 of them") == 1, err
    assert "1 steps of 16 pairs" in err and "of 100 pairs" not in err, err
    assert json.loads((out / "align.json").read_text())["config"]["batch_size"] == 16
