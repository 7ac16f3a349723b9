"""`lmlab scale plan`: C = 6·N·D with D = r·N (Chinchilla), and a concrete shape near N."""

from __future__ import annotations

import json
import math

import pytest

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.models import build_model
from lmlab.models.flops import count_parameters
from lmlab.scaling import compute_optimal, plan


@pytest.mark.parametrize("flops", [1e15, 1.2e17, 5.76e23])
def test_golden_arithmetic(flops):
    n, d = compute_optimal(flops)
    assert n == pytest.approx(math.sqrt(flops / 120), rel=1e-12)  # 6·N·(20·N) = C
    assert d == pytest.approx(20 * n, rel=1e-12)
    assert 6 * n * d == pytest.approx(flops, rel=1e-12)


def test_golden_cases_by_hand():
    n, d = compute_optimal(1.2e17)  # sqrt(1e15)
    assert n == pytest.approx(31_622_776.6, abs=1) and d == pytest.approx(632_455_532, abs=1)
    n, d = compute_optimal(5.88e23)  # Chinchilla: 70B parameters, 1.4T tokens
    assert n == pytest.approx(70e9, rel=1e-9) and d == pytest.approx(1.4e12, rel=1e-9)
    n, d = compute_optimal(6e18, tokens_per_param=100)  # 6·N·100·N = 6e18 -> N = 1e8
    assert n == pytest.approx(1e8, rel=1e-12) and d == pytest.approx(1e10, rel=1e-12)


@pytest.mark.parametrize("arch,flops", [("gpt2", 1.2e17), ("llama", 1e19), ("bert", 1e18), ("t5", 1e19)])
def test_shape_is_close_to_n_with_the_family_aspect_ratio(arch, flops):
    p = plan(flops, arch=arch)
    c = p.config
    assert c.family == arch
    assert abs(p.shape_params / p.n_params - 1) < 0.10
    assert p.shape_params == count_parameters(c).total
    assert 32 <= c.d_model / c.n_layers <= 128  # the -base presets' 64, within the search's range
    assert c.d_model % c.n_heads == 0 and (c.d_model // c.n_heads == 64 or c.n_heads == 4)
    assert p.tokens_for_budget * p.exact_flops / p.n_tokens == pytest.approx(flops, rel=1e-9)


def test_shape_count_equals_the_built_model():
    p = plan(3e14, arch="llama", vocab_size=1000, seq_len=128)
    assert abs(p.total_params / p.n_params - 1) < 0.15
    assert build_model(p.config).num_parameters() == p.total_params


def test_attention_term_is_12_l_t_d_per_token():
    """For a decoder, flops.py's attention products come to 12·L·T·d FLOPs per training token."""
    p = plan(1e17, arch="gpt2", seq_len=512)
    c = p.config
    assert p.attention_flops == pytest.approx(12 * c.n_layers * 512 * c.d_model * p.n_tokens, rel=1e-9)
    # the exact matmul count is 6 FLOPs per matmul parameter per token: non-embedding + tied output head
    n_matmul = count_parameters(c).non_embedding + c.d_model * c.vocab_size
    biases_and_norms = p.matmul_flops / p.n_tokens / 6 - n_matmul
    assert -0.01 * n_matmul < biases_and_norms <= 0  # flops.py leaves biases and norms out
    assert p.approx_flops == pytest.approx(p.exact_flops, rel=1e-9)


def test_non_embedding_count():
    p = plan(1e18, arch="gpt2", count="non-embedding")
    assert p.shape_params == count_parameters(p.config).non_embedding
    assert abs(p.shape_params / p.n_params - 1) < 0.10
    assert p.total_params > p.shape_params


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"flops": 0}, "plan's flops must be greater than 0"),
        ({"flops": float("nan")}, "plan's flops must be a finite number"),
        ({"flops": 1e17, "tokens_per_param": 0}, "plan's tokens_per_param must be greater than 0"),
        ({"flops": 1e17, "arch": "albert"}, "shares its layers"),
        ({"flops": 1e17, "arch": "nope"}, "choose one of"),
        ({"flops": 1e17, "count": "some"}, "unknown parameter count"),
    ],
)
def test_bad_input_is_a_one_line_error(kwargs, match):
    with pytest.raises(LmlabError, match=match) as e:
        plan(**kwargs)
    assert "\n" not in str(e.value)


def test_cli_prints_n_and_d(capsys):
    assert main(["scale", "plan", "--flops", "1.2e17"]) == 0
    out = capsys.readouterr().out
    assert "31.6M parameters" in out and "632M tokens" in out and "attention" in out
    assert (
        main(["scale", "plan", "--flops", "1e18", "--arch", "llama", "--vocab-size", "8000", "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["n_params"] == pytest.approx(math.sqrt(1e18 / 120))
    assert data["shape"]["vocab_size"] == 8000 and data["arch"] == "llama"
    with pytest.raises(SystemExit) as exited:  # refused as the flag is parsed
        main(["scale", "plan", "--flops", "-5"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_cli_notes_when_the_embedding_is_larger_than_n(capsys):
    assert main(["scale", "plan", "--flops", "1e13"]) == 0
    assert "embeddings alone" in capsys.readouterr().out


@pytest.mark.parametrize("flops", ["-1e15", "-2.5E-3", "-.5"])
def test_a_negative_budget_is_the_flags_own_error(capsys, flops):
    """argparse took -1e15 for a flag ("expected one argument"); every lmlab parser reads it as the value."""
    with pytest.raises(SystemExit) as exited:
        main(["scale", "plan", "--flops", flops])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument --flops: must be greater than 0 (got '{flops}')" in err


@pytest.mark.parametrize("flops", ["1", "1e9"])
def test_a_budget_below_the_smallest_shape_is_refused(capsys, flops):
    """--flops 1 planned 0.0913 parameters, rc 0."""
    assert main(["scale", "plan", "--flops", flops]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: --flops {flops} buys a compute-optimal model of " in err
    assert "fewer than the smallest gpt2 shape has besides its embeddings (3,312" in err
    assert err.strip().endswith("use --flops 1.4e9 or more")
    assert main(["scale", "plan", "--flops", "1.4e9"]) == 0


def test_a_one_token_vocabulary_is_refused_by_its_own_name(capsys):
    """probe10a #7: ``scale plan --vocab-size 1`` said "vocab_size 1 and seq_len 1024 must be at
    least 2 and 1", the keywords, after the flag's own type had let it through."""
    with pytest.raises(SystemExit):
        main(["scale", "plan", "--flops", "1e18", "--vocab-size", "1"])
    err = capsys.readouterr().err
    assert err.startswith("error: argument --vocab-size: must be at least 2 (got '1')"), err
    with pytest.raises(LmlabError, match=r"^plan's vocab_size must be at least 2 \(got 1\)"):
        plan(1e18, vocab_size=1)


@pytest.mark.parametrize("arch", ["gpt2", "t5", "llama"])
def test_the_shape_search_counts_few_shapes_and_finds_the_cheapest(arch, monkeypatch):
    """probe10a M6: a large budget counted every width of every depth (``--flops 1e25``: ~30 s of
    arithmetic). The search now counts a few widths a depth; the shape it picks is the one the
    exhaustive search picks (checked here against it, on budgets from tiny to huge)."""
    import importlib

    planning = importlib.import_module("lmlab.scaling.plan")  # the module, not the function of its name
    counted = []
    real = planning._count
    monkeypatch.setattr(planning, "_count", lambda cfg, count: counted.append(1) or real(cfg, count))
    # llama's grouped key/value heads make the count dip at some widths: every width is counted
    # there (review: the bisection missed the cheapest shape at 2.3e22), so no huge budget for it
    for flops in (1e16, 1e19) if arch == "llama" else (1e16, 1e19, 1e25):
        counted.clear()
        chosen = plan(flops, arch)
        assert arch == "llama" or len(counted) < 5000, (flops, len(counted))  # exhaustive: tens of thousands
        if flops > 1e19:
            continue  # the exhaustive search below is what took half a minute
        n = compute_optimal(flops)[0]
        aspect = planning._family_base(arch).d_model / planning._family_base(arch).n_layers
        head_dim = planning._family_base(arch).d_model // planning._family_base(arch).n_heads
        vocab, context = planning._family_base(arch).vocab_size, planning._family_base(arch).max_positions
        best, best_cost = None, math.inf  # the exhaustive search, over the depths the plan reached
        for layers in range(1, chosen.config.n_layers + 8):
            for d in planning._widths(aspect * layers / 2, aspect * layers * 2, head_dim):
                p = real(planning.model_shape(arch, d, layers, vocab, context, head_dim), "total")
                cost = abs(math.log(max(p, 1) / n)) + 0.1 * abs(math.log(d / layers / aspect))
                if cost < best_cost:
                    best, best_cost = (d, layers), cost
        assert (chosen.config.d_model, chosen.config.n_layers) == best, (flops, best)
