"""`lmlab export` and `lmlab import`: convert between lmlab checkpoints and Hugging Face model dirs."""

from __future__ import annotations

from lmlab.cli.common import add_command
from lmlab.values import path_flag

EXPORT_DESCRIPTION = """\
Write an lmlab checkpoint (or a pretraining run's newest one, or a Hugging Face model directory,
written again) as a Hugging Face model directory (config.json + model.safetensors, plus
tokenizer.json/tokenizer_config.json when the checkpoint has a tokenizer). transformers loads it
with the matching class, e.g. BertForMaskedLM.from_pretrained(DIR), and computes the same logits.
Families: bert, roberta, albert, electra, gpt2, llama, t5, bart. The output directory is written
atomically.

--format peft: a LoRA, prefix or prompt tuning fine-tune (`lmlab finetune --method lora --out FT`)
as a folder the `peft` library loads, with the model it goes on in DIR/base (the base weights and
the task head, as a transformers directory): PeftModel.from_pretrained(AutoModelFor...
from_pretrained("DIR/base"), "DIR") computes lmlab's logits. --base is the pretrained checkpoint
the fine-tune started from. Prefix tuning needs positions=after_prefix (except rotary models),
prompt tuning of encoders before_cls=true (see docs/peft.md)."""

EXPORT_EXAMPLES = """\
  lmlab pretrain --config configs/gpt-tiny-clm.toml --out runs/gpt
  lmlab export --checkpoint runs/gpt --format hf --out hf-gpt/                  # a run: its newest checkpoint
  lmlab export --checkpoint runs/gpt/checkpoints/step_600 --format hf --out hf-gpt-600/
  lmlab export --checkpoint ft/sst2-lora --base ck/bert --format peft --out peft-sst2/"""

IMPORT_DESCRIPTION = """\
Convert a Hugging Face model directory (config.json + model.safetensors; bert, roberta, albert,
electra, gpt2, llama, t5, bart) into an lmlab checkpoint directory. Only safetensors weights are
read (pickled pytorch_model.bin files can run code when loaded)."""

IMPORT_EXAMPLES = """\
  lmlab import --hf ~/models/all-MiniLM-L6-v2 --out ck/minilm
  lmlab import --hf hf-gpt/ --out ck/gpt"""


def register(sub) -> None:
    p = add_command(
        sub,
        "export",
        "convert an lmlab checkpoint to a Hugging Face model dir",
        EXPORT_DESCRIPTION,
        EXPORT_EXAMPLES,
    )
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="lmlab checkpoint, pretraining run directory (its newest checkpoint) or HF model dir")
    p.add_argument("--format", choices=["hf", "peft"], default="hf",
                   help="hf: a transformers model dir; peft: a LoRA, prefix or prompt fine-tune as a "
                   "peft adapter folder")
    p.add_argument("--base", type=path_flag, metavar="DIR",
                   help="--format peft: the checkpoint the fine-tune started from")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR", help="output directory")
    p.set_defaults(func=run_export, out_kind=_export_kind)
    p = add_command(
        sub,
        "import",
        "convert a Hugging Face model dir to an lmlab checkpoint",
        IMPORT_DESCRIPTION,
        IMPORT_EXAMPLES,
    )
    p.add_argument("--hf", type=path_flag, required=True, metavar="DIR", help="Hugging Face model directory")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR",
                   help="lmlab checkpoint directory to write")
    p.set_defaults(func=run_import, out_kind=("model.safetensors", "model"))


def _export_kind(args) -> tuple[str, str]:
    """What an existing --out must hold to be replaced: an earlier output of the same format."""
    return ("adapter_config.json", "PEFT adapter") if args.format == "peft" else ("config.json",
                                                                               "Hugging Face model")


def run_export(args) -> int:
    from lmlab.interop import hf_export, load_plain_model

    if args.format == "peft":
        return _export_peft(args)

    # the loader of the other commands' --checkpoint: an lmlab checkpoint or a Hugging Face model
    # directory (written again as lmlab writes one), each told by its files before a weight is read
    model = load_plain_model(args.checkpoint)
    out = hf_export(model, args.out)
    print(f"wrote {model.config.family} model ({model.num_parameters():,} parameters) to {out}")
    return 0


def run_import(args) -> int:
    from lmlab.interop import hf_import

    model = hf_import(args.hf)
    out = model.save(args.out)
    print(f"wrote {model.config.family} model ({model.num_parameters():,} parameters) to {out}")
    return 0


def _export_peft(args) -> int:
    from lmlab.adapt.peft_export import check_exportable, export_peft
    from lmlab.adapt.peft_io import adapter_files, load_peft_model, read_peft_config
    from lmlab.errors import LmlabError
    from lmlab.interop import check_model_dir

    # first that the input exists and is a folder (the check of --format hf's loader), then what it
    # is (a fine-tune with an adapter peft has), then what the format needs
    # (--base): a full fine-tune or a bottleneck adapter is refused for itself, not for a missing --base
    adapter = check_model_dir(args.checkpoint) / "adapter"
    if adapter_files(adapter) is None:
        raise LmlabError(f"{args.checkpoint} holds no adapter/ (not a parameter-efficient fine-tune)",
                         "pass the --out of `lmlab finetune --method lora|prefix|prompt`")
    check_exportable(read_peft_config(adapter).get("method"))
    if args.base is None:
        raise LmlabError("--format peft needs --base DIR (--format peft writes the pretrained checkpoint the "
                         "fine-tune started from)", "add --base DIR")
    model = load_peft_model(args.base, adapter)
    out = export_peft(model, args.out, with_base=True)
    print(f"wrote a peft {model.peft['method']} adapter for a {model.config.family} model to {out} "
          f"(its base: {out / 'base'})")
    return 0
