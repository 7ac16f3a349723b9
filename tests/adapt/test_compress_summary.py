"""`lmlab compress` ends with a summary for people (issue 27), not a JSON dump: before -> after for
size, nonzero parameters, speed and every dev score, then one line; compress.json keeps every figure."""

from __future__ import annotations

from lmlab.cli.compress import summary_text


def report(method: dict, size_after: float, nonzero_after: int) -> dict:
    return {"method": method,
            "before": {"parameters": 22_713_986, "nonzero_parameters": 22_713_986, "size_bytes": 90.9e6,
                       "examples_per_s": 120.0, "metrics": {"accuracy": 0.91}},
            "after": {"parameters": 22_713_986, "nonzero_parameters": nonzero_after, "size_bytes": size_after,
                      "examples_per_s": 86.4, "metrics": {"accuracy": 0.88}}}


def test_a_pruned_model_that_is_no_smaller_says_why():
    method = {"name": "prune", "sparsity": 0.5, "scope": "global", "structure": "unstructured",
              "measured_sparsity": 0.5, "finetune_steps": 0}
    lines = summary_text(report(method, 90.9e6, 17_405_567), "pr").splitlines()
    assert lines[0] == "pruned to 50% sparsity (unstructured, global), before -> after:"
    assert lines[1] == "  size on disk   90.9 MB -> 90.9 MB (the same size)"
    assert lines[2] == "  parameters     22.71M -> 17.41M nonzero"
    assert lines[3].startswith("  speed          120.0 -> 86.4 examples/s (0.72x")
    assert lines[4] == "  dev accuracy   0.9100 -> 0.8800 (-0.0300)"
    assert "zeros kept in dense matrices" in lines[5] and "no speed-up is expected" in lines[5]
    assert lines[-1] == ("pruned to 50% sparsity (unstructured, global): 90.9 MB -> 90.9 MB, 0.72x the "
                         "speed, accuracy 0.9100 -> 0.8800; written to pr/ (every figure in "
                         "pr/compress.json)")


def test_quantized_and_distilled_summaries():
    quantized = {"name": "quantize", "activations": "dynamic", "layers": 37}
    text = summary_text(report(quantized, 24e6, 22_713_986))
    assert "size on disk   90.9 MB -> 24.0 MB (3.79x smaller)" in text and "nonzero" not in text
    distilled = {"name": "distill", "teacher_layers": 6, "student_layers": 3, "steps": 1000,
                 "temperature": 2.0, "alpha": 0.5}
    last = summary_text(report(distilled, 60e6, 15_000_000)).splitlines()[-1]
    assert last == ("distilled 6 layers into 3 (1,000 steps, T=2.0, alpha=0.5): 90.9 MB -> 60.0 MB, "
                    "0.72x the speed, accuracy 0.9100 -> 0.8800")


def test_the_dev_scores_stand_beside_their_baseline_and_an_after_at_it_is_flagged():
    """probe10b #4: the dev score's trivial baseline (compress.json's "baseline") is shown in the
    before -> after line and the last line; only the side at (or below) it is flagged."""
    quantized = {"name": "quantize", "activations": "dynamic", "layers": 37}
    r = report(quantized, 24e6, 22_713_986)
    r["after"]["metrics"] = {"accuracy": 0.5092}
    r["baseline"] = {"answer": "majority class '1'", "metrics": {"accuracy": 0.5092}, "metric": "accuracy",
                     "at_baseline": {"before": False, "after": True}}
    lines = summary_text(r, "q").splitlines()
    assert "  dev accuracy   0.9100 -> 0.5092 (-0.4008; baseline 0.5092)" in lines
    assert "  baseline (majority class '1', no model): accuracy 0.5092" in lines
    assert [line for line in lines if "warning" in line] == [
        "  warning: after, dev accuracy 0.5092 is at the trivial baseline (majority class '1': 0.5092): the "
        "compressed model does no better than that answer, which needs no model"]
    assert lines[-1] == ("quantized 37 linear layers to int8 (dynamic activations): 90.9 MB -> 24.0 MB, "
                         "0.72x the speed, accuracy 0.9100 -> 0.5092 (baseline 0.5092); at the trivial "
                         "baseline after; written to q/ (every figure in q/compress.json)")
