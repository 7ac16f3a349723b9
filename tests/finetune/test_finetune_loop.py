"""The fine-tuning loop end to end on tiny models (MiniLM WordPiece vocabulary) and real data slices."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.finetune import METHODS, FullFineTuning, evaluate, finetune, load_finetuned
from lmlab.finetune.loop import epoch_batches
from lmlab.loading import load_model
from lmlab.models import build_model, get_preset
from lmlab.tasks import make_task
from lmlab.tasks import metrics as M
from lmlab.tasks.classification import SST2
from lmlab.tasks.readers import Example
from lmlab.tokenizers import load_tokenizer
from lmlab.train.optim import warmup_decay_lr

QUIET = {"progress": False, "log": lambda m: None}


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return load_tokenizer(minilm_dir)


def tiny(preset: str, tok, **overrides):
    """A tiny random model with the real MiniLM WordPiece vocabulary attached (saved, as a user would)."""
    torch.manual_seed(0)
    model = build_model(get_preset(preset, vocab_size=tok.vocab_size, **overrides), heads=None)
    model.tokenizer = load_tokenizer_copy(tok)
    return model


def load_tokenizer_copy(tok):
    from lmlab.tokenizers.wordpiece import WordPieceTokenizer

    return WordPieceTokenizer._from_hf(tok.to_hf_json(), tok.tokenizer_config())


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_lr_schedule_warmup_then_linear_decay():
    lrs = [round(warmup_decay_lr(s, lr=1.0, warmup=2, end=10), 4) for s in range(10)]
    assert lrs == [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]
    assert warmup_decay_lr(0, lr=2.0, warmup=0, end=5) == 2.0


def test_epoch_batches_cover_everything_once_and_group_lengths():
    import random

    rng = random.Random(0)
    lengths = [rng.randint(3, 60) for _ in range(1000)]
    gen = torch.Generator().manual_seed(0)
    grouped = epoch_batches(lengths, 32, gen, True)
    plain = epoch_batches(lengths, 32, gen, False)
    for batches in (grouped, plain):
        assert sorted(i for b in batches for i in b) == list(range(1000)) and len(batches) == 32

    def padded(batches):
        return sum(max(lengths[i] for i in b) * len(b) for b in batches)

    assert padded(grouped) < 0.75 * padded(plain)
    assert epoch_batches(lengths, 32, torch.Generator().manual_seed(1), True) != grouped   # reshuffled


def test_encoder_sst2_writes_a_loadable_model(tok, data_dir, tmp_path):
    g = data_dir / "glue" / "sst2"
    out = tmp_path / "ft"
    res = finetune(tiny("bert-tiny", tok), "sst2", g / "train.tsv", g / "dev.tsv", out, epochs=2,
                   batch_size=16, lr=5e-4, eval_every=5, max_train_examples=160, max_eval_examples=64,
                   **QUIET)
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer", "task.json",
                                               "eval.json", "metrics.jsonl", "finetune.json"}
    eval_json = json.loads((out / "eval.json").read_text())
    assert set(eval_json) == {"accuracy"} and eval_json == res.metrics
    log = rows(out)
    dev_rows = [r for r in log if "dev_accuracy" in r]
    assert [r["step"] for r in dev_rows] == [5, 10, 15, 20]       # every 5 steps; epochs end at 10 and 20
    best = max(dev_rows, key=lambda r: r["dev_accuracy"])
    assert eval_json["accuracy"] == best["dev_accuracy"]
    assert json.loads((out / "finetune.json").read_text())["best_step"] == best["step"]
    train_rows = [r for r in log if "loss" in r]
    assert [r["step"] for r in train_rows] == [10, 20] and train_rows[0]["lr"] > train_rows[1]["lr"] > 0
    # the saved model is the best one: reloading and evaluating gives exactly eval.json
    model = load_model(out)
    assert model.head_names == ("seq_cls",) and model.tokenizer.vocab_size == tok.vocab_size
    assert evaluate(out, g / "dev.tsv", max_examples=64) == eval_json
    model, task = load_finetuned(out)
    assert task.name == "sst2" and task.labels == ["0", "1"]
    with pytest.raises(LmlabError, match="fine-tuned for task 'sst2', not 'cola'"):
        evaluate(out, g / "dev.tsv", "cola")


class ScriptedSST2(SST2):
    """SST-2 whose dev scores are scripted, remembering the weights at every evaluation."""

    scores = [0.3, 0.9, 0.5]

    def __init__(self):
        super().__init__()
        self.seen = []

    def evaluate(self, model, examples, batch_size=64):
        self.seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"accuracy": self.scores[len(self.seen) - 1]}


def test_the_best_dev_checkpoint_is_the_one_saved(tok, data_dir, tmp_path):
    g = data_dir / "glue" / "sst2"
    task = ScriptedSST2()
    out = tmp_path / "best"
    res = finetune(tiny("bert-tiny", tok), task, g / "dev.tsv", g / "dev.tsv", out, max_steps=6, eval_every=2,
                   batch_size=8, lr=1e-3, max_train_examples=48, **QUIET)
    assert res.best_step == 4 and res.metrics == {"accuracy": 0.9}
    saved = load_model(out).state_dict()
    for k, v in task.seen[1].items():        # weights at step 4, not those at step 6
        assert torch.equal(saved[k], v), k
    assert any(not torch.equal(task.seen[2][k], v) for k, v in task.seen[1].items())


def test_pairs_regression_and_ner_train_and_report_their_metrics(tok, data_dir, tmp_path):
    g = data_dir / "glue"
    rte = finetune(tiny("bert-tiny", tok), "rte", g / "rte" / "train.tsv", g / "rte" / "dev.tsv", None,
                   epochs=1, batch_size=16, max_train_examples=64, max_eval_examples=40, **QUIET)
    assert set(rte.metrics) == {"accuracy", "f1"} and rte.task.labels == ["entailment", "not_entailment"]
    stsb = finetune(tiny("bert-tiny", tok), "stsb", g / "stsb" / "train.tsv", g / "stsb" / "dev.tsv", None,
                    epochs=1, batch_size=16, lr=1e-3, max_train_examples=64, max_eval_examples=40, **QUIET)
    assert set(stsb.metrics) == {"pearson", "spearman"} and stsb.model.config.num_labels == 1
    c = data_dir / "conll2003"
    ner = finetune(tiny("bert-tiny", tok), "conll", c / "train.txt", c / "valid.txt", None, epochs=3,
                   batch_size=16, lr=3e-3, log_every=2, max_train_examples=96, max_eval_examples=40, **QUIET)
    assert set(ner.metrics) == {"precision", "recall", "f1"} and len(ner.task.labels) == 9
    losses = [r["loss"] for r in ner.history if "loss" in r]
    assert losses[-1] < 0.6 * losses[0]                 # it learns (mostly "O" at first, then more)


def test_squad_finetunes_with_windows(tok, data_dir):
    path = data_dir / "squad" / "squad_v1.1_dev_partA.json"
    task = make_task("squad", max_length=128, doc_stride=48)
    examples = task.read(path)
    res = finetune(tiny("bert-tiny", tok), task, examples[:64], examples[-24:], None, epochs=1, batch_size=16,
                   **QUIET)
    assert set(res.metrics) == {"exact_match", "f1"}
    assert 0.0 <= res.metrics["exact_match"] <= res.metrics["f1"]
    assert res.model.head_names == ("span",)


def test_decoder_gpt_style_with_aux_lm_loss_reloads(tok, data_dir, tmp_path):
    g = data_dir / "glue" / "rte"
    model = tiny("gpt2-tiny", tok)
    out = tmp_path / "gpt"
    res = finetune(model, "rte", g / "train.tsv", g / "dev.tsv", out, epochs=1, batch_size=16, lm_weight=0.5,
                   max_length=64, max_train_examples=32, max_eval_examples=24, **QUIET)
    assert set(res.metrics) == {"accuracy", "f1"}
    reloaded = load_model(out)
    assert reloaded.head_names == ("cls", "lm") and reloaded.config.vocab_size == tok.vocab_size + 3
    assert "[EXTRACT]" in reloaded.tokenizer.token_to_id
    assert evaluate(out, g / "dev.tsv", max_examples=24) == res.metrics
    # the auxiliary LM loss is added with its weight
    task = res.task
    feats = task.features(task.read(g / "dev.tsv")[:4], reloaded.tokenizer)
    from lmlab.tasks import collate

    batch = collate(feats, 0)
    with torch.no_grad():
        task.options.lm_weight = 0.0
        cls_only = task.loss(reloaded, batch)
        task.options.lm_weight = 0.5
        both = task.loss(reloaded, batch)
        out_ = reloaded(batch["input_ids"], attention_mask=batch["attention_mask"])
    from lmlab.models.heads import causal_lm_loss

    lm = causal_lm_loss(out_.extra["lm_logits"], batch["lm_labels"])
    assert both.item() == pytest.approx(cls_only.item() + 0.5 * lm.item(), rel=1e-5)


def test_decoder_last_token_style(tok, data_dir):
    g = data_dir / "glue" / "sst2"
    res = finetune(tiny("gpt2-tiny", tok), "sst2", g / "train.tsv", g / "dev.tsv", None, epochs=1,
                   batch_size=16, decoder_style="last", max_train_examples=32, max_eval_examples=32, **QUIET)
    assert res.model.head_names == ("cls",) and res.model.config.vocab_size == tok.vocab_size
    assert set(res.metrics) == {"accuracy"}


def test_bf16_autocast_is_asked_for_or_chosen_on_a_gpu_never_silently_on_a_cpu(tok, data_dir, monkeypatch):
    from lmlab.finetune import loop
    from lmlab.runtime import choose_precision

    def autocast_dtype(precision, device):
        return choose_precision(precision, torch.device(device))[0]

    assert autocast_dtype("auto", "cpu") is None
    assert autocast_dtype("bf16", "cpu") is torch.bfloat16
    assert autocast_dtype("fp32", "cuda") is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert autocast_dtype("auto", "cuda") is torch.bfloat16  # chosen on a GPU
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert autocast_dtype("auto", "cuda") is None
    with pytest.raises(LmlabError, match="no bfloat16"):
        autocast_dtype("bf16", "cuda")
    seen = []
    real = torch.autocast

    def spy(device_type, dtype=None, **kw):
        seen.append(dtype)
        return real(device_type, dtype=dtype, **kw)

    monkeypatch.setattr(loop.torch, "autocast", spy)
    g = data_dir / "glue" / "sst2"
    lines = []
    res = finetune(tiny("bert-tiny", tok), "sst2", g / "train.tsv", g / "dev.tsv", None, epochs=1,
                   batch_size=16, precision="bf16", max_train_examples=32, max_eval_examples=32,
                   log=lines.append, progress=False)
    assert seen and set(seen) == {torch.bfloat16}          # the steps and the evaluation ran under it
    assert any("bf16 autocast" in line for line in lines) and 0 <= res.metrics["accuracy"] <= 1
    with pytest.raises(LmlabError, match="precision"):
        finetune(tiny("bert-tiny", tok), "sst2", g / "train.tsv", g / "dev.tsv", None, precision="fp16",
                 **QUIET)


def test_text2text_classification_learns_the_label_words(tok, data_dir):
    g = data_dir / "glue" / "sst2"
    model = tiny("t5-tiny", tok, pad_token_id=0, decoder_start_token_id=0, eos_token_id=tok.sep_id)
    res = finetune(model, "sst2", g / "train.tsv", g / "dev.tsv", None, epochs=3, batch_size=16, lr=3e-3,
                   max_train_examples=96, max_eval_examples=24, max_target_length=4, **QUIET)
    assert set(res.metrics) == {"accuracy", "outside_labels"} and res.metrics["outside_labels"] == 0.0
    preds = res.task.predict(res.model, res.task.read(g / "dev.tsv")[:24])
    assert all(p in ("0", "1") for p in preds), preds        # it writes label words, nothing else


def test_text2text_generation_scores_rouge_and_bleu(tok, data_dir, tmp_path):
    with gzip.open(data_dir / "multi30k" / "val.de.gz", "rt", encoding="utf-8") as f:
        de = [next(f).strip() for _ in range(40)]
    with gzip.open(data_dir / "multi30k" / "val.en.gz", "rt", encoding="utf-8") as f:
        en = [next(f).strip() for _ in range(40)]
    path = tmp_path / "pairs.tsv"      # research-only data: written to a temporary file only
    path.write_text("".join(f"{s}\t{t}\n" for s, t in zip(de, en)), encoding="utf-8")
    model = tiny("t5-tiny", tok, pad_token_id=0, decoder_start_token_id=0, eos_token_id=tok.sep_id)
    res = finetune(model, "text2text", path, path, None, max_steps=3, batch_size=16, max_eval_examples=8,
                   max_target_length=8, prefix="translate German to English: ", **QUIET)
    assert set(res.metrics) == {"rouge1", "rouge2", "rougeL", "rougeLsum", "bleu"}
    assert all(0.0 <= v <= 1.0 for v in res.metrics.values())
    # --rouge-stemmer: the task scores with stemming, as rouge-score's use_stemmer=True
    task = make_task("text2text", "seq2seq", rouge_stemmer=True)
    preds, refs = ["two dogs are running"], ["A dog runs on the grass"]
    stemmed = task.score(preds, [Example("x", label=r) for r in refs])["rouge1"]
    assert stemmed == pytest.approx(M.rouge_scores(preds, refs, stem=True)["rouge1"])
    assert stemmed > M.rouge_scores(preds, refs)["rouge1"]


def test_bad_settings_and_mismatched_tokenizer(tok, data_dir, tmp_path):
    g = data_dir / "glue" / "sst2"
    args = ("sst2", g / "dev.tsv", g / "dev.tsv", None)
    small = build_model(get_preset("bert-tiny", vocab_size=1000))
    small.tokenizer = tok
    with pytest.raises(LmlabError, match="tokenizer has 30522 tokens but the model's vocabulary has 1000"):
        finetune(small, *args, **QUIET)
    small.tokenizer = None
    with pytest.raises(LmlabError, match="the checkpoint has no tokenizer"):
        finetune(small, *args, **QUIET)
    with pytest.raises(LmlabError, match="unknown fine-tuning method 'lora2'"):
        finetune(tiny("bert-tiny", tok), *args, method="lora2", **QUIET)
    with pytest.raises(LmlabError, match=r"unknown fine-tuning settings \['learning_rate'\]"):
        finetune(tiny("bert-tiny", tok), *args, learning_rate=1.0, **QUIET)
    with pytest.raises(LmlabError, match="not a fine-tuned checkpoint"):
        evaluate(tmp_path, g / "dev.tsv")
    assert METHODS["full"] is FullFineTuning


def test_majority_class_baseline_is_computed_from_train_and_scored_on_dev():
    from lmlab.tasks.readers import Example

    train = [Example("a", label="1"), Example("b", label="1"), Example("c", label="0")]
    dev = [Example("d", label="0"), Example("e", label="1"), Example("f", label="0"), Example("g", label="0")]
    answer, scores = SST2().baseline(train, dev)
    assert answer == "majority class '1'" and scores["accuracy"] == pytest.approx(0.25)


def test_a_model_stuck_at_the_majority_class_is_reported_not_silent(tok, data_dir, tmp_path):
    g = data_dir / "glue" / "sst2"
    said = []
    res = finetune(tiny("bert-tiny", tok), "sst2", g / "train.tsv", g / "dev.tsv", tmp_path / "ft", lr=1e-12,
                   max_steps=2, batch_size=8, max_train_examples=64, max_eval_examples=200, progress=False,
                   log=said.append)
    text = "\n".join(said)
    assert "baseline (majority class" in text and "(baseline accuracy" in text
    assert res.at_baseline and "warning: the best dev accuracy" in text and "--lr auto" in text
    summary = json.loads((tmp_path / "ft" / "finetune.json").read_text())
    assert summary["at_baseline"] is True
    assert summary["baseline"]["dev"]["accuracy"] == pytest.approx(res.baseline["accuracy"])
    assert not list(tmp_path.glob(".ft.*"))  # the live log moved into the output


def test_lr_auto_keeps_the_best_rate_on_dev_and_leaves_nothing_behind(tok, data_dir, tmp_path):
    g = data_dir / "glue" / "sst2"
    said = []
    model = tiny("bert-tiny", tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = finetune(model, "sst2", g / "train.tsv", g / "dev.tsv", tmp_path / "ft", lr="auto",
                   lr_sweep=[1e-12, 1e-3], epochs=2, batch_size=16, max_train_examples=320,
                   max_eval_examples=200, progress=False, log=said.append)
    sweep = json.loads((tmp_path / "ft" / "finetune.json").read_text())["lr_sweep"]
    assert sweep["select_metric"] == "accuracy" and set(sweep["scores"]) == {"1e-12", "0.001"}
    assert sweep["selected_on"] == "dev"
    assert sweep["chosen"] == (1e-3 if sweep["scores"]["0.001"] > sweep["scores"]["1e-12"] else 1e-12)
    assert res.metrics["accuracy"] == max(sweep["scores"].values()) and res.out == tmp_path / "ft"
    assert json.loads((tmp_path / "ft" / "eval.json").read_text()) == res.metrics
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ft"]  # the other run and temp files are gone
    assert any("keeping lr" in line and line.endswith(f"; saved to {tmp_path / 'ft'}") for line in said), said
    # probe10b: each rate's line said "saved to" its temporary folder, deleted a moment later
    assert not any("saved to" in line and ".ft." in line for line in said), said
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # each run starts fresh


def test_lr_auto_refuses_a_missing_input_before_any_run_and_a_failed_run_leaves_nothing(
        tok, data_dir, tmp_path):
    g = data_dir / "glue" / "sst2"
    said = []
    with pytest.raises(LmlabError, match="does not exist"):
        finetune(tmp_path / "no-such-model", "sst2", g / "train.tsv", g / "dev.tsv", tmp_path / "ft",
                 lr="auto", progress=False, log=said.append)
    with pytest.raises(LmlabError, match="does not exist"):
        finetune(tiny("bert-tiny", tok), "sst2", tmp_path / "no-train.tsv", g / "dev.tsv", tmp_path / "ft",
                 lr="auto", progress=False, log=said.append)
    assert said == [] and list(tmp_path.iterdir()) == []  # no "lr auto: run 1/3" line, no folder
    # a run that fails mid-sweep (a bad line in train, past the checks) takes its own folder with it
    bad = tmp_path / "train.tsv"
    bad.write_text("sentence\tlabel\ngood movie\t1\nbad movie\tmaybe\n", encoding="utf-8")
    with pytest.raises(LmlabError):
        finetune(tiny("bert-tiny", tok), "sst2", bad, g / "dev.tsv", tmp_path / "ft", lr="auto",
                 progress=False, log=said.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.tsv"], list(tmp_path.iterdir())


def test_lr_must_be_positive_or_auto(tok):
    with pytest.raises(LmlabError, match=r"lr must be a number \(got 'fast'\); use a learning rate.*or auto"):
        finetune(tiny("bert-tiny", tok), "sst2", [], [], None, lr="fast")


def test_finetune_without_a_terminal_logs_progress_lines(tok, data_dir, capsys):
    g = data_dir / "glue" / "sst2"
    said = []
    finetune(tiny("bert-tiny", tok), "sst2", g / "train.tsv", g / "dev.tsv", None, max_steps=40, batch_size=8,
             max_train_examples=320, max_eval_examples=16, progress=True, log=said.append)
    assert [m.split("/")[0] for m in said if m.startswith("step ") and "s left" in m] == [
        f"step {s}" for s in range(2, 40, 2)]
    assert "\r" not in capsys.readouterr().err
