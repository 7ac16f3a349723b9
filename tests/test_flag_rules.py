"""Flags that go together: one table (lmlab.cli.flag_rules.RULES), checked for every command right
after parsing. Every declared dependency is tried here: its flag given without its partner (or with
the partner it excludes) is one line naming both, exit code 2, before any work; defaults never
trigger a rule; a partner given in --config counts."""

from __future__ import annotations

import pytest
from assertions import assert_one_line_error, exit_code

from lmlab.cli import build_parser
from lmlab.cli.flag_rules import EVALUATE_DATA_FLAGS, RULES, Excludes, check_flag_rules

#: each command's required arguments (paths that need not exist: the rules come first)
BASE = {
    "tokenizer train": ["tokenizer", "train", "--algo", "unigram", "--vocab-size", "50", "--input", "IN",
                        "--out", "OUT"],
    "export": ["export", "--checkpoint", "CK", "--out", "OUT"],
    "evaluate": ["evaluate", "--checkpoint", "CK"],
    "align": ["align", "--checkpoint", "CK", "--train", "TR", "--dev", "DV", "--out", "OUT"],
    "generate": ["generate", "--checkpoint", "CK"],
    "compress distill": ["compress", "distill", "--teacher", "CK", "--train", "TR", "--out", "OUT"],
    "compress prune": ["compress", "prune", "--checkpoint", "CK", "--out", "OUT", "--sparsity", "0.5"],
    "data prepare": ["data", "prepare", "--tokenizer", "TOK", "--input", "a.txt", "--out", "OUT"],
    "compress quantize": ["compress", "quantize", "--checkpoint", "CK", "--out", "OUT"],
    "scale fit": ["scale", "fit", "R1", "R2", "--out", "OUT"],
}
H = ["--harness", "hellaswag"]
#: each data flag of evaluate, as given
DATA_FLAG_VALUES = {"--format": ["--format", "csv"], "--header/--no-header": ["--no-header"],
                    "--delimiter": ["--delimiter", ";"], "--on-bad-line": ["--on-bad-line", "skip"],
                    "--max-bad-fraction": ["--max-bad-fraction", "0.2"],
                    **{f: [f, "1"] for f in EVALUATE_DATA_FLAGS if f.endswith("-field")}}
V = ["--variant", "a", "--prompts", "P"]
#: (command, flag, partner) -> what breaks that rule, added to BASE
BROKEN = {
    ("tokenizer train", "--num-merges", "--algo"): ["--num-merges", "10"],
    ("tokenizer train", "--num-merges", "--vocab-size"): ["--algo", "bpe", "--num-merges", "10"],
    ("tokenizer train", "--score", "--algo"): ["--score", "ratio"],
    ("tokenizer train", "--lowercase", "--algo"): ["--lowercase"],
    ("export", "--base", "--format"): ["--base", "B", "--format", "hf"],
    ("data prepare", "--text-field", "--input"): ["--text-field", "body"],
    ("align", "--sft-steps", "--method"): ["--sft-steps", "10"],
    ("align", "--reward-steps", "--method"): ["--reward-steps", "10", "--method", "dpo"],
    ("align", "--reward-lr", "--method"): ["--reward-lr", "1e-3"],
    ("align", "--samples", "--method"): ["--samples", "2"],
    ("align", "--max-new-tokens", "--method"): ["--max-new-tokens", "2"],
    ("align", "--temperature", "--method"): ["--temperature", "0.5"],
    ("align", "--loss", "--method"): ["--loss", "ipo", "--method", "rlhf"],
    ("align", "--label-smoothing", "--method"): ["--label-smoothing", "0.1", "--method", "rlhf"],
    ("evaluate", "--max-bad-fraction", "--on-bad-line"): ["--data", "D", "--max-bad-fraction", "0.5",
                                                          "--on-bad-line", "error"],
    ("evaluate", "--delimiter", "--format"): ["--data", "D", "--format", "jsonl", "--delimiter", "tab"],
    # probe8 #5: what only a data file's scoring reads was ignored in silence with --harness
    ("evaluate", "--predictions", "--data"): ["--predictions", "P", *H],
    **{("evaluate", flag, "--data"): [*H, *DATA_FLAG_VALUES[flag]] for flag in EVALUATE_DATA_FLAGS},
    ("evaluate", "--num-fewshot", "--harness"): ["--num-fewshot", "2"],
    ("evaluate", "--out", "--harness"): ["--out", "R"],
    ("evaluate", "--overwrite", "--harness"): ["--overwrite"],
    ("evaluate", "--log-samples", "--harness"): ["--log-samples"],
    ("evaluate", "--seed", "--harness"): ["--seed", "0"],
    ("evaluate", "--allow-code", "--harness"): ["--allow-code"],
    ("evaluate", "--data", "--harness"): ["--data", "D", *H],
    ("evaluate", "--task", "--harness"): ["--task", "sst2", *H],
    ("evaluate", "--variant", "--harness"): ["--variant", "a=b", *H],
    ("generate", "--grammar-backend", "--json-schema"): ["--grammar-backend", "lmlab"],
    ("generate", "--stop", "--json-schema"): ["--json-schema", "S", "--stop", "}"],
    ("generate", "--variant", "--prompts"): ["--variant", "a"],
    ("generate", "--prompts", "--variant"): ["--prompts", "P"],
    ("generate", "--prompt", "--variant"): [*V, "--prompt", "x"],
    ("generate", "--json-schema", "--variant"): [*V, "--json-schema", "S"],
    ("generate", "--tokenizer", "--variant"): [*V, "--tokenizer", "T"],
    ("compress distill", "--student-layers", "--init"): ["--init", "fresh", "--student-layers", "0"],
    ("compress distill", "--layers", "--student-layers"): ["--layers", "1", "--student-layers", "0,1"],
    ("compress prune", "--train", "--steps"): ["--train", "TR"],
    ("compress prune", "--steps", "--train"): ["--steps", "3", "--dev", "DV"],
    ("compress prune", "--steps", "--dev"): ["--steps", "3", "--train", "TR"],
}
#: probe9 #2: options that do nothing in the chosen mode were accepted in silence (rc 0)
PROBE9 = {
    **{(c, flag, "--dev"): [flag, "3"] for c in ("compress quantize", "compress prune", "compress distill")
       for flag in ("--max-eval-examples", "--eval-batch-size")},
    **{("compress prune", flag, "--steps"): [flag, value] for flag, value in (
        ("--lr", "1e-3"), ("--batch-size", "4"), ("--seed", "3"), ("--max-train-examples", "4"))},
    ("align", "--save-every", "--method"): ["--method", "rlhf", "--save-every", "1"],
    ("align", "--label-smoothing", "--loss"): ["--loss", "ipo", "--label-smoothing", "0.1"],
    ("generate", "--length-penalty", "--num-beams"): ["--length-penalty", "2"],
    ("generate", "--seed", "--num-beams"): ["--num-beams", "2", "--seed", "4"],
    ("generate", "--seed", "--temperature"): ["--temperature", "0", "--seed", "3"],
    ("generate", "--instruction", "--prompts"): [*V, "--instruction", "do it"],
    ("generate", "--format", "--prompts"): [*V, "--format", "text"],
    ("data prepare", "--doc-separator", "--input"): ["--input", "b.jsonl", "c.parquet",
                                                        "--doc-separator", "line"],
    ("data prepare", "--encoding", "--input"): ["--input", "c.parquet", "--encoding", "cp1252"],
    ("scale fit", "--seed", "--bootstrap"): ["--bootstrap", "0", "--seed", "4"],
}
BROKEN.update(PROBE9)
#: probe10a #2: two more options that did nothing in their mode (rc 0)
PROBE10 = {
    ("data prepare", "--seed", "--val-fraction"): ["--seed", "5"],
    ("compress distill", "--temperature", "--alpha"): ["--alpha", "0", "--temperature", "3"],
}
BROKEN.update(PROBE10)
CASES = [pytest.param(command, rule, id=f"{command} {rule.flag} {rule.partner}")
         for command, rules in RULES.items() for rule in rules]


def test_every_rule_is_tried_and_names_flags_the_command_has():
    assert {(c, r.flag, r.partner) for c, rules in RULES.items() for r in rules} == set(BROKEN)
    parser = build_parser()
    for argv in BASE.values():                  # the base alone breaks no rule: defaults never count
        check_flag_rules(parser, parser.parse_args(argv))


@pytest.mark.parametrize("command, rule", CASES)
def test_a_flag_without_its_partner_is_one_line_naming_both(tmp_path, capsys, command, rule):
    template = tmp_path / "template.txt"
    template.write_text("{instruction}\n")
    paths = {"OUT": tmp_path / "out", "TEMPLATE": template}
    argv = [str(paths.get(a, a)) for a in BASE[command] + BROKEN[(command, rule.flag, rule.partner)]]
    assert exit_code(argv) == 2
    err = assert_one_line_error(capsys, rule.flag, rule.partner)
    assert ("cannot be combined" if isinstance(rule, Excludes) else "applies only with") in err \
        or " needs " in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, flag, partner",
                         [pytest.param(*k, id=" ".join(k)) for k in (*PROBE9, *PROBE10)])
def test_an_option_that_does_nothing_in_the_mode_is_refused(tmp_path, capsys, command, flag, partner):
    """Each case of probe9 #2 (rc 0 before), by itself: refused in one line naming the flag as given
    and what it applies with, before anything is read."""
    extra = BROKEN[(command, flag, partner)]
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in BASE[command] + extra]
    assert exit_code(argv) == 2
    err = assert_one_line_error(capsys, flag, partner)
    assert f"{flag} applies only with" in err or f"{flag} text cannot be combined" in err \
        or f"{flag} cannot be combined" in err, err
    assert not (tmp_path / "out").exists()


def test_partners_given_satisfy_the_rules():
    parser = build_parser()
    ok = {"tokenizer train": ["--algo", "wordpiece", "--lowercase", "--score", "ratio"],
          "compress prune": ["--steps", "3", "--train", "TR", "--dev", "DV"],
          "compress distill": ["--student-layers", "0", "--init", "teacher"],
          "export": ["--format", "peft", "--base", "B"],
          "data prepare": ["--input", "a.txt", "b.jsonl", "--text-field", "body"],
          "align": ["--method", "rlhf", "--sft-steps", "10", "--samples", "2"],
          "evaluate": ["--data", "D", "--on-bad-line", "skip", "--max-bad-fraction", "0.5", "--format", "csv",
                       "--delimiter", ";", "--no-header", "--text-field", "0", "--predictions", "P"]}
    for command, extra in ok.items():
        check_flag_rules(parser, parser.parse_args(BASE[command] + extra))
    # probe9 #2's options, each in the mode that reads it
    more = {"compress prune": ["--steps", "3", "--train", "TR", "--dev", "DV", "--lr", "1e-3",
                               "--batch-size", "4", "--seed", "3", "--max-train-examples", "4",
                               "--max-eval-examples", "3"],
            "compress quantize": ["--dev", "DV", "--max-eval-examples", "3", "--eval-batch-size", "3"],
            "align": ["--method", "dpo", "--save-every", "1"],
            "scale fit": ["--bootstrap", "2", "--seed", "4"],
            "compress distill": ["--alpha", "0.1", "--temperature", "3"],
            "data prepare": ["--input", "a.txt", "b.jsonl", "--doc-separator", "line",
                             "--encoding", "latin-1", "--val-fraction", "0.1", "--seed", "5"]}
    for command, extra in more.items():
        check_flag_rules(parser, parser.parse_args(BASE[command] + extra))
    for extra in (["--num-beams", "2", "--length-penalty", "2"], ["--seed", "3"],
                  ["--temperature", "0.7", "--seed", "3"], [*V, "--format", "jsonl"],
                  ["--instruction", "do it"], ["--format", "text"]):
        check_flag_rules(parser, parser.parse_args(BASE["generate"] + extra))


def test_options_that_do_nothing_in_the_mode_are_refused_from_any_source(tmp_path, capsys):
    """--save-every under RLHF was ignored also from --set and an [align] table, each named where
    it was written (--set KEY, FILE:LINE: KEY; before: the bare key); a datasets folder (told by
    its files) holds records, so --encoding on it is refused too."""
    base = ["align", "--checkpoint", "CK", "--train", "TR", "--dev", "DV", "--out", str(tmp_path / "out")]
    assert exit_code([*base, "--method", "rlhf", "--set", "align.save_every=1"]) == 2
    assert_one_line_error(capsys, "error: --set align.save_every applies only with --method dpo")
    config = tmp_path / "al.toml"
    config.write_text('[align]\nmethod = "rlhf"\nsave_every = 2\n')
    assert exit_code([*base, "--config", str(config)]) == 2
    assert_one_line_error(capsys, f"error: {config}:3: align.save_every applies only with --method dpo")
    folder = tmp_path / "hfds"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    assert exit_code(["data", "prepare", "--tokenizer", str(tmp_path / "no-tok"), "--input", str(folder),
                      "--out", str(tmp_path / "out"), "--encoding", "utf-16"]) == 2
    assert_one_line_error(capsys, "--encoding applies only with --input text files")
    assert not (tmp_path / "out").exists()


def test_fine_tuning_rules_have_one_home():
    """lmlab finetune's settings are the [finetune] section's: their rules are stated there, by field
    name (tests/finetune/test_finetune_rules.py tries them); evaluate's data flags take theirs from
    there, in their flags' words."""
    from lmlab.config.finetune import RULES as FIELD_RULES

    assert "finetune" not in RULES
    data = {(r.flag, r.partner) for r in RULES["evaluate"]
            if r.flag in ("--max-bad-fraction", "--delimiter") and r.partner != "--data"}
    assert data == {("--max-bad-fraction", "--on-bad-line"), ("--delimiter", "--format")}
    assert {r.flag for r in FIELD_RULES} >= {"max_bad_fraction", "delimiter"}


def test_text_field_with_only_text_files_is_refused(tmp_path, capsys):
    """data prepare --text-field names a record's field: with .txt inputs alone it was silently
    ignored; it is refused before the tokenizer is read (told from the extensions), and accepted
    once an input holds records."""
    args = ["data", "prepare", "--tokenizer", str(tmp_path / "no-tok"), "--out", str(tmp_path / "out"),
            "--text-field", "body", "--input"]
    assert exit_code([*args, str(tmp_path / "a.txt")]) == 2
    err = assert_one_line_error(capsys, "--text-field", "--input")
    assert "applies only with --input records (.jsonl, .parquet or a datasets folder)" in err, err
    parser = build_parser()
    check_flag_rules(parser, parser.parse_args([*args, "a.txt", "b.jsonl.gz"]))


def test_every_data_flag_of_evaluate_needs_data(capsys):
    """probe8 #5: ``evaluate --harness`` ignored --predictions and every flag of how a data file is
    read (--format csv --text-field 3: rc 0). Each flag of evaluate's "data files" group, and
    --predictions, now needs --data: refused in one line with --harness, before any work."""
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    group = next(g for g in sub.choices["evaluate"]._action_groups if g.title == "data files")
    flags = {"/".join(a.option_strings) for a in group._group_actions}
    assert flags == set(EVALUATE_DATA_FLAGS)
    for extra, flag in ((["--predictions", "pp.jsonl"], "--predictions"), (["--format", "csv"], "--format"),
                        (["--text-field", "3"], "--text-field"), (["--no-header"], "--header/--no-header")):
        assert exit_code(["evaluate", "--checkpoint", "CK", *H, "--out", "q.json", *extra]) == 2
        err = assert_one_line_error(capsys, f"{flag} applies only with --data FILE")
        assert f"drop {flag}" in err
