"""The files lmlab reads back, crafted bad from a real tiny output, through the CLI: checkpoints,
pretraining resume states, metrics logs, token-shard indexes, datasets folders, fine-tuning resume
states and imported Hugging Face configs. Each is one line, ``error: <file>: <what is wrong>
(got <value>); <fix>``, exit code 2, never a traceback nor a silently wrong answer."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from assertions import assert_one_line_error

from lmlab.cli import main

CK = Path("checkpoints") / "step_2"
RESUME = ["pretrain", "--resume", "--set", "train.max_steps=3", "--out"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, data_dir) -> Path:
    """A 2-step pretraining run of a 1-layer GPT-2 on 30 KB of tiny Shakespeare (its own 300-token
    byte-level BPE), with its checkpoint at step 2."""
    root = tmp_path_factory.mktemp("schemas")
    text = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    (root / "train.txt").write_text(text[:30_000], encoding="utf-8")
    (root / "val.txt").write_text(text[-8_000:], encoding="utf-8")
    (root / "r.toml").write_text(f"""
[model]
preset = "gpt2-tiny"
d_model = 32
n_layers = 1
n_heads = 2
d_ff = 64
max_positions = 128
[objective]
name = "clm"
[data]
train = ["{root / 'train.txt'}"]
val = ["{root / 'val.txt'}"]
tokenizer = {{ algo = "bytelevel", vocab_size = 300 }}
[train]
max_steps = 2
batch_size = 2
seq_len = 32
eval_every = 2
eval_batches = 1
checkpoint_every = 2
threads = 1
precision = "fp32"
progress = "off"
""", encoding="utf-8")
    assert main(["pretrain", "--config", str(root / "r.toml"), "--out", str(root / "run")]) == 0
    return root / "run"


@pytest.fixture()
def mine(run, tmp_path, capsys) -> Path:
    """A copy of the run to damage (times kept, so it is still the run lmlab wrote)."""
    shutil.copytree(run, tmp_path / "run")
    capsys.readouterr()
    return tmp_path / "run"


def fails(capsys, args, *needles) -> str:
    assert main([str(a) for a in args]) == 2
    return assert_one_line_error(capsys, *needles)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def groups(state: dict) -> list[dict]:
    return state["optimizer"]["param_groups"]


# --------------------------------------------------------------------------------------------- resume
STATE_EDITS = {
    "string betas": (lambda s: groups(s)[0].update(betas="0.9"), "optimizer.param_groups.0.betas"),
    "betas of three": (lambda s: groups(s)[1].update(betas=[0.9, 0.95, 0.99]), "betas: must have at most 2"),
    "no param_groups": (lambda s: s["optimizer"].pop("param_groups"), "optimizer.param_groups: is missing"),
    "a params list one short": (lambda s: groups(s)[0]["params"].pop(), "optimizer.param_groups"),
    "a params list one long": (lambda s: groups(s)[0]["params"].append(20),
                               "optimizer.param_groups.0.params: must list 6"),
    "an id moved between groups": (lambda s: groups(s)[1]["params"].insert(0, groups(s)[0]["params"].pop()),
                                   "optimizer.param_groups.0.params: must list 6"),
    "a null learning rate": (lambda s: groups(s)[0].update(lr=None), "param_groups.0.lr"),
    "eps of 0": (lambda s: groups(s)[0].update(eps=0), "param_groups.0.eps"),
    "a string step": (lambda s: s.update(step="2"), "step: must be"),
    "a list as machine": (lambda s: s.update(machine=[1]), "machine: must be a valid dictionary"),
    "a machine precision unknown": (lambda s: s["machine"].update(precision="fp8"), "machine.precision"),
}


@pytest.mark.parametrize("case", STATE_EDITS)
def test_a_crafted_train_state_is_one_line_on_resume(mine, capsys, case):
    change, needle = STATE_EDITS[case]
    edit_json(mine / CK / "train_state.json", change)
    fails(capsys, RESUME + [mine], "train_state.json: ", needle, "start a new run")
    assert not (mine / "checkpoints" / "step_3").exists()


def test_a_moment_of_another_shape_is_one_line_on_resume(mine, capsys):
    from safetensors.torch import load_file, save_file

    path = mine / CK / "train_state.safetensors"
    tensors = load_file(path)
    tensors["state.0.exp_avg"] = torch.zeros(3)
    save_file(tensors, path)
    fails(capsys, RESUME + [mine], "train_state.safetensors: state.0.exp_avg: must have the parameter's "
          "shape", "(got (3,))")


METRICS = {
    "not UTF-8": (b'\xff\xfe{"step": 1}\n', "line 1 is not UTF-8"),
    "a scalar row": (b"5\n", "line 1 must be a valid dictionary (got 5)"),
    "a list row": (b"[1, 2]\n", "line 1 must be a valid dictionary"),
    "a row without step": (b'{"loss": 1.0}\n', "line 1: step: is missing"),
    "a text loss": (b'{"step": 1, "loss": "low"}\n', "line 1: loss: must be a number"),
    "a broken middle line": (b'{"step": 1, "lo\n{"step": 2}\n', "line 1 is not JSON"),
}


@pytest.mark.parametrize("case", METRICS)
def test_a_crafted_metrics_log_is_one_line_on_resume(mine, capsys, case):
    content, needle = METRICS[case]
    (mine / "metrics.jsonl").write_bytes(content)
    fails(capsys, RESUME + [mine], "metrics.jsonl: ", needle)
    assert (mine / "metrics.jsonl").read_bytes() == content  # the log is left as it was


def test_a_metrics_line_cut_off_by_a_kill_is_skipped(mine, capsys):
    from lmlab.train.metrics import read_metrics

    lines = (mine / "metrics.jsonl").read_bytes()
    (mine / "metrics.jsonl").write_bytes(lines + b'{"step": 3, "lo')
    assert [r["step"] for r in read_metrics(mine / "metrics.jsonl")] == [1, 2]


INDEX_EDITS = {
    "an empty shard list": (lambda i: i["splits"]["train"].update(shards=[]), "splits.train: its shards"),
    "a shard of no tokens": (lambda i: i["splits"]["train"]["shards"][0].update(tokens=0), "tokens: must be"),
    "a string vocab_size": (lambda i: i.update(vocab_size="300"), "vocab_size: must be a whole number"),
    "splits as a list": (lambda i: i.update(splits=[]), "splits: must be a valid dictionary"),
    "an unknown dtype": (lambda i: i.update(dtype="int8"), "dtype: "),
    "a null document count": (lambda i: i["splits"]["train"].update(documents=None), "documents: "),
}


@pytest.mark.parametrize("case", INDEX_EDITS)
def test_a_crafted_shards_index_is_one_line_on_resume(mine, capsys, case):
    change, needle = INDEX_EDITS[case]
    edit_json(mine / "data" / "train" / "index.json", change)
    fails(capsys, RESUME + [mine], "train/index.json: ", needle, "lmlab data prepare")


def test_token_ids_beyond_the_vocabulary_are_one_line_before_training(mine, capsys):
    shard = mine / "data" / "train" / "train_000.bin"
    ids = np.fromfile(shard, dtype="<u2")
    ids[100] = 4000  # the model has 300 embeddings
    ids.tofile(shard)
    fails(capsys, RESUME + [mine], "train_000.bin: holds token ids beyond the model's vocabulary of 300",
          "(got 4000)")
    assert not (mine / "checkpoints" / "step_3").exists()


# ----------------------------------------------------------------------------------- model config.json
CONFIG_EDITS = {
    "a null norm_eps": (lambda c: c["config"].update(norm_eps=None), "config.norm_eps: must be a number"),
    "a string norm_eps": (lambda c: c["config"].update(norm_eps="1e-5"), "config.norm_eps: "),
    "a negative norm_eps": (lambda c: c["config"].update(norm_eps=-1), "config.norm_eps: ", "(got -1)"),
    "a NaN norm_eps": (lambda c: c["config"].update(norm_eps=float("nan")), "config.norm_eps: "),
    "a zero width": (lambda c: c["config"].update(d_model=0), "config.d_model: "),
    "a string vocab_size": (lambda c: c["config"].update(vocab_size="300"), "config.vocab_size: "),
    "a dropout of 1.5": (lambda c: c["config"].update(dropout=1.5), "config.dropout: "),
    "a true layer count": (lambda c: c["config"].update(n_layers=True), "config.n_layers: "),
    "an unknown norm": (lambda c: c["config"].update(norm="batchnorm"), "config.norm: "),
    "a list as config": (lambda c: c.update(config=[]), "config: must be a valid dictionary"),
    "heads as text": (lambda c: c.update(heads="lm"), "heads: "),
    "another architecture": (lambda c: c.update(architecture="encoder"), "architecture: must be 'decoder'"),
}


@pytest.mark.parametrize("case", CONFIG_EDITS)
@pytest.mark.parametrize("command", ["generate", "export", "resume"])
def test_a_crafted_checkpoint_config_is_one_line(mine, capsys, tmp_path, case, command):
    change, *needles = CONFIG_EDITS[case]
    edit_json(mine / CK / "config.json", change)
    args = {"generate": ["generate", "--checkpoint", mine / CK, "--prompt", "To be", "--max-new-tokens", "3"],
            "export": ["export", "--checkpoint", mine / CK, "--out", tmp_path / "hf"],
            "resume": RESUME + [mine]}[command]
    fails(capsys, args, f"{CK / 'config.json'}: ", *needles)
    assert not (tmp_path / "hf").exists()


def test_every_model_config_field_has_its_schema():
    """A field added to a config class without a schema entry would be refused in every file."""
    import lmlab.models  # noqa: F401 - registers the XLNet and Transformer-XL configs
    from lmlab.file_schemas import model_config_fields
    from lmlab.models.config import FAMILY_CONFIGS

    for cls in set(FAMILY_CONFIGS.values()):
        schema = model_config_fields(cls)
        assert set(schema.__annotations__) == {f.name for f in dataclasses.fields(cls)}, cls.__name__


def test_a_config_built_in_python_with_a_negative_norm_eps_is_refused():
    from lmlab.errors import LmlabError
    from lmlab.models import get_preset

    with pytest.raises(LmlabError, match=r"^norm_eps must be a small positive number \(got -1"):
        get_preset("gpt2-tiny", norm_eps=-1.0)


# --------------------------------------------------------------------------------- Hugging Face import
HF_EDITS = {
    "a string layer_norm_epsilon": (lambda c: c.update(layer_norm_epsilon="1e-5"), "layer_norm_epsilon: "),
    "a negative layer_norm_epsilon": (lambda c: c.update(layer_norm_epsilon=-1e-5), "layer_norm_epsilon: "),
    "a null width": (lambda c: c.update(n_embd=None), "n_embd: "),
    "a string head count": (lambda c: c.update(n_head="2"), "n_head: "),
    "a dropout of 2": (lambda c: c.update(resid_pdrop=2), "resid_pdrop: "),
    "a model_type list": (lambda c: c.update(model_type=["gpt2"]), "model_type: "),
    "architectures as text": (lambda c: c.update(architectures="GPT2LMHeadModel"), "architectures: "),
}


@pytest.mark.parametrize("case", HF_EDITS)
def test_a_crafted_hugging_face_config_is_one_line_on_import(mine, capsys, tmp_path, case):
    assert main(["export", "--checkpoint", str(mine / CK), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    change, needle = HF_EDITS[case]
    edit_json(tmp_path / "hf" / "config.json", change)
    fails(capsys, ["import", "--hf", tmp_path / "hf", "--out", tmp_path / "ck"], "hf/config.json: ", needle)
    assert not (tmp_path / "ck").exists()


# ------------------------------------------------------------------------------------ datasets folders
@pytest.fixture()
def dataset(tmp_path, capsys):
    """A datasets DatasetDict saved with save_to_disk (two splits) and a tokenizer to prepare it with."""
    from datasets import Dataset, DatasetDict

    lines = ["to be or not to be", "that is the question"] * 5
    DatasetDict({"train": Dataset.from_dict({"text": lines}), "test": Dataset.from_dict({"text": lines})}
                ).save_to_disk(str(tmp_path / "both"))
    (tmp_path / "t.txt").write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    assert main(["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "280", "--input",
                 str(tmp_path / "t.txt"), "--out", str(tmp_path / "tok")]) == 0
    capsys.readouterr()
    return tmp_path / "both"


DATASET_EDITS = {
    "a cut dataset_dict.json": ("dataset_dict.json", '{"splits": ["tr', "dataset_dict.json is corrupt"),
    "splits as text": ("dataset_dict.json", '{"splits": "train"}', "dataset_dict.json: splits: "),
    "no splits": ("dataset_dict.json", '{"splits": []}', "dataset_dict.json: splits: must not be empty"),
    "a list file": ("dataset_dict.json", "[]", "dataset_dict.json must be a valid dictionary"),
    "a state of no files": ("train/state.json", '{"_data_files": []}', "state.json: _data_files: "),
    "a state of text files": ("train/state.json", '{"_data_files": "a.arrow"}', "state.json: _data_files: "),
}


@pytest.mark.parametrize("case", DATASET_EDITS)
def test_a_crafted_datasets_folder_is_one_line(dataset, tmp_path, capsys, case):
    name, content, needle = DATASET_EDITS[case]
    (dataset / name).write_text(content, encoding="utf-8")
    folder = dataset / "train" if name.startswith("train/") else dataset
    fails(capsys, ["data", "prepare", "--tokenizer", tmp_path / "tok", "--input", folder, "--out",
                   tmp_path / "shards", "--workers", "1"], needle)
    assert not (tmp_path / "shards").exists()


# -------------------------------------------------------------------------------- fine-tuning --resume
@pytest.fixture(scope="module")
def interrupted(run, data_dir, tmp_path_factory):
    """A fine-tuning run of the pretrained model on 16 SST-2 sentences, stopped after step 1 with
    its resume state saved; returns (the command, its output folder)."""
    from lmlab.train.engine import Engine

    out = tmp_path_factory.mktemp("ft") / "out"
    g = data_dir / "glue" / "sst2"
    args = ["finetune", "--checkpoint", str(run / CK), "--task", "sst2", "--train", str(g / "train.tsv"),
            "--dev", str(g / "dev.tsv"), "--out", str(out), "--max-train-examples", "16",
            "--max-eval-examples", "8", "--batch-size", "8", "--max-steps", "3", "--save-every", "1",
            "--max-length", "48", "--threads", "1", "--no-progress"]
    step = Engine.step

    def stop_at_the_second_step(engine, i, *a, **k):
        if i == 1:
            raise KeyboardInterrupt
        return step(engine, i, *a, **k)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Engine, "step", stop_at_the_second_step)
        assert main(args) == 130
    return args, out


@pytest.fixture()
def ft(interrupted, tmp_path, capsys):
    """A copy of the interrupted run's resume state to damage: (resume command, its checkpoint
    folder, in the one resume format: checkpoints/step_1/)."""
    args, out = interrupted
    rdir = out.with_name(f".{out.name}.resume")
    mine = tmp_path / rdir.name
    shutil.copytree(rdir, mine)
    capsys.readouterr()
    args = [tmp_path / out.name if a == str(out) else a for a in args]
    return args + ["--resume"], mine / "checkpoints" / "step_1"


def _edit_tensors(path: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def _move_a_parameter_to_the_next_group(state: dict) -> None:
    groups = state["optimizer"]["param_groups"]
    groups[1]["params"].append(groups[0]["params"].pop())


FT_STATES = {
    "random bytes": ("train_state.safetensors", lambda p: p.write_bytes(b"not a safetensors file at all"),
                     "train_state.safetensors: is corrupt or truncated"),
    "a list": ("train_state.json", lambda p: p.write_text("[1, 2]"), "is not an lmlab train state"),
    "a string step": ("train_state.json", lambda p: edit_json(p, lambda s: s.update(step="1")),
                      "train_state.json: step: "),
    "no optimizer": ("train_state.json", lambda p: edit_json(p, lambda s: s.pop("optimizer")),
                     "train_state.json: optimizer: is missing"),
    "a params list one short": ("train_state.json",
                                lambda p: edit_json(p, _move_a_parameter_to_the_next_group),
                                "optimizer.param_groups.0.params: must list"),
    "string betas": ("train_state.json",
                     lambda p: edit_json(p, lambda s: s["optimizer"]["param_groups"][1].update(betas="9")),
                     "optimizer.param_groups.1.betas: "),
    "no fine-tuning part": ("train_state.json", lambda p: edit_json(p, lambda s: s.pop("finetune")),
                            "train_state.json: finetune: is missing"),
    "a weight of another shape": ("model.safetensors", lambda p: _edit_tensors(p, lambda t: t.update(
        {sorted(t)[0]: torch.zeros(2)})), "model.safetensors: "),
    "a batch of an example not there": ("train_state.json", lambda p: edit_json(
        p, lambda s: s["finetune"]["order"].append([999])),
        "finetune.order: must number the 16 training examples"),
    "a generator of another shape": ("train_state.safetensors", lambda p: _edit_tensors(
        p, lambda t: t.update({"rng.shuffle": torch.zeros(3)})),
        "rng.shuffle: must be a random generator state"),
    "a tensor lmlab does not write": ("train_state.safetensors", lambda p: _edit_tensors(
        p, lambda t: t.update({"pickle": torch.zeros(1)})), "pickle: is not a tensor lmlab writes there"),
}


@pytest.mark.parametrize("case", FT_STATES)
def test_a_crafted_fine_tuning_resume_state_is_one_line(ft, capsys, case):
    args, state = ft
    name, change, needle = FT_STATES[case]
    change(state / name)
    fails(capsys, args, f"{state / name}", needle)
    assert (state / name).is_file()  # the state is kept for the user to look at
