"""The documented Python API refuses a wrong kind of argument in one line (LmlabError), at the entry
of each function, by the shared checks of ``lmlab.arguments``: None or a number where a path goes, a
bare string where a list of strings goes (``path_argument``, ``text_list_argument``,
``path_list_argument``); a path or a tokenizer where a model goes (``model_argument``), a path or a
model where a tokenizer goes (``tokenizer_argument``); a list, a float tensor, a 3-D tensor or ids
outside the vocabulary where ids go (``tensor_argument``, ``ids_argument``); a number out of its
range or of the wrong kind (``number_argument``: the ranges of ``lmlab.values`` that the flags use)."""

from __future__ import annotations

import pytest

from lmlab.errors import LmlabError

TEXT = ["to be or not to be, that is the question " * 20]


@pytest.fixture(scope="module")
def tok():
    from lmlab.tokenizers import train_tokenizer

    return train_tokenizer("bytelevel", TEXT, vocab_size=270)


@pytest.fixture(scope="module")
def model(tok):
    from lmlab.models import build_model, get_preset

    return build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size))


def _calls(tmp):
    from lmlab.data import TokenShards, prepare_shards
    from lmlab.finetune import finetune
    from lmlab.lab import load_grid, run_grid
    from lmlab.loading import load_model
    from lmlab.tokenizers import load_tokenizer, train_tokenizer
    from lmlab.train import pretrain

    small = tmp / "small.txt"
    small.write_text("to be or not to be\n", encoding="utf-8")
    cfg = {"model": {"preset": "gpt2-tiny"}, "objective": {"name": "clm"}, "data": {"train": [str(small)]}}
    return {
        "load_tokenizer(None)": (lambda t, m: load_tokenizer(None),
                                 "must be a path (str or os.PathLike), got NoneType"),
        "load_tokenizer(5)": (lambda t, m: load_tokenizer(5), "got int 5"),
        "tok.save(None)": (lambda t, m: t.save(None), "tokenizer.save's directory must be a path"),
        "model.save(None)": (lambda t, m: m.save(None), "model.save's directory must be a path"),
        "load_model(None)": (lambda t, m: load_model(None), "load_model's path must be a path"),
        "TokenShards(None)": (lambda t, m: TokenShards(None), "TokenShards' directory must be a path"),
        "prepare_shards(None, ...)": (lambda t, m: prepare_shards(None, [small], tmp / "o"),
                                      "tokenizer must be"),
        "prepare_shards(tok, [None], out)": (lambda t, m: prepare_shards("tok", [None], tmp / "o"),
                                             "inputs[0] must be a path"),
        "prepare_shards(tok, files, None)": (lambda t, m: prepare_shards("tok", [small], None),
                                             "out must be"),
        "prepare_shards(tok, 'small.txt', out)": (lambda t, m: prepare_shards("tok", str(small), tmp / "o"),
                                                  "pass a list: ["),
        "pretrain(cfg, None)": (lambda t, m: pretrain(cfg, None), "pretrain's out_dir must be a path"),
        "pretrain(5, out)": (lambda t, m: pretrain(5, tmp / "run"), "the config (a recipe path"),
        "pretrain(overrides=str)": (lambda t, m: pretrain(cfg, tmp / "run", overrides="train.max_steps=1"),
                                    'pass a list: ["train.max_steps=1"]'),
        "load_grid(None)": (lambda t, m: load_grid(None), "load_grid's source"),
        "load_grid(overrides=str)": (lambda t, m: load_grid({}, "budget.tokens=5"), "pass a list"),
        "run_grid(G, None)": (lambda t, m: run_grid(None, None), "run_grid's grid must be a Grid"),
        "train_tokenizer(str)": (lambda t, m: train_tokenizer("bpe", "low lower", num_merges=4),
                                 'pass a list: ["low lower"]'),
        "finetune(None, ...)": (lambda t, m: finetune(None, "sst2", small, small, tmp / "o"),
                                "finetune's checkpoint (a directory or a model) must be a path"),
        "finetune(m, task, None, ...)": (lambda t, m: finetune(m, "sst2", None, small, tmp / "o"),
                                         "finetune's train must be a path"),
        "finetune(..., out=5)": (lambda t, m: finetune(m, "sst2", small, small, 5), "finetune's out must be"),
        "train_tokenizer(5)": (lambda t, m: train_tokenizer("bpe", 5, num_merges=4), "got int 5"),
        "special_tokens=str": (lambda t, m: train_tokenizer("bpe", TEXT, num_merges=4,
                                                             special_tokens="[CLS]"),
                               'special_tokens must be a list of strings, got the string'),
        # numbers among the texts (a TypeError from deep inside the learner before)
        "train_tokenizer([1, 2, 3])": (lambda t, m: train_tokenizer("bytelevel", [1, 2, 3], vocab_size=280),
                                       "train_tokenizer's texts[0] must be a string, got int 1"),
        "train_tokenizer(generator of ints)": (
            lambda t, m: train_tokenizer("bytelevel", (x for x in ["low", 7]), vocab_size=280),
            "train_tokenizer's texts[1] must be a string, got int 7"),
    }




@pytest.mark.parametrize("name", [
    "load_tokenizer(None)", "load_tokenizer(5)", "tok.save(None)", "model.save(None)", "load_model(None)",
    "TokenShards(None)", "prepare_shards(None, ...)", "prepare_shards(tok, [None], out)",
    "prepare_shards(tok, files, None)", "prepare_shards(tok, 'small.txt', out)", "pretrain(cfg, None)",
    "pretrain(5, out)", "pretrain(overrides=str)", "load_grid(None)", "load_grid(overrides=str)",
    "run_grid(G, None)", "finetune(None, ...)", "finetune(m, task, None, ...)", "finetune(..., out=5)",
    "train_tokenizer(str)", "train_tokenizer(5)", "special_tokens=str", "train_tokenizer([1, 2, 3])",
    "train_tokenizer(generator of ints)",
])
def test_a_wrong_kind_of_argument_is_a_one_line_lmlab_error(name, tok, model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    call, words = _calls(tmp_path)[name]
    with pytest.raises(LmlabError) as e:
        call(tok, model)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists() and not (tmp_path / "o").exists()  # refused before any work


def test_the_helpers_accept_what_they_should(tmp_path):
    from lmlab.arguments import path_argument, path_list_argument, text_list_argument

    assert path_argument(tmp_path, "x") == tmp_path and str(path_argument("a/b", "x")) == "a/b"
    assert text_list_argument(("a", "b"), "x") == ["a", "b"]
    assert path_list_argument(["a", tmp_path], "x")[1] == tmp_path
    with pytest.raises(LmlabError, match=r"x must be a path, got ''"):
        path_argument("", "x")
    with pytest.raises(LmlabError, match=r"x\[1\] must be a string, got int 3"):
        text_list_argument(["a", 3], "x")


# ---------------------------------------------------------------------------------------------
# models, tokenizers, tensors and numbers: each call below raised a TypeError, AttributeError,
# IndexError or RuntimeError from deep inside, or silently did something else, before the checks


def _kinds(tmp, tok, model):
    """name -> (call, words its one-line message holds)."""
    import torch

    from lmlab.adapt import apply_method, trainable_parameters
    from lmlab.adapt.distill import kd_loss, make_student
    from lmlab.adapt.lora import merge_lora
    from lmlab.adapt.multi import MultiAdapterModel, generate_variants
    from lmlab.adapt.peft_io import save_peft
    from lmlab.adapt.prune import PruneMasks, nonzero_parameters, prune_model
    from lmlab.adapt.quantize import linear_weight_bytes, quantize_model
    from lmlab.data import prepare_shards
    from lmlab.data.batch import TokenBatch
    from lmlab.finetune import evaluate, finetune, load_finetuned
    from lmlab.generate import generate
    from lmlab.generate.json_backend import json_schema_constraint
    from lmlab.icl import PromptTemplate, evaluate_icl
    from lmlab.icl.harness import run_harness
    from lmlab.interop import hf_export
    from lmlab.loading import load_model
    from lmlab.losses import binary_token_loss, causal_lm_loss, classification_loss, head_loss, token_loss
    from lmlab.models import build_model, get_preset
    from lmlab.models.attention_masks import MaskSpec, kernel_mask
    from lmlab.models.flops import approx_training_flops, training_flops
    from lmlab.models.rnn import ELMoBiLM, ScalarMix
    from lmlab.objectives import get_objective
    from lmlab.objectives.elmo import bilm_losses
    from lmlab.objectives.masking import document_ids, rand, select_tokens, special_mask
    from lmlab.runtime import choose_threads
    from lmlab.scaling import RunPoint, fit_runs
    from lmlab.train import pretrain

    V = tok.vocab_size
    ids = torch.tensor([tok.encode("to be")])
    logits = torch.randn(1, ids.shape[1], V)
    small = tmp / "small.txt"
    small.write_text("to be or not to be\n", encoding="utf-8")
    cfg = {"model": {"preset": "gpt2-tiny"}, "objective": {"name": "clm"}, "data": {"train": [str(small)]}}
    gen = {"max_new_tokens": 2}
    return {
        # the model's own forward and the losses of the README
        "model(input_ids=list)": (lambda: model(input_ids=[[1, 2]]), "input_ids must be a torch tensor"),
        "model(float ids)": (lambda: model(input_ids=ids.float()), "input_ids must hold integer ids"),
        "causal_lm_loss(list, ids)": (lambda: causal_lm_loss(logits.tolist(), ids),
                                      "causal_lm_loss's logits must be a torch tensor"),
        "causal_lm_loss(logits, float)": (lambda: causal_lm_loss(logits, ids.float()),
                                          "must hold integer ids"),
        "causal_lm_loss(short labels)": (lambda: causal_lm_loss(logits, ids[:, :1]),
                                         "causal_lm_loss's labels have shape (1, 1)"),
        "causal_lm_loss(labels outside)": (lambda: causal_lm_loss(logits, ids + 1000),
                                           f"is out of range for the logits' {V} classes"),
        "causal_lm_loss(2-D logits)": (lambda: causal_lm_loss(logits[0], ids),
                                       "must be [batch, length, vocab]"),
        "token_loss(labels outside)": (lambda: token_loss(logits, ids + 1000), "token_loss's label"),
        "classification_loss(list)": (lambda: classification_loss(torch.randn(2, 3), [0, 1]),
                                      "classification_loss's labels must be a torch tensor"),
        "classification_loss(class 7 of 3)": (lambda: classification_loss(torch.randn(2, 3),
                                                                          torch.tensor([0, 7])),
                                              "label 7 is out of range for the logits' 3 classes"),
        "binary_token_loss(shapes)": (lambda: binary_token_loss(torch.randn(2, 3), torch.ones(2, 4)),
                                      "binary_token_loss's labels have shape (2, 4)"),
        "head_loss(5, ...)": (lambda: head_loss(5, logits, ids), "head_loss's head must be a head name"),
        # build_model and its configs
        "build_model(heads=5)": (lambda: build_model(get_preset("gpt2-tiny"), heads=5),
                                 "build_model's heads must be a list of strings, got int 5"),
        "build_model(heads='lm')": (lambda: build_model(get_preset("gpt2-tiny"), heads="lm"),
                                    'pass a list: ["lm"]'),
        "build_model('runs/gpt')": (lambda: build_model("runs/gpt"), "use load_model('runs/gpt')"),
        "get_preset(vocab_size='x')": (lambda: get_preset("gpt2-tiny", vocab_size="x"), "vocab_size must be"),
        "ELMoBiLM(dict)": (lambda: ELMoBiLM({}), "ELMoBiLM needs a RNNConfig, got dict"),
        "ELMoBiLM(vocab=str)": (lambda: ELMoBiLM(get_preset("elmo-tiny", vocab_size=5), vocab="abcde"),
                                'pass a list: ["abcde"]'),
        "ScalarMix('x')": (lambda: ScalarMix("x"), "ScalarMix's num_layers must be a whole number"),
        "training_flops(seq_len='x')": (lambda: training_flops(get_preset("gpt2-tiny"), "x"),
                                        "forward_flops' seq_len must be a whole number"),
        "approx_training_flops('x')": (lambda: approx_training_flops("x", 1e9), "n_params must be a number"),
        "approx_training_flops(-1)": (lambda: approx_training_flops(-1, 1e9), "n_params must be at least 0"),
        # generate
        "generate(path)": (lambda: generate("my-gpt", ids),
                           "generate's model must be a model (a torch.nn.Module), got str 'my-gpt'; load it"),
        "generate(tokenizer)": (lambda: generate(tok, ids), "got a tokenizer (ByteLevelBPETokenizer)"),
        "generate(None)": (lambda: generate(None, ids), "generate's model must be a model"),
        "generate(m, 'text')": (lambda: generate(model, "to be", **gen),
                                "the prompt (input_ids) must be a torch tensor"),
        "generate(m, ['text'])": (lambda: generate(model, ["to be"], **gen),
                                  "must be a tensor or a list of lists"),
        "generate(temperature=-1)": (lambda: generate(model, ids, temperature=-1.0, **gen),
                                     "temperature must be at least 0 (got -1.0)"),
        "generate(temperature='hot')": (lambda: generate(model, ids, do_sample=True, temperature="hot",
                                                         **gen),
                                        "temperature must be a number (got 'hot')"),
        "generate(top_p='x')": (lambda: generate(model, ids, do_sample=True, top_p="x", **gen),
                                "top_p must be a number"),
        "generate(top_k=True)": (lambda: generate(model, ids, do_sample=True, top_k=True, **gen),
                                 "top_k must be"),
        "generate(repetition_penalty='x')": (lambda: generate(model, ids, repetition_penalty="x", **gen),
                                             "repetition_penalty must be a number"),
        "generate(length_penalty='x')": (lambda: generate(model, ids, num_beams=2, length_penalty="x", **gen),
                                         "length_penalty must be a number"),
        "generate(seed=-1)": (lambda: generate(model, ids, do_sample=True, seed=-1, **gen),
                              "seed must be at least 0"),
        "generate(seed='x')": (lambda: generate(model, ids, do_sample=True, seed="x", **gen), "seed must be"),
        "generate(eos_token_id='x')": (lambda: generate(model, ids, eos_token_id="x", **gen),
                                       "eos_token_id must be a token id"),
        "generate(eos_token_id=1.5)": (lambda: generate(model, ids, eos_token_id=1.5, **gen),
                                       "eos_token_id must be a token id (a whole number), got float 1.5"),
        "generate(stop_sequences=[1, 2])": (lambda: generate(model, ids, stop_sequences=[1, 2], **gen),
                                            "stop_sequences[0] must be a list of token ids"),
        "generate(pad_token_id=-1)": (lambda: generate(model, ids, pad_token_id=-1, **gen),
                                      "pad_token_id -1 is out of range"),
        "generate(attention_mask=str)": (lambda: generate(model, ids, "mask", **gen),
                                         "attention_mask must be a torch tensor"),
        "generate(generator=5)": (lambda: generate(model, ids, do_sample=True, generator=5, **gen),
                                  "generator must be a torch.Generator"),
        "generate(do_sample='no')": (lambda: generate(model, ids, do_sample="no", **gen),
                                     "do_sample must be True or False, got str 'no'"),
        "generate(use_cache='no')": (lambda: generate(model, ids, use_cache="no", **gen),
                                     "use_cache must be True"),
        "generate(logits_processors=fn)": (lambda: generate(model, ids, logits_processors=lambda s, x: x,
                                                            **gen),
                                           "pass a list: [processor]"),
        "json_schema_constraint(tokenizer=path)": (
            lambda: json_schema_constraint({"type": "string"}, "tok", prompt_len=1, max_new_tokens=10),
            "load_tokenizer('tok')"),
        # saving, loading and exporting
        "model.save(tokenizer=5)": (lambda: model.save(tmp / "o", tokenizer=5),
                                    "model.save's tokenizer must be"),
        "model.save(tokenizer=path)": (lambda: model.save(tmp / "o", tokenizer="tokdir"),
                                       "load_tokenizer('tokdir')"),
        "load_model(tokenizer=5)": (lambda: load_model(tmp / "o", tokenizer=5),
                                    "load_model's tokenizer must be"),
        "hf_export(path)": (lambda: hf_export("my-gpt", tmp / "o"), "hf_export's model must be a model"),
        "hf_export(model, None)": (lambda: hf_export(model, None), "hf_export's directory must be a path"),
        "hf_export(tokenizer=path)": (lambda: hf_export(model, tmp / "o", tokenizer="tokdir"),
                                      "hf_export's tokenizer must be a tokenizer"),
        # adaptation and compression
        "apply_method(path)": (lambda: apply_method("my-gpt", "lora"),
                               "apply_method's model must be a model"),
        "apply_method(options=list)": (lambda: apply_method(model, "lora", ["r=4"]),
                                       "apply_method's options must be a dict"),
        "trainable_parameters(path)": (lambda: trainable_parameters("my-gpt"), "trainable_parameters' model"),
        "quantize_model(tokenizer)": (lambda: quantize_model(tok), "quantize_model's model must be a model"),
        "linear_weight_bytes(None)": (lambda: linear_weight_bytes(None), "linear_weight_bytes' model"),
        "prune_model(path)": (lambda: prune_model("my-gpt", 0.5), "prune_model's model must be a model"),
        "nonzero_parameters(path)": (lambda: nonzero_parameters("my-gpt"), "nonzero_parameters' model"),
        "PruneMasks(list)": (lambda: PruneMasks([1]), "PruneMasks' masks must be a dict"),
        "merge_lora(path)": (lambda: merge_lora("my-gpt"), "merge_lora's model must be a model"),
        "make_student(n_layers=-1)": (lambda: make_student(model, -1),
                                      "make_student's n_layers must be at least 1"),
        "kd_loss(list)": (lambda: kd_loss(logits.tolist(), logits, None),
                          "student_logits must be a torch tensor"),
        "save_peft(path)": (lambda: save_peft("my-gpt", tmp / "o"), "save_peft's model must be a model"),
        "MultiAdapterModel(variants=list)": (lambda: MultiAdapterModel(model, ["a"]),
                                             "MultiAdapterModel's variants must be a dict"),
        "generate_variants(plain model)": (lambda: generate_variants(model, ids, None, ["a"]),
                                           "generate_variants' model must be a MultiAdapterModel"),
        # in-context learning, fine-tuning, pretraining, scaling
        "evaluate_icl(tokenizer, model)": (lambda: evaluate_icl(tok, model, [("a", "b")], [], 0),
                                           "evaluate_icl's model must be a model"),
        "evaluate_icl(model, path)": (lambda: evaluate_icl(model, "tokdir", [("a", "b")], [], 0),
                                      "evaluate_icl's tokenizer must be a tokenizer"),
        "PromptTemplate(5)": (lambda: PromptTemplate(5), "PromptTemplate's description must be a string"),
        "run_harness(model)": (lambda: run_harness(model, "hellaswag"),
                               "run_harness's checkpoint must be a path"),
        "finetune(tokenizer=5)": (lambda: finetune(model, "sst2", small, small, tmp / "o", tokenizer=5),
                                  "finetune's tokenizer must be a tokenizer or its path"),
        "finetune(method_options=list)": (
            lambda: finetune(model, "sst2", small, small, tmp / "o", method="lora", method_options=["r=4"]),
            "finetune's method_options must be a dict"),
        "evaluate(model)": (lambda: evaluate(model, small), "evaluate's checkpoint must be a path"),
        "load_finetuned(None)": (lambda: load_finetuned(None), "load_finetuned's checkpoint must be a path"),
        "prepare_shards(seed='x')": (lambda: prepare_shards("tok", [small], tmp / "o", seed="x"),
                                     "prepare_shards' seed must be a whole number"),
        "pretrain(resume='yes')": (lambda: pretrain(cfg, tmp / "run", resume="yes"),
                                   "pretrain's resume must be True or False"),
        "pretrain(log=5)": (lambda: pretrain(cfg, tmp / "run", log=5), "pretrain's log must be a function"),
        "fit_runs('runs')": (lambda: fit_runs("runs"), "fit_runs' runs must be a list of RunPoint"),
        "RunPoint(n_params='x')": (lambda: RunPoint("a", "x", 1e8, 3.0), "n_params must be a number"),
        "choose_threads('x')": (lambda: choose_threads("x"), "thread count must be a whole number"),
        # tokenizers and the objectives' toolbox (docs/extending.md)
        "tok.tokenize(5)": (lambda: tok.tokenize(5), "tokenize takes a string, got int"),
        "TokenBatch(lists)": (lambda: TokenBatch([[1]], [[0]], [[0]]),
                              "TokenBatch's input_ids must be a torch tensor"),
        "document_ids(tensor)": (lambda: document_ids(ids), "document_ids' batch must be a TokenBatch"),
        "rand(generator=None)": (lambda: rand((2, 2), None), "rand's generator must be a torch.Generator"),
        "select_tokens(list)": (lambda: select_tokens([True], 0.5, torch.Generator()),
                                "must be a torch tensor"),
        "select_tokens(rate=2)": (lambda: select_tokens(torch.ones(2, 2, dtype=torch.bool), 2.0,
                                                        torch.Generator()),
                                  "select_tokens' rate must be at most 1"),
        "special_mask(list)": (lambda: special_mask([1, 2], torch.tensor([1])), "special_mask's ids"),
        "bilm_losses(lists)": (lambda: bilm_losses([1], [1], [1], [1]),
                               "bilm_losses' logits must be a torch tensor"),
        "get_objective(5)": (lambda: get_objective(5), "get_objective's name must be an objective name"),
        "objective(tokenizer=5)": (lambda: get_objective("clm")(5),
                                   "CausalLM's tokenizer must be a tokenizer"),
        "MaskSpec(padding=list)": (lambda: MaskSpec(padding=[[1, 1]]),
                                   "MaskSpec's padding must be a torch tensor"),
        "kernel_mask(spec=5)": (lambda: kernel_mask(5, 2), "kernel_mask's spec must be a MaskSpec"),
    }


KINDS = [
    "model(input_ids=list)", "model(float ids)", "causal_lm_loss(list, ids)", "causal_lm_loss(logits, float)",
    "causal_lm_loss(short labels)", "causal_lm_loss(labels outside)", "causal_lm_loss(2-D logits)",
    "token_loss(labels outside)", "classification_loss(list)", "classification_loss(class 7 of 3)",
    "binary_token_loss(shapes)", "head_loss(5, ...)", "build_model(heads=5)", "build_model(heads='lm')",
    "build_model('runs/gpt')", "get_preset(vocab_size='x')", "ELMoBiLM(dict)", "ELMoBiLM(vocab=str)",
    "ScalarMix('x')", "training_flops(seq_len='x')", "approx_training_flops('x')",
    "approx_training_flops(-1)", "generate(path)", "generate(tokenizer)", "generate(None)",
    "generate(m, 'text')", "generate(m, ['text'])", "generate(temperature=-1)", "generate(temperature='hot')",
    "generate(top_p='x')", "generate(top_k=True)", "generate(repetition_penalty='x')",
    "generate(length_penalty='x')", "generate(seed=-1)", "generate(seed='x')", "generate(eos_token_id='x')",
    "generate(eos_token_id=1.5)", "generate(stop_sequences=[1, 2])", "generate(pad_token_id=-1)",
    "generate(attention_mask=str)", "generate(generator=5)", "generate(do_sample='no')",
    "generate(use_cache='no')", "generate(logits_processors=fn)", "json_schema_constraint(tokenizer=path)",
    "model.save(tokenizer=5)", "model.save(tokenizer=path)", "load_model(tokenizer=5)", "hf_export(path)",
    "hf_export(model, None)", "hf_export(tokenizer=path)", "apply_method(path)", "apply_method(options=list)",
    "trainable_parameters(path)", "quantize_model(tokenizer)", "linear_weight_bytes(None)",
    "prune_model(path)", "nonzero_parameters(path)", "PruneMasks(list)", "merge_lora(path)",
    "make_student(n_layers=-1)", "kd_loss(list)", "save_peft(path)", "MultiAdapterModel(variants=list)",
    "generate_variants(plain model)", "evaluate_icl(tokenizer, model)", "evaluate_icl(model, path)",
    "PromptTemplate(5)", "run_harness(model)", "finetune(tokenizer=5)", "finetune(method_options=list)",
    "evaluate(model)", "load_finetuned(None)", "prepare_shards(seed='x')", "pretrain(resume='yes')",
    "pretrain(log=5)", "fit_runs('runs')", "RunPoint(n_params='x')", "choose_threads('x')", "tok.tokenize(5)",
    "TokenBatch(lists)", "document_ids(tensor)", "rand(generator=None)", "select_tokens(list)",
    "select_tokens(rate=2)", "special_mask(list)", "bilm_losses(lists)", "get_objective(5)",
    "objective(tokenizer=5)", "MaskSpec(padding=list)", "kernel_mask(spec=5)",
]


def test_every_case_is_walked(tok, model, tmp_path):
    assert sorted(_kinds(tmp_path, tok, model)) == sorted(KINDS)


@pytest.mark.parametrize("name", KINDS)
def test_a_wrong_model_tokenizer_tensor_or_number_is_a_one_line_lmlab_error(name, tok, model, tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    call, words = _kinds(tmp_path, tok, model)[name]
    with pytest.raises(LmlabError) as e:
        call()
    message = str(e.value)
    assert words in message and "\n" not in message, message
    assert e.value.fix, message  # problem; fix
    assert " object at 0x" not in message  # a value is named briefly, never by its whole repr
    assert not (tmp_path / "run").exists() and not (tmp_path / "o").exists()  # refused before any work


def test_the_model_tokenizer_and_tensor_checks_accept_what_they_should(tok, model):
    import torch

    from lmlab import values
    from lmlab.arguments import (
        describe,
        ids_argument,
        model_argument,
        number_argument,
        tensor_argument,
        tokenizer_argument,
        trusted_inputs,
    )

    assert model_argument(model, "x") is model and tokenizer_argument(tok, "x") is tok
    assert str(tokenizer_argument("tok/", "x", path=True)) == "tok"
    assert ids_argument([[1, 2]], "x", 10, lists=True).dtype == torch.long
    assert tensor_argument(torch.ones(2), "x", dims=(1, 2), kind="float").shape == (2,)
    assert number_argument(values.TopP, 1, "x") == 1.0
    with pytest.raises(LmlabError, match="x token id 12 is out of range for the model's vocabulary of 10"):
        ids_argument(torch.tensor([[1, 12]]), "x", 10)
    with trusted_inputs():  # the host-reading range check is the trainer's to skip, not the kind checks
        assert ids_argument(torch.tensor([[1, 12]]), "x", 10).shape == (1, 2)
        with pytest.raises(LmlabError, match="must hold integer ids"):
            ids_argument(torch.tensor([[1.0]]), "x", 10)
    with pytest.raises(LmlabError, match=r"x must be a whole number \(got '10'\)"):
        number_argument(values.Count, "10", "x")  # strict: text is not a number in Python
    assert describe(model) == "a model (DecoderModel)" and describe(None) == "NoneType None"


def test_valid_prompts_still_generate_as_before(model):
    """A list of id lists, a 1-D prompt, an int temperature and greedy with a temperature of 0 are
    valid, as they were."""
    import torch

    from lmlab.generate import generate

    want = generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3)
    assert torch.equal(generate(model, [[1, 2, 3]], max_new_tokens=3), want)
    assert torch.equal(generate(model, torch.tensor([1, 2, 3]), max_new_tokens=3, temperature=0), want)
    sampled = generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=True, temperature=1,
                       seed=0)
    assert sampled.shape == (1, 6)


@pytest.mark.parametrize(("call", "words"), [
    (lambda t: __import__("lmlab.tokenizers").tokenizers.train_tokenizer("bytelevel", TEXT, vocab_size=True),
     "train_tokenizer's vocab_size must be a number, not true or false"),
    (lambda t: __import__("lmlab.tokenizers").tokenizers.train_tokenizer("bpe", TEXT, num_merges=False),
     "num_merges must be a number, not true or false"),
    (lambda t: t.encode_many(["a"], chunk_size=True), "chunk_size must be a number, not true or false"),
])
def test_a_bool_is_not_a_number_for_any_api_argument(tok, call, words):
    """vocab_size=True used to read as 1 ("True is too small"): the hand-made isinstance(int) checks
    now go through number_argument (lmlab.values), the one rule that refuses a bool for a number."""
    with pytest.raises(LmlabError) as e:
        call(tok)
    assert words in str(e.value) and "too small" not in str(e.value)


@pytest.mark.parametrize("ids", ["abc", b"abc"])
def test_decode_of_text_says_it_takes_ids(tok, ids):
    with pytest.raises(LmlabError) as e:
        tok.decode(ids)
    assert str(e.value).startswith("decode takes token ids, got ") and "out of range" not in str(e.value)
    assert "tokenizer.encode(text)" in e.value.fix
    with pytest.raises(LmlabError, match=r"decode takes token ids \(whole numbers\), got float 1.5"):
        tok.decode([1, 1.5])
    assert tok.decode(tok.encode("to be")) == "to be"
