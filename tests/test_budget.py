"""One memory budget (lmlab.budget): a size that cannot fit, or a loop a file would make endless, is
refused in one line with exit code 2 before anything is allocated, by every command.

"This machine" is pinned to 16 GB here (``available_bytes``), so the answers do not depend on the
machine the tests run on; every size refused is far beyond any machine anyway."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from lmlab import budget
from lmlab.cli import main
from lmlab.errors import LmlabError

MACHINE = 16 * 10**9


@pytest.fixture(autouse=True)
def sixteen_gigabytes(monkeypatch):
    monkeypatch.setattr(budget, "available_bytes", lambda device=None: MACHINE)


def one_line_error(capsys, *needles) -> str:
    from assertions import assert_one_line_error

    return assert_one_line_error(capsys, *needles)


@pytest.fixture(scope="module")
def tiny_tok():
    from lmlab.tokenizers import train_tokenizer

    return train_tokenizer("bytelevel", ["to be or not to be, that is the question " * 50], vocab_size=280)


@pytest.fixture()
def gpt_ck(tmp_path, tiny_tok):
    from lmlab.models import build_model, get_preset

    model = build_model(get_preset("gpt2-tiny", vocab_size=tiny_tok.vocab_size))
    model.save(tmp_path / "ck", tokenizer=tiny_tok)
    return tmp_path / "ck"


# ----------------------------------------------------------------------------- the module itself


def test_require_fits_names_both_sizes_and_the_fix():
    budget.require_fits(MACHINE, "exactly the memory", "n/a")  # what fits passes
    with pytest.raises(LmlabError) as e:
        budget.require_fits(51.2e9, "sampling 8 continuations", "pass a smaller --num-samples")
    assert str(e.value) == ("sampling 8 continuations would need about 51.2 GB, more than this machine's "
                            "16 GB of memory; pass a smaller --num-samples")


def test_sizes_are_python_integers_and_read_for_people():
    assert budget.tensor_bytes(10**12, 10**12, 50257) == 10**24 * 50257 * 4  # no int64 overflow
    assert budget.tensor_bytes(3, 5, itemsize=8) == 120
    assert [budget.describe_bytes(n) for n in (512, 2_500, 51.2e9, 2.5e12, 1e300)] == \
        ["512 B", "2.5 kB", "51.2 GB", "2.5 TB", "1e+288 TB"]


def test_the_machine_is_its_memory_or_its_containers_limit(tmp_path, monkeypatch):
    monkeypatch.undo()  # the real available_bytes
    assert budget.available_bytes() > 10**8
    limit = tmp_path / "memory.max"
    limit.write_text("4294967296\n")
    assert budget._cgroup_memory_limit((tmp_path / "absent", limit)) == 4294967296
    limit.write_text("max\n")
    assert budget._cgroup_memory_limit((limit,)) is None
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    monkeypatch.setattr(budget, "_cgroup_memory_limit", lambda: ram // 4)  # a container of a quarter
    assert budget.physical_memory_bytes() == ram // 4
    monkeypatch.setattr(budget, "_cgroup_memory_limit", lambda: None)
    assert budget.physical_memory_bytes() == ram


def test_workers_beyond_the_cpus_are_capped_with_a_note(monkeypatch):
    monkeypatch.setattr("lmlab.runtime.available_cpus", lambda: 4)
    assert budget.cap_workers(2) == (2, None)
    assert budget.cap_workers(100_000) == (4, "--workers 100,000 capped to this machine's 4 CPUs")


def test_worker_counts_are_the_cpus_this_process_may_use_not_the_machines(monkeypatch):
    """A cgroup quota of one CPU (a container) caps the workers (os.cpu_count counts the host's)."""
    from lmlab import runtime
    from lmlab.data.options import default_workers

    monkeypatch.setattr(runtime, "_cgroup_cpu_limit", lambda *a: 1)
    assert budget.cap_workers(8) == (1, "--workers 8 capped to this machine's 1 CPU")
    assert default_workers() == 1
    assert runtime.available_cpus() == 1


# ----------------------------------------------------------------------------- each command


def test_generate_refuses_samples_that_cannot_fit(gpt_ck, capsys):
    base = ["generate", "--checkpoint", str(gpt_ck), "--prompt", "to", "--device", "cpu"]
    assert main(base + ["--num-samples", "1000000", "--max-new-tokens", "1000"]) == 2
    one_line_error(capsys, "generating 1,000,000 sequence(s) of up to 1,000 new tokens would need about",
                   "more than this machine's 16 GB", "--num-samples")
    assert main(base + ["--num-beams", "1000000", "--max-new-tokens", "1000"]) == 2
    one_line_error(capsys, "generating 1,000,000 sequence(s)", "--num-beams")
    assert main(base + ["--num-samples", "2", "--max-new-tokens", "3", "--seed", "0"]) == 0  # fits


def test_rlhf_refuses_a_policy_batch_that_cannot_fit_before_any_training(gpt_ck, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"to be {i}", "chosen": " yes", "rejected": " no"}) + "\n"
                             for i in range(4)))
    assert main(["align", "--method", "rlhf", "--checkpoint", str(gpt_ck), "--train", str(pairs),
                 "--dev", str(pairs), "--out", str(tmp_path / "out"), "--device", "cpu",
                 "--samples", "100000", "--batch-size", "1000", "--no-progress"]) == 2
    one_line_error(capsys, "an RLHF micro-batch of 1,000 prompts x 100,000 samples", "--samples")
    assert not (tmp_path / "out").exists()


def test_import_refuses_a_config_whose_positions_cannot_fit(gpt_ck, tmp_path, capsys):
    assert main(["export", "--checkpoint", str(gpt_ck), "--out", str(tmp_path / "hf")]) == 0
    config = tmp_path / "hf" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "n_positions": 10**12}))
    capsys.readouterr()
    assert main(["import", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 2
    one_line_error(capsys, "a gpt2 model of this config (about 6.4e+13 parameters in float32) would need "
                   "about 256 TB", "max_positions")


def test_a_sentinel_count_that_cannot_fit_is_refused_before_any_data_is_read(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n\nthat is the question\n" * 50)
    assert main(["pretrain", "--config", "configs/t5-tiny-spans.toml", "--out", str(tmp_path / "run"),
                 "--set", f"data.train={text}", "--set", "objective.num_sentinels=1000000000000"]) == 2
    one_line_error(capsys, "--set objective.num_sentinels: 1,000,000,000,000 sentinel tokens would need",
                   "lower objective.num_sentinels")
    assert not (tmp_path / "run" / "data").exists()


def test_the_t5_objective_refuses_sentinels_before_making_them(tiny_tok):
    from lmlab.objectives.t5 import SpanCorruption

    with pytest.raises(LmlabError, match="1,000,000,000,000 sentinel tokens would need about 200 TB"):
        SpanCorruption(tiny_tok, num_sentinels=10**12)


@pytest.mark.parametrize("count, says", [  # both used to hang: building the list, compiling the split pattern
    ("1000000000", "1,000,000,000 sentinel tokens would need about 200 GB"),
    ("20000", "20,000 sentinel tokens: more than the 10,000 special tokens a tokenizer takes"),
])
def test_tokenizer_train_checks_its_sentinel_count_as_pretraining_does(tmp_path, capsys, monkeypatch, count,
                                                                      says):
    monkeypatch.setattr(budget, "physical_memory_bytes", lambda: 25 * 10**9)
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n" * 20)
    assert main(["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "300", "--input", str(text),
                 "--out", str(tmp_path / "tok"), "--sentinels", count]) == 2
    one_line_error(capsys, says, "lower --sentinels (T5 uses 100)")
    assert not (tmp_path / "tok").exists()


def test_the_t5_objective_has_the_same_count_limit(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n\nthat is the question\n" * 50)
    assert main(["pretrain", "--config", "configs/t5-tiny-spans.toml", "--out", str(tmp_path / "run"),
                 "--set", f"data.train={text}", "--set", "objective.num_sentinels=20000"]) == 2
    one_line_error(capsys, "--set objective.num_sentinels: 20,000 sentinel tokens: more than the 10,000 "
                   "special tokens")
    assert not (tmp_path / "run").exists()


def _gzip_with_a_long_line(path, chars: int) -> None:
    with gzip.open(path, "wb") as f:
        f.write(b"a first line\n" + b"x" * chars)


@pytest.mark.parametrize("command", ["tokenizer", "data"])
def test_a_compressed_line_beyond_the_limit_is_refused_while_streaming(command, tmp_path, capsys, monkeypatch,
                                                                       tiny_tok):
    monkeypatch.setattr(budget, "MAX_LINE_CHARS", 10_000)
    bomb = tmp_path / "bomb.txt.gz"
    _gzip_with_a_long_line(bomb, 1_000_000)  # 1 MB on line 2, from a 1 kB file
    tiny_tok.save(tmp_path / "tok")
    args = {"tokenizer": ["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "300"],
            "data": ["data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--workers", "1"]}[command]
    assert main(args + ["--input", str(bomb), "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "bomb.txt.gz line 2 is longer than 10,000 characters", "split the text into lines")
    assert not (tmp_path / "out").exists()


def test_lines_within_the_limit_stream_as_before(tmp_path, monkeypatch):
    from lmlab.fileio import iter_text_lines

    monkeypatch.setattr(budget, "MAX_LINE_CHARS", 10)
    path = tmp_path / "ok.txt.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"0123456789\n\xc3\xa9t\xc3\xa9\r\nlast")
    assert list(iter_text_lines(path)) == ["0123456789\n", "\u00e9t\u00e9\r\n", "last"]
    plain = tmp_path / "long.txt"
    plain.write_text("short\n" + "y" * 11)
    with pytest.raises(LmlabError, match="long.txt line 2 is longer than 10 characters"):
        list(iter_text_lines(plain))


def test_data_prepare_starts_no_more_workers_than_cpus(tmp_path, capsys, monkeypatch, tiny_tok):
    monkeypatch.setattr("lmlab.runtime.available_cpus", lambda: 1)
    tiny_tok.save(tmp_path / "tok")
    (tmp_path / "t.txt").write_text("to be or not to be\n\nthat is the question\n")
    assert main(["data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--input", str(tmp_path / "t.txt"),
                 "--out", str(tmp_path / "shards"), "--workers", "1000"]) == 0
    out = capsys.readouterr().out
    assert ", 1 worker)" in out, out
    assert "note: --workers 1,000 capped to this machine's 1 CPU" in out, out


@pytest.mark.parametrize("field", ["{input:>2000000000}", "{input:{instruction}}", "{input!r}"])
def test_a_template_field_with_a_width_is_refused(gpt_ck, tmp_path, capsys, field):
    template = tmp_path / "template.txt"
    template.write_text("### Instruction:\n{instruction}\n" + field + "\n### Response:\n")
    data = tmp_path / "t.jsonl"
    data.write_text(json.dumps({"instruction": "say yes", "output": "yes"}) + "\n")
    assert main(["finetune", "--task", "instruct", "--checkpoint", str(gpt_ck), "--train", str(data),
                 "--dev", str(data), "--out", str(tmp_path / "out"), "--template", str(template)]) == 2
    one_line_error(capsys, f"field {field} has a format width or conversion")


def test_a_grid_budget_that_buys_endless_steps_is_refused(tmp_path, capsys, data_dir):
    text = tmp_path / "train.txt"
    text.write_text("to be or not to be\n\n" * 200)
    held_out = tmp_path / "val.txt"  # data.val may not be a file data.train reads
    held_out.write_text("to be or not to be\n\n" * 20)
    grid = tmp_path / "grid.toml"
    grid.write_text(f"""name = "g"
seeds = [0]
budget = {{flops = 1e30}}
arms = [{{name = "gpt", preset = "gpt2-tiny", objective = "clm"}}]
[pretrain.data]
train = ["{text}"]
val = ["{held_out}"]
tokenizer = {{algo = "bytelevel", vocab_size = 300}}
[pretrain.train]
batch_size = 8
seq_len = 32
[pretrain.model]
max_positions = 64
[finetune]
epochs = 1
[[tasks]]
task = "sst2"
train = "{data_dir / 'glue/sst2/train.tsv'}"
dev = "{data_dir / 'glue/sst2/dev.tsv'}"
""")
    assert main(["compare", "--config", str(grid), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    one_line_error(capsys, "budget {flops = 1e+30} buys", "optimizer steps for arm 'gpt', more than the "
                   "1,000,000,000 a run may take", "lower budget.flops to at most")


def test_a_resume_state_far_past_the_data_is_refused_at_once(tmp_path, capsys):
    from lmlab.train import pretrain

    (tmp_path / "train.txt").write_text("".join(f"line {i} of the text to learn\n\n" for i in range(200)))
    run = tmp_path / "run"
    pretrain({"model": {"preset": "gpt2-tiny", "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32,
                        "max_positions": 32},
              "objective": {"name": "clm"},
              "data": {"train": [str(tmp_path / "train.txt")], "val": [], "val_fraction": 0.2,
                       "tokenizer": {"algo": "bytelevel", "vocab_size": 280}},
              "train": {"max_steps": 2, "batch_size": 2, "seq_len": 16, "checkpoint_every": 2,
                        "eval_every": 2, "eval_batches": 1, "threads": 1, "precision": "fp32",
                        "progress": "off"}},
             run, log=lambda m: None)
    state = next((run / "checkpoints").glob("step_*")) / "train_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "data_position": 10**12}))
    assert main(["pretrain", "--out", str(run), "--resume", "--set", "train.max_steps=4"]) == 2
    one_line_error(capsys, "train_state.json: data position 1,000,000,000,000 is",
                   "passes over the training data", "resume from an earlier checkpoint")


def test_rlhf_refuses_a_batch_that_cannot_fit_before_the_model_loads(gpt_ck, tmp_path, capsys, monkeypatch):
    """The sizes come from the checkpoint's config: no weight is read before the refusal."""
    import lmlab.align.loop as loop

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the batch was checked")

    monkeypatch.setattr(loop, "load_policy", no_loading)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "to be", "chosen": " yes", "rejected": " no"}) + "\n")
    assert main(["align", "--method", "rlhf", "--checkpoint", str(gpt_ck), "--train", str(pairs),
                 "--dev", str(pairs), "--out", str(tmp_path / "out"), "--device", "cpu",
                 "--samples", "100000", "--batch-size", "1000", "--no-progress"]) == 2
    one_line_error(capsys, "an RLHF micro-batch of 1,000 prompts x 100,000 samples", "--samples")
    assert not (tmp_path / "out").exists()
