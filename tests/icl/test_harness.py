"""lmlab evaluate --harness: lm-evaluation-harness on an lmlab checkpoint, offline, on local task files.

The harness' numbers are checked two ways: against log-likelihoods computed here from lmlab's own
forward pass (multiple choice), and against the harness' own Hugging Face model (``--model hf``) on
the transformers export of the same checkpoint, for all three request kinds (multiple choice,
rolling log-likelihood, generation)."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.icl.harness import run_harness
from lmlab.models import build_model, get_preset
from lmlab.tokenizers import train_tokenizer

QUESTIONS = [  # (context, choices, answer index): hand-made, Shakespeare-flavoured
    ("ROMEO: But soft, what light through yonder window", ["breaks", "sleeps", "eats"], 0),
    ("JULIET: O Romeo, Romeo, wherefore art thou", ["Romeo", "bread", "here"], 0),
    ("HAMLET: To be, or not to", ["be", "sing", "go home"], 0),
    ("KING: Now is the winter of our", ["discontent", "cheese", "lord"], 1),
    ("MACBETH: Is this a dagger which I see before", ["me", "the sea", "them"], 2),
    ("First Citizen: Before we proceed any further, hear me", ["speak", "walk", "sleep"], 0),
]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, shakespeare):
    """A random 2-layer GPT-2 checkpoint with a byte-level tokenizer and 48 positions (the longest
    question fits; the texts to score take several of the harness' rolling windows), and three local
    task files."""
    root = tmp_path_factory.mktemp("harness")
    tok = train_tokenizer("bytelevel", [shakespeare[:50_000]], vocab_size=350)
    torch.manual_seed(0)
    preset = get_preset("gpt2-tiny", vocab_size=tok.vocab_size, n_layers=2, max_positions=48)
    model = build_model(preset).eval()
    model.tokenizer = tok
    model.save(root / "ck")
    rows = [{"question": q, "choices": c, "label": y} for q, c, y in QUESTIONS]
    (root / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    lines = [shakespeare[i:i + 400] for i in range(0, 1600, 400)]  # ~100 tokens: 3 windows each
    assert all(len(tok.encode(line)) > 2 * 48 for line in lines)
    (root / "text.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    tasks = root / "tasks"
    tasks.mkdir()
    data = "dataset_path: json\ntest_split: test\ndataset_kwargs:\n  cache_dir: {cache}\n  data_files:\n" \
           "    test: {file}\n"
    cache = root / "hf-cache"
    (tasks / "mc.yaml").write_text(
        "task: lmlab_mc\n" + data.format(cache=cache, file=root / "mc.jsonl")
        + "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_target: label\n"
        "doc_to_choice: choices\nmetric_list:\n  - metric: acc\n    aggregation: mean\n"
        "    higher_is_better: true\n", encoding="utf-8")
    (tasks / "ppl.yaml").write_text(
        "task: lmlab_ppl\n" + data.format(cache=cache, file=root / "text.jsonl")
        + "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n", encoding="utf-8")
    (tasks / "gen.yaml").write_text(
        "task: lmlab_gen\n" + data.format(cache=cache, file=root / "mc.jsonl")
        + "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{choices[label]}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n", encoding="utf-8")
    return {"root": root, "model": model, "tok": tok, "tasks": tasks}


def _choice_logprob(model, tok, context: str, choice: str) -> float:
    """log p(" " + choice | context) from lmlab's forward pass (the harness puts its target delimiter,
    a space, before each choice): the joint encoding split after the context's tokens."""
    ids, n = tok.encode(f"{context} {choice}"), len(tok.encode(context))
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return sum(float(logp[t - 1, ids[t]]) for t in range(n, len(ids)))


def test_multiple_choice_accuracy_equals_lmlab_loglikelihoods_and_json_lands_beside_the_checkpoint(setup):
    root, model, tok = setup["root"], setup["model"], setup["tok"]
    out = root / "ck.harness.json"
    out.unlink(missing_ok=True)
    result = run_harness(root / "ck", [str(setup["tasks"] / "mc.yaml")], batch_size=4)
    reference, hits = [], 0
    for (question, choices, label) in QUESTIONS:
        scores = [_choice_logprob(model, tok, question, c) for c in choices]
        reference.append(scores)
        hits += max(range(len(scores)), key=scores.__getitem__) == label
    samples = sorted(result["samples"]["lmlab_mc"], key=lambda s: s["doc_id"])
    got = [[r[0] for r in s["filtered_resps"]] for s in samples]
    assert sum(got, []) == pytest.approx(sum(reference, []), abs=1e-4)
    assert result["results"]["lmlab_mc"]["acc,none"] == pytest.approx(hits / len(QUESTIONS))
    # the JSON file: beside the checkpoint, holding the same results, no temporary left
    assert result["path"] == str(out)
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["results"] == result["results"] and written["tasks"] == ["lmlab_mc"]
    assert "samples" not in written
    # no temporary left; the folder's manifest records the file as lmlab's (--overwrite may replace it)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == [".lmlab-manifest.json"]


def test_an_existing_results_file_is_kept_unless_overwrite_and_overwrite_replaces_only_lmlabs(setup):
    root = setup["root"]
    mc = str(setup["tasks"] / "mc.yaml")
    out = root / "kept.json"
    out.unlink(missing_ok=True)
    run_harness(root / "ck", mc, out=out, limit=1)
    with pytest.raises(LmlabError, match=r"already exists \(results lmlab wrote\); pass --overwrite"):
        run_harness(root / "ck", mc, out=out)
    assert json.loads(out.read_text(encoding="utf-8"))["limit"] == 1
    run_harness(root / "ck", mc, out=out, overwrite=True, limit=2)  # a results file lmlab wrote: replaced
    assert json.loads(out.read_text(encoding="utf-8"))["limit"] == 2
    mine = root / "mine.json"  # a file of the user's: never replaced, --overwrite or not (docs/safety.md)
    mine.write_text("mine\n", encoding="utf-8")
    for overwrite in (False, True):  # not "pass --overwrite": it could not replace the file either
        with pytest.raises(LmlabError, match="exists and was not written by lmlab"):
            run_harness(root / "ck", mc, out=mine, overwrite=overwrite)
    assert mine.read_text(encoding="utf-8") == "mine\n"
    out.write_text('{"edited": "by hand"}\n', encoding="utf-8")  # lmlab's, edited since: the user's now
    os.utime(out, ns=(1, 1))
    with pytest.raises(LmlabError, match="changed since lmlab wrote it"):
        run_harness(root / "ck", mc, out=out, overwrite=True)
    assert out.read_text(encoding="utf-8") == '{"edited": "by hand"}\n'


def test_results_beside_a_runs_checkpoint_are_replaced_with_overwrite_when_lmlab_wrote_them(setup, tmp_path,
                                                                                             capsys):
    """probe8 #1: the default results file beside a pretraining run's checkpoint could never be
    replaced: a rerun said "pass --overwrite", and --overwrite was refused as "--out ... is inside
    the pretraining run ..., where only that pretraining run writes", naming an --out never given.
    Now the file lmlab wrote there is recorded in the run's manifest (beside the run's own files,
    which stay as they were) and replaced with --overwrite, by default or named by --out; an edited
    one or a file of the user's there is refused, --overwrite or not, naming the default as such."""
    from lmlab import ownership
    from lmlab.train.loop import RUN_KIND

    mc = str(setup["tasks"] / "mc.yaml")
    run = tmp_path / "run"
    ownership.claim_dir(run, RUN_KIND, ("checkpoints", "metrics.jsonl"))
    shutil.copytree(setup["root"] / "ck", run / "checkpoints" / "step_1")
    ck = run / "checkpoints" / "step_1"
    results = run / "checkpoints" / "step_1.harness.json"

    def own() -> dict:  # what the run's manifest says of the run's own files
        return {k: ownership.read_manifest(run).get(k) for k in ("kind", "state", "entries", "files")}

    before = own()

    def evaluate(n: int, *extra: str) -> int:
        code = main(["evaluate", "--checkpoint", str(ck), "--harness", mc, "--max-examples", str(n), *extra])
        return code

    def limit() -> int:
        return json.loads(results.read_text(encoding="utf-8"))["limit"]

    assert evaluate(1) == 0 and limit() == 1
    capsys.readouterr()
    assert evaluate(2) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "pass --overwrite" in err and limit() == 1, err
    assert evaluate(2, "--overwrite") == 0, capsys.readouterr().err
    assert limit() == 2
    assert evaluate(3, "--out", str(results), "--overwrite") == 0 and limit() == 3
    capsys.readouterr()
    assert own() == before
    results.write_text('{"limit": 0}\n', encoding="utf-8")  # edited since: the user's now
    os.utime(results, ns=(1, 1))
    for extra in ([], ["--overwrite"]):
        assert evaluate(2, *extra) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: the default --out {results} exists and changed since lmlab wrote it")
        assert err.count("\n") == 1 and "choose a new --out path" in err and "inside the" not in err, err
    assert limit() == 0
    mine = run / "checkpoints" / "notes.json"  # a file of the user's beside the checkpoints
    mine.write_text("mine\n", encoding="utf-8")
    assert evaluate(1, "--out", str(mine), "--overwrite") == 2
    err = capsys.readouterr().err
    assert f"--out {mine} exists and was not written by lmlab" in err, err
    assert mine.read_text(encoding="utf-8") == "mine\n"


def test_the_results_never_go_over_or_into_an_input_whatever_overwrite_says(setup, tmp_path, capsys):
    """--out the checkpoint's config.json or the task YAML being read, --overwrite or not: refused in
    one line before anything is loaded, and both inputs are left as they were."""
    root, tasks = setup["root"], setup["tasks"]
    ck = tmp_path / "ck"
    shutil.copytree(root / "ck", ck)
    before = {p: p.read_bytes() for p in [*ck.rglob("*"), *tasks.rglob("*")] if p.is_file()}
    cases = [
        (ck / "config.json", str(tasks / "mc.yaml"), "would be written inside the input --checkpoint"),
        (tasks / "mc.yaml", str(tasks / "mc.yaml"), "would replace the input --harness"),
        (tasks / "results.json", str(tasks), "would be written inside the input --harness"),
        (ck, str(tasks / "mc.yaml"), "would replace the input --checkpoint"),
    ]
    for out, harness, needle in cases:
        for overwrite in ([], ["--overwrite"]):
            argv = ["evaluate", "--checkpoint", str(ck), "--harness", harness, "--out", str(out), *overwrite]
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.startswith("error: ") and err.count("\n") == 1 and needle in err, err
        with pytest.raises(LmlabError, match=needle):
            run_harness(ck, harness, out=out, overwrite=True)  # the same rule from Python
    assert {p: p.read_bytes() for p in [*ck.rglob("*"), *tasks.rglob("*")] if p.is_file()} == before
    assert not (tasks / "results.json").exists()


def test_the_harness_own_hf_model_on_the_export_gives_the_same_numbers(setup):
    """All three request kinds: our adapter (lmlab's forward pass) against lm_eval's HFLM running
    transformers on ``lmlab export``'s directory of the same weights."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from lmlab.interop import hf_export

    root, tasks = setup["root"], setup["tasks"]
    hf_export(setup["model"], root / "hf")
    names = ["lmlab_mc", "lmlab_ppl", "lmlab_gen"]
    ours = run_harness(root / "ck", str(tasks), out=root / "all.json")
    assert sorted(ours["tasks"]) == sorted(names)  # a folder gives every task in it
    theirs = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(root / "hf"), "device": "cpu", "dtype": "float32"},
        tasks=names, task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True, batch_size=1)
    for name in names:
        a = sorted(ours["samples"][name], key=lambda s: s["doc_id"])
        b = sorted(theirs["samples"][name], key=lambda s: s["doc_id"])
        assert len(a) == len(b) > 0
        for x, y in zip(a, b, strict=True):
            if name == "lmlab_gen":
                assert x["filtered_resps"] == y["filtered_resps"]
            elif name == "lmlab_ppl":
                assert x["filtered_resps"][0] == pytest.approx(y["filtered_resps"][0], rel=1e-5)
            else:
                theirs_ll = [r[0] for r in y["filtered_resps"]]
                assert [r[0] for r in x["filtered_resps"]] == pytest.approx(theirs_ll, abs=1e-4)
                assert [r[1] for r in x["filtered_resps"]] == [r[1] for r in y["filtered_resps"]]
        for metric, value in theirs["results"][name].items():
            if isinstance(value, float) and "stderr" not in metric and math.isfinite(value):
                assert ours["results"][name][metric] == pytest.approx(value, rel=1e-4), (name, metric)


def test_cli_prints_and_writes_the_results_and_refuses_bad_input_in_one_line(setup, tmp_path, capsys):
    root = setup["root"]
    mc = str(setup["tasks"] / "mc.yaml")
    out = tmp_path / "r.json"
    assert main(["evaluate", "--checkpoint", str(root / "ck"), "--harness", mc, "--out", str(out),
                 "--max-examples", "3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text(encoding="utf-8"))
    assert printed.pop("baseline") == written["baseline"]  # the chance level, a key of its own
    assert printed == written["results"]
    assert printed["lmlab_mc"]["sample_len"] == 3
    fresh = ["--out", str(tmp_path / "new.json")]
    no_data = tmp_path / "no_data.yaml"  # a task without a dataset_path: lm_eval's TypeError before
    no_data.write_text("task: lmlab_no_data\noutput_type: loglikelihood\ndoc_to_text: q\ndoc_to_target: a\n")
    cases = [
        (["--harness", str(tmp_path / "missing.yaml"), *fresh], "does not exist"),
        (["--harness", mc, "--out", str(out)], "already exists (results lmlab wrote); pass --overwrite"),
        (["--harness", mc, "--data", mc], "--data cannot be combined with --harness"),
        (["--out", str(out)], "--out applies only with --harness"),
        (["--harness", str(no_data), *fresh], "could not load the task(s) lmlab_no_data"),
    ]
    for extra, needle in cases:
        assert main(["evaluate", "--checkpoint", str(root / "ck"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "new.json").exists()


def test_num_fewshot_beyond_the_task_documents_or_negative_is_one_line_before_the_model(setup, tmp_path,
                                                                                        capsys, monkeypatch):
    """--num-fewshot 100000 on a task of a few documents reached the harness' 'Sample larger than
    population' (the catch-all error) after the model was loaded: now one line naming K and the
    task's document count (icl.evaluate.check_fewshot, the ICL API's rule), before the weights."""
    import lmlab.loading

    monkeypatch.setattr(lmlab.loading, "load_model",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("model loaded")))
    mc = str(setup["tasks"] / "mc.yaml")
    assert main(["evaluate", "--checkpoint", str(setup["root"] / "ck"), "--harness", mc,
                 "--num-fewshot", "100000", "--out", str(tmp_path / "h.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: K=100,000 few-shot examples asked for, but task 'lmlab_mc' has "
                          f"{len(QUESTIONS)} document(s)") and err.count("\n") == 1, err
    with pytest.raises(LmlabError, match=r"run_harness.s num_fewshot must be at least 0 \(got -1\)"):
        run_harness(setup["root"] / "ck", mc, num_fewshot=-1, out=tmp_path / "h.json")
    assert not (tmp_path / "h.json").exists()


def test_an_unknown_task_name_is_one_line(setup, monkeypatch):
    import lm_eval.tasks

    real = lm_eval.tasks.TaskManager
    # the harness' own index of its ~15,000 tasks takes 20 s to build: here, only the local folder
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda include_path=None, include_defaults=True:
                        real(include_path=str(setup["tasks"]), include_defaults=False))
    with pytest.raises(LmlabError, match="^unknown harness task 'no_such_task'; see `lm_eval ls tasks`"):
        run_harness(setup["root"] / "ck", f"lmlab_mc,no_such_task,{setup['tasks'] / 'mc.yaml'}",
                    out=setup["root"] / "never.json")
    assert not (setup["root"] / "never.json").exists()


def test_an_lstm_language_model_is_scored_as_well(setup, tmp_path):
    tok = setup["tok"]
    torch.manual_seed(1)
    model = build_model(get_preset("lstm-tiny", vocab_size=tok.vocab_size)).eval()
    model.tokenizer = tok
    model.save(tmp_path / "lstm")
    result = run_harness(tmp_path / "lstm", str(setup["tasks"] / "mc.yaml"), limit=2)
    got = [r[0] for s in sorted(result["samples"]["lmlab_mc"], key=lambda s: s["doc_id"])
           for r in s["filtered_resps"]]
    reference = [_choice_logprob(model, tok, q, c) for q, choices, _ in QUESTIONS[:2] for c in choices]
    assert got == pytest.approx(reference, abs=1e-4)
    assert (tmp_path / "lstm.harness.json").is_file()


def test_models_without_next_token_probabilities_are_refused_in_one_line(tmp_path, setup):
    tok = setup["tok"]
    for preset, needle in (("bert-tiny", "has no next-token probabilities"),
                           ("t5-tiny", "backend=seq2seq")):
        model = build_model(get_preset(preset, vocab_size=tok.vocab_size))
        model.tokenizer = tok
        model.save(tmp_path / preset)
        with pytest.raises(LmlabError, match=needle):
            run_harness(tmp_path / preset, str(setup["tasks"] / "mc.yaml"))
        assert not (tmp_path / f"{preset}.harness.json").exists()


def test_a_missing_lm_eval_is_one_line_naming_the_extra(monkeypatch, setup):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "lm_eval" else real(name, *a))
    with pytest.raises(LmlabError, match=r"needs the lm-eval package .*; pip install 'lmlab\[eval\]'$"):
        run_harness(setup["root"] / "ck", "lmlab_mc")


def test_a_multiple_choice_score_comes_with_its_chance_level_and_is_flagged_at_it(setup, tmp_path, capsys):
    """probe10b #4: `evaluate --harness` printed a two-choice quiz's 0.5 with nothing saying it is
    chance. A multiple-choice task's trivial baseline is the mean of 1/choices over its documents;
    it is printed beside the score, kept under "baseline" in the JSON, and a score at it is flagged
    as finetune flags one at its baseline. A task of another kind gets none (not an invented one)."""
    rows = [{"question": "ROMEO: But soft, what light", "choices": ["breaks", "sleeps"], "label": 0},
            {"question": "HAMLET: To be, or not to", "choices": ["be", "sing", "go", "run"], "label": 0}]
    (tmp_path / "quiz.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    mc = (setup["tasks"] / "mc.yaml").read_text(encoding="utf-8")
    quiz = tmp_path / "quiz.yaml"
    mc = mc.replace("lmlab_mc", "lmlab_quiz").replace(str(setup["root"] / "mc.jsonl"),
                                                      str(tmp_path / "quiz.jsonl"))
    quiz.write_text(mc, encoding="utf-8")
    out = tmp_path / "r.json"
    assert main(["evaluate", "--checkpoint", str(setup["root"] / "ck"), "--harness",
                 f"{quiz},{setup['tasks'] / 'ppl.yaml'}", "--out", str(out), "--max-examples", "2"]) == 0
    captured = capsys.readouterr()
    printed, written = json.loads(captured.out), json.loads(out.read_text(encoding="utf-8"))
    chance = (1 / 2 + 1 / 4) / 2
    assert written["baseline"] == printed["baseline"] == {
        "lmlab_quiz": {"answer": "chance, a uniform guess among each question's choices",
                       "results": {"acc,none": pytest.approx(chance)}}}   # none for the perplexity task
    acc = written["results"]["lmlab_quiz"]["acc,none"]
    assert f"lmlab_quiz acc {acc:.4f} (chance {chance:.4f}) (2 documents)" in captured.err
    flagged = f"warning: lmlab_quiz acc {acc:.4f} is at the trivial baseline" in captured.err
    assert flagged == (acc <= chance + 0.005), captured.err


def test_the_chance_warning_and_headline_from_a_record():
    from lmlab.icl.harness import CHANCE, chance_warnings, headline

    record = {"results": {"quiz": {"acc,none": 0.5, "acc_stderr,none": 0.1},
                          "ppl": {"bits_per_byte,none": 3.0}},
              "baseline": {"quiz": {"answer": CHANCE, "results": {"acc,none": 0.5}}},
              "n-samples": {"quiz": {"effective": 2}}}
    assert headline(record) == "quiz acc 0.5000 (chance 0.5000) (2 documents); ppl bits_per_byte 3.0000"
    assert chance_warnings(record) == [f"quiz acc 0.5000 is at the trivial baseline ({CHANCE}: 0.5000): the "
                                       "model does no better than guessing"]
    record["results"]["quiz"]["acc,none"] = 0.75
    assert chance_warnings(record) == []
