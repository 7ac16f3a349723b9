"""The llguidance JSON-schema backend: the same allowed tokens as lmlab's engine at every step where
both support the schema, the schema features only llguidance has, and the backend choice: ``auto``
always gives a whole valid document within ``max_new_tokens``, or refuses before generating."""

from __future__ import annotations

import json
import random
import sys

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.generate import generate
from lmlab.generate.json_backend import (
    GRAMMAR_BACKENDS,
    check_json_schema,
    json_schema_constraint,
    resolve_backend,
)
from lmlab.generate.json_schema import compile_schema
from lmlab.generate.llguidance_json import (
    LlguidanceJsonConstraint,
    bounded_schema,
    fixed_token_bytes,
    llguidance_module,
    longest_document_bytes,
)
from lmlab.models import build_model, get_preset
from lmlab.tokenizers import train_tokenizer

jsonschema = pytest.importorskip("jsonschema")

JSON_TEXT = ('{"name": "Al", "age": 41, "mood": "bad", "tags": ["a", "bc"], "ok": false} '
             '{"u": {"id": 12}, "v": "xyz", "w": [null, -3, 7]} "\u00e9" 0123456789 \\/ 2024-01-31 '
             'abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ ')

# schemas both engines support; with lmlab's caps (maxLength 32, maxItems 8, no extra keys) left implicit
SHARED = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 5}, "age": {"type": "integer", "minimum": 1, "maximum": 120},
        "mood": {"enum": ["good", "bad"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "ok": {"type": "boolean"}}, "required": ["name", "age", "mood"]},
    {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "integer", "minimum": -5, "maximum": 30}, {"type": "null"}, {"const": "\u00e9"}]}},
    {"type": "object", "properties": {
        "u": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}},
              "required": ["id"]},
        "v": {"type": "string", "minLength": 2, "maxLength": 4}, "w": {"type": "array", "maxItems": 3,
                                                                       "items": {"type": ["integer", "null"],
                                                                                 "maximum": 9}}},
     "required": ["u"]},
]

# what only llguidance supports; every output must validate (formats checked too)
EXTENDED = [
    ({"$defs": {"digit": {"type": "integer", "minimum": 0, "maximum": 9},
                "point": {"type": "object", "properties": {"x": {"$ref": "#/$defs/digit"},
                                                           "y": {"$ref": "#/$defs/digit"}},
                          "required": ["x", "y"]}},
      "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
      "required": ["a", "b"]}, "$ref"),
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{2,4}-[0-9]{3}$"}},
      "required": ["code"]}, "pattern"),
    ({"oneOf": [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "string", "maxLength": 4},
                {"type": "boolean"}]}, "oneOf"),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 50}},
                 "required": ["a"]},
                {"properties": {"a": {"multipleOf": 5}}}]}, "allOf"),
    ({"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                       "addr": {"type": "string", "format": "ipv4"},
                                       "color": {"enum": ["red", "green", 3, None]}},
      "required": ["day", "addr", "color"]}, "format"),
]


# the schema of /work/shared/acceptance/structured-output: an integer and a number without bounds
ACCEPTANCE = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0},
    "mood": {"enum": ["good", "bad"]}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    "ok": {"type": "boolean"}, "score": {"type": "number"}}, "required": ["name", "age", "mood", "ok"]}

# schemas whose llguidance documents have a longest form (longest_document_bytes is not None)
BOUNDED = [
    {"type": "boolean"},
    {"enum": [1, -20, "abc", None, True]},
    {"type": "integer", "exclusiveMinimum": -1000.5, "maximum": 7},
    {"type": ["string", "null", "integer"], "maxLength": 3, "minimum": 0, "maximum": 5},
    {"type": "array", "maxItems": 3, "items": {"anyOf": [{"type": "integer", "minimum": -5, "maximum": 30},
                                                         {"type": "null"}, {"const": "\u00e9"}]}},
    {"type": "object", "properties": {"k": {"type": "string", "maxLength": 6}, "e": {"type": "object"},
                                      "t": {"type": "array", "items": {"type": "string", "maxLength": 2}}}},
    EXTENDED[0][0],                                                         # $ref
    EXTENDED[2][0],                                                         # oneOf
]

@pytest.fixture(scope="module")
def tokenizers(shakespeare):
    texts = [shakespeare[:20000], JSON_TEXT * 3]
    return {"bytelevel": train_tokenizer("bytelevel", texts, vocab_size=400),
            "bpe": train_tokenizer("bpe", texts, vocab_size=300),
            "unigram": train_tokenizer("unigram", texts, vocab_size=300)}


@pytest.fixture(scope="module")
def model(tokenizers):
    tok = tokenizers["bytelevel"]
    torch.manual_seed(0)
    return build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size, eos_token_id=tok.eos_id)).eval()


def _allowed(constraint, generated: list[int], vocab_size: int) -> set[int]:
    """The tokens a constraint lets through after ``generated`` (one BOS of prompt before it)."""
    scores = constraint(torch.tensor([[0] + generated]), torch.zeros(1, vocab_size))
    return set(torch.isfinite(scores[0]).nonzero().flatten().tolist())


def _slash_escape(text: bytes, surface: bytes) -> bool:
    """Does ``surface`` after ``text`` write the escape ``\\/`` (lmlab's engine has it, llguidance not)?"""
    joined = text[-1:] + surface
    return any(joined[i:i + 2] == b"\\/" for i in range(len(joined) - 1))


def _compare_along(tok, schema, paths: list[list[int]]) -> int:
    """Both engines' allowed-token sets along each path (every prefix); returns the steps compared."""
    lm = json_schema_constraint(schema, tok, backend="lmlab", prompt_len=1, max_new_tokens=10_000)
    ll = json_schema_constraint(schema, tok, backend="llguidance", prompt_len=1, max_new_tokens=10_000)
    jump = json_schema_constraint(schema, tok, backend="llguidance", prompt_len=1, max_new_tokens=10_000)
    surfaces = fixed_token_bytes(tok)
    steps = 0
    for path in paths:
        for n in range(len(path) + 1):
            gen = path[:n]
            a, b = _allowed(lm, gen, tok.vocab_size), _allowed(ll, gen, tok.vocab_size)
            if n % 5 == 4:      # 5 tokens on from its last call: the matcher is replayed, not carried over
                assert _allowed(jump, gen, tok.vocab_size) == b
            text = b"".join(surfaces[t] or b"" for t in gen)
            only_lmlab = {t for t in a - b if not _slash_escape(text, surfaces[t] or b"")}
            assert not only_lmlab and not b - a, (text, [surfaces[t] for t in only_lmlab],
                                                  [surfaces[t] for t in b - a])
            steps += 1
            if n < len(path):
                assert path[n] in a, (text, surfaces[path[n]])
                if path[n] not in b:            # a \/ escape: llguidance cannot follow this path further
                    break
    return steps


def _random_paths(tok, schema, n: int, seed: int) -> list[list[int]]:
    """Random walks through lmlab's allowed tokens until EOS (or 60 tokens)."""
    c = json_schema_constraint(schema, tok, backend="lmlab", prompt_len=1, max_new_tokens=10_000)
    rng, paths = random.Random(seed), []
    for _ in range(n):
        gen: list[int] = []
        while len(gen) < 60 and (not gen or gen[-1] != c.eos):
            gen.append(rng.choice(sorted(_allowed(c, gen, tok.vocab_size))))
        paths.append(gen)
    return paths


@pytest.mark.parametrize("algo", ["bytelevel", "bpe"])
def test_both_engines_allow_the_same_tokens_at_every_step(tokenizers, algo):
    """Set equality of the two masks (EOS included) along random valid paths."""
    tok = tokenizers[algo]
    for i, schema in enumerate(SHARED):
        paths = _random_paths(tok, schema, n=6, seed=i)
        assert any(p[-1] == tok.eos_id for p in paths)         # some paths reach the end of the document
        assert _compare_along(tok, schema, paths) >= 20


def test_both_engines_agree_along_greedy_and_sampled_model_paths(tokenizers, model):
    tok = tokenizers["bytelevel"]
    for i, schema in enumerate(SHARED):
        c = json_schema_constraint(schema, tok, backend="lmlab", prompt_len=1, max_new_tokens=60)
        prompt = torch.tensor([[tok.bos_id]])
        greedy = generate(model, prompt, max_new_tokens=60, eos_token_id=c.eos, logits_processors=[c])
        sampled = generate(model, prompt, max_new_tokens=60, do_sample=True, num_return_sequences=2, seed=i,
                           eos_token_id=c.eos, logits_processors=[c])
        paths = [row[1:].tolist() for row in [*greedy, *sampled]]
        paths = [p[:p.index(c.eos) + 1] if c.eos in p else p for p in paths]
        _compare_along(tok, schema, paths)


def test_llguidance_greedy_output_equals_lmlab_greedy_output(tokenizers, model):
    tok = tokenizers["bytelevel"]
    prompt = torch.tensor([[tok.bos_id]])
    for schema in SHARED:
        outs = []
        for backend in ("lmlab", "llguidance"):
            c = json_schema_constraint(schema, tok, backend=backend, prompt_len=1, max_new_tokens=400)
            row = generate(model, prompt, max_new_tokens=400, eos_token_id=c.eos, logits_processors=[c])[0]
            outs.append(c.text(row[1:].tolist()))
        assert outs[0] == outs[1]
        jsonschema.validate(json.loads(outs[1]), schema)


@pytest.mark.parametrize("schema,feature", EXTENDED, ids=[f for _, f in EXTENDED])
def test_llguidance_features_give_valid_documents(tokenizers, model, schema, feature):
    tok = tokenizers["bytelevel"]
    with pytest.raises(LmlabError, match="lmlab\\[grammar\\]|llguidance grammar backend"):
        check_json_schema(schema, "lmlab")                     # lmlab's engine refuses, naming the backend
    c = json_schema_constraint(schema, tok, backend="llguidance", prompt_len=1, max_new_tokens=120)
    assert c.backend == "llguidance"
    out = generate(model, torch.tensor([[tok.bos_id]]), max_new_tokens=120, do_sample=True,
                   num_return_sequences=6, seed=1, eos_token_id=c.eos, logits_processors=[c])
    texts = [c.text(row[1:].tolist()) for row in out]
    for text in texts:
        doc = json.loads(text)
        if feature == "format" and doc["day"][4:] == "-02-29":     # llguidance allows Feb 29 in any year
            doc["day"] = doc["day"][:4] + "-02-28"
        jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
    assert len(set(texts)) > 1


def test_encoder_decoder_with_character_bpe_through_llguidance(tokenizers):
    tok = tokenizers["bpe"]
    torch.manual_seed(0)
    model = build_model(get_preset("t5-tiny", vocab_size=tok.vocab_size, eos_token_id=tok.eos_id,
                                   decoder_start_token_id=tok.pad_id, pad_token_id=tok.pad_id)).eval()
    schema = EXTENDED[2][0]                                            # oneOf
    c = json_schema_constraint(schema, tok, backend="llguidance", prompt_len=1, max_new_tokens=40)
    assert c.backend == "llguidance"
    out = generate(model, torch.tensor([[tok.eos_id]]), max_new_tokens=40, do_sample=True,
                   num_return_sequences=8, seed=0, eos_token_id=c.eos, logits_processors=[c])
    docs = [json.loads(c.text(row[1:].tolist())) for row in out]      # row 0: the decoder start token
    for doc in docs:
        jsonschema.validate(doc, schema)
    assert len({json.dumps(d) for d in docs}) > 1


def test_auto_backend_is_llguidance_only_where_every_document_fits(tokenizers):
    schema = SHARED[0]
    longest = longest_document_bytes(schema)
    assert longest is not None
    for algo, budget, want in (("bytelevel", longest + 1, "llguidance"), ("bytelevel", longest, "lmlab"),
                               ("bpe", 10_000, "lmlab"), ("unigram", 10_000, "lmlab")):
        c = json_schema_constraint(schema, tokenizers[algo], prompt_len=1, max_new_tokens=budget)
        assert (resolve_backend("auto", tokenizers[algo], schema, max_new_tokens=budget), c.backend) \
            == (want, want), (algo, budget)
    # an integer without maximum has no longest document: lmlab's engine, whatever the budget
    assert resolve_backend("auto", tokenizers["bytelevel"], ACCEPTANCE, max_new_tokens=100_000) == "lmlab"
    with pytest.raises(LmlabError, match="fixed bytes"):
        json_schema_constraint(schema, tokenizers["unigram"], backend="llguidance", prompt_len=1,
                               max_new_tokens=100)
    with pytest.raises(LmlabError, match="unknown grammar backend 'xgrammar'"):
        resolve_backend("xgrammar", tokenizers["bpe"], schema, max_new_tokens=100)
    from lmlab.cli.generate import GRAMMAR_BACKENDS as CLI_CHOICES

    assert CLI_CHOICES == GRAMMAR_BACKENDS      # written out there: importing generate loads torch


def test_without_llguidance_auto_is_lmlab_and_asking_for_it_names_the_extra(tokenizers, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)          # import llguidance -> ImportError
    with pytest.raises(LmlabError, match=r"pip install 'lmlab\[grammar\]'"):
        llguidance_module()
    assert resolve_backend("auto", tokenizers["bytelevel"], SHARED[0], max_new_tokens=10_000) == "lmlab"
    with pytest.raises(LmlabError, match=r"'pattern'.*pip install 'lmlab\[grammar\]'"):
        check_json_schema(EXTENDED[1][0], "auto")
    with pytest.raises(LmlabError, match=r"lmlab\[grammar\]"):
        json_schema_constraint(SHARED[0], tokenizers["bytelevel"], backend="llguidance", prompt_len=1,
                               max_new_tokens=50)


def test_invalid_or_unsupported_schemas_are_refused_by_llguidance():
    with pytest.raises(LmlabError, match="strnig"):
        check_json_schema({"type": "strnig"}, "llguidance")
    with pytest.raises(LmlabError, match="not"):
        check_json_schema({"not": {"type": "string"}}, "llguidance")
    with pytest.raises(LmlabError, match="minLength"):
        check_json_schema({"type": "string", "minLength": 3, "maxLength": 1}, "llguidance")
    with pytest.raises(LmlabError, match=r"unclosed character class; fix the schema") as e:
        check_json_schema({"type": "string", "pattern": "(["}, "auto")
    assert "\n" not in str(e.value)                       # llguidance's multi-line report, on one line


def test_default_caps_apply_only_where_the_schema_sets_none():
    schema = {"type": "object", "properties": {
        "s": {"type": "string"}, "t": {"type": "string", "maxLength": 99, "minLength": 40},
        "a": {"type": "array", "minItems": 10, "items": {"$ref": "#/$defs/w"}},
        "e": {"enum": ["x"]}, "o": {"type": "object", "additionalProperties": {"type": "integer"}}},
        "$defs": {"w": {"type": "string", "minLength": 50}}}
    out = bounded_schema(schema, 32, 8)
    p = out["properties"]
    assert (p["s"]["maxLength"], p["t"]["maxLength"], p["a"]["maxItems"]) == (32, 99, 10)
    assert out["$defs"]["w"]["maxLength"] == 50 and "maxLength" not in p["e"]
    assert out["additionalProperties"] is False and p["o"]["additionalProperties"] == {"type": "integer"}
    assert "maxLength" not in schema["properties"]["s"]                   # the input is left as it was


# --------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def checkpoint(tokenizers, model, tmp_path_factory):
    d = tmp_path_factory.mktemp("ck") / "gpt"
    model.save(d, tokenizer=tokenizers["bytelevel"])
    return d


def _cli(checkpoint, tmp_path, schema, *extra):
    from lmlab.cli import main

    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    return main(["generate", "--checkpoint", str(checkpoint), "--json-schema", str(f), *extra])


def test_cli_auto_backend_writes_ref_schema_documents(checkpoint, tmp_path, capsys):
    schema = EXTENDED[0][0]
    assert _cli(checkpoint, tmp_path, schema, "--num-samples", "4", "--seed", "2") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    for line in lines:
        jsonschema.validate(json.loads(line), schema)


@pytest.mark.parametrize("extra,message", [
    (("--grammar-backend", "lmlab"), r"'\$defs'.*llguidance grammar backend supports it"),
    # the command line's own names (SettingNames("flag")), not the Python keyword
    (("--max-new-tokens", "3"), r"fits in --max-new-tokens, and its longest document needs \d+ tokens, "
                                r"more than --max-new-tokens 3; use --max-new-tokens >= \d+"),
    (("--max-new-tokens", "3", "--grammar-backend", "llguidance"),
     "did not finish within --max-new-tokens 3"),
    (("--grammar-backend", "llguidance", "--json-schema"), "add --json-schema FILE"),
])
def test_cli_errors_are_one_line(checkpoint, tmp_path, capsys, extra, message):
    import re

    if extra[-1] == "--json-schema":          # the last case: no schema at all
        from lmlab.cli import main

        code = main(["generate", "--checkpoint", str(checkpoint), *extra[:-1]])
    else:
        code = _cli(checkpoint, tmp_path, EXTENDED[0][0], *extra)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and re.search(message, err), err


def test_cli_names_its_flags_in_every_refusal_of_a_schema_or_budget(checkpoint, tmp_path, capsys):
    """The refusal of a schema with no length bound named ``max_new_tokens`` and ``backend=``
    beside the flags; one that runs past the model's positions named ``max_new_tokens``."""
    from lmlab.cli import main

    assert _cli(checkpoint, tmp_path, EXTENDED[1][0]) == 2
    err = capsys.readouterr().err
    ending = ("or pass --grammar-backend llguidance, which supports it but does not force an ending: a "
              "document unfinished at --max-new-tokens is an error\n")
    assert err.count("\n") == 1 and err.endswith(ending), err
    assert "fits in --max-new-tokens, and this schema's documents have no length bound" in err, err
    assert "max_new_tokens" not in err and "backend=" not in err
    argv = ["generate", "--checkpoint", str(checkpoint), "--prompt", "hi", "--max-new-tokens", "100000"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "+ --max-new-tokens 100000 exceeds the model's" in err \
        and err.endswith("use --max-new-tokens 1022 or less\n"), err


# --------------------------------------------------------------------------- auto keeps the promise
def test_auto_ends_every_acceptance_document_within_a_small_budget(tokenizers, model):
    """Whole documents, valid against the schema, however small the budget: the shortest fits exactly."""
    tok = tokenizers["bytelevel"]
    shortest = compile_schema(ACCEPTANCE).min_cost
    for budget in (shortest + 1, 50, 64):
        c = json_schema_constraint(ACCEPTANCE, tok, prompt_len=1, max_new_tokens=budget)
        out = generate(model, torch.tensor([[tok.bos_id]]), max_new_tokens=budget, do_sample=True,
                       num_return_sequences=12, seed=budget, eos_token_id=c.eos, logits_processors=[c])
        for row in out:
            gen = row[1:].tolist()
            assert c.eos in gen and len(gen) <= budget          # the document ended, within the budget
            jsonschema.validate(json.loads(c.text(gen)), ACCEPTANCE)


def test_auto_refuses_a_budget_below_the_shortest_document(tokenizers):
    shortest = compile_schema(ACCEPTANCE).min_cost
    with pytest.raises(LmlabError, match=f"needs up to {shortest + 1} tokens, more than "
                                         f"max_new_tokens={shortest}; use max_new_tokens >= {shortest + 1}"):
        json_schema_constraint(ACCEPTANCE, tokenizers["bytelevel"], prompt_len=1, max_new_tokens=shortest)


def _longest_walk_bytes(tok, schema, walks: int, seed: int) -> int:
    """Random walks through llguidance's masks that never stop while they may go on; the longest text."""
    c = LlguidanceJsonConstraint(schema, tok, prompt_len=1, max_new_tokens=10_000)
    surfaces = fixed_token_bytes(tok)
    rng, longest = random.Random(seed), 0
    for _ in range(walks):
        gen: list[int] = []
        while not gen or gen[-1] != c.eos:
            go_on = sorted(_allowed(c, gen, tok.vocab_size) - {c.eos})
            gen.append(rng.choice(go_on) if go_on else c.eos)
        jsonschema.validate(json.loads(c.text(gen)), schema)
        longest = max(longest, len(b"".join(surfaces[t] for t in gen[:-1])))
    return longest


def test_longest_document_bound_holds_for_everything_llguidance_lets_through(tokenizers):
    tok = tokenizers["bytelevel"]
    for i, schema in enumerate(BOUNDED):
        bound = longest_document_bytes(schema)
        assert bound is not None, schema
        assert _longest_walk_bytes(tok, schema, walks=12, seed=i) <= bound, schema
    assert [longest_document_bytes(s) for s in BOUNDED[:3]] == [7, 7, 7]     # " false ", " 'abc' ", " -1000 "


@pytest.mark.parametrize("schema", [
    ACCEPTANCE, {"type": "number", "minimum": 0, "maximum": 1}, {"type": "integer", "minimum": 0},
    {"$defs": {"t": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/t"}}}}, "$ref": "#/$defs/t"},
    {"allOf": [{"type": "boolean"}]}, {"type": "string", "maxLength": 3, "pattern": "a+"},
    {"type": "object", "properties": {}, "additionalProperties": True}, {"enum": [1.5]}, {"type": "array"},
], ids=["acceptance", "number", "no-maximum", "recursive-ref", "allOf", "pattern", "extra-keys", "float-enum",
        "any-items"])
def test_no_longest_document_where_none_can_be_shown(schema):
    assert longest_document_bytes(schema) is None
    assert longest_document_bytes({"type": "string"}, max_string_length=None) is None


def test_auto_through_llguidance_ends_every_row_when_the_longest_document_fits(tokenizers, model):
    tok = tokenizers["bytelevel"]
    for schema in (EXTENDED[0][0], BOUNDED[5]):
        budget = longest_document_bytes(schema) + 1
        c = json_schema_constraint(schema, tok, prompt_len=1, max_new_tokens=budget)
        assert c.backend == "llguidance"
        out = generate(model, torch.tensor([[tok.bos_id]]), max_new_tokens=budget, do_sample=True,
                       num_return_sequences=8, seed=3, eos_token_id=c.eos, logits_processors=[c])
        for row in out:
            jsonschema.validate(json.loads(c.text(row[1:].tolist())), schema)   # .text: error if unfinished


def test_auto_refuses_a_schema_only_llguidance_supports_unless_it_provably_fits(tokenizers):
    with pytest.raises(LmlabError, match=r"'pattern' .* not supported by lmlab's grammar engine.*fits in "
                                         r"max_new_tokens, .*no length bound.*pass backend=\"llguidance\", "
                                         r".*unfinished at max_new_tokens is an error$"):
        check_json_schema(EXTENDED[1][0], "auto")                   # before any model is loaded
    check_json_schema(EXTENDED[0][0], "auto")                       # $ref, bounded: depends on the budget
    longest = longest_document_bytes(EXTENDED[0][0]) + 1
    with pytest.raises(LmlabError, match=f"longest document needs {longest} tokens, more than "
                                         f"max_new_tokens=20; use max_new_tokens >= {longest}"):
        json_schema_constraint(EXTENDED[0][0], tokenizers["bytelevel"], prompt_len=1, max_new_tokens=20)
    with pytest.raises(LmlabError, match="the bpe tokenizer is not byte-level BPE"):
        json_schema_constraint(EXTENDED[0][0], tokenizers["bpe"], prompt_len=1, max_new_tokens=10_000)


def test_cli_acceptance_schema_with_a_small_budget_prints_valid_documents(checkpoint, tmp_path, capsys):
    assert _cli(checkpoint, tmp_path, ACCEPTANCE, "--max-new-tokens", "48", "--num-samples", "16",
                "--seed", "1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 16
    for line in lines:
        jsonschema.validate(json.loads(line), ACCEPTANCE)


def test_cli_refuses_before_generating_when_the_shortest_document_cannot_fit(checkpoint, tmp_path, capsys,
                                                                             monkeypatch):
    import lmlab.generate

    def no_generation(*args, **kwargs):
        raise AssertionError("generation started")

    monkeypatch.setattr(lmlab.generate, "generate", no_generation)
    shortest = compile_schema(ACCEPTANCE).min_cost
    code = _cli(checkpoint, tmp_path, ACCEPTANCE, "--max-new-tokens", str(shortest))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: the shortest document valid against the schema needs up to {shortest + 1} "
                          f"tokens, more than --max-new-tokens {shortest}; use --max-new-tokens >= "
                          f"{shortest + 1}"), err
