#!/usr/bin/env bash
# One GPU check in one call (docs/gpu.md): the CUDA test tier (tests/cuda), the training-step
# throughput benchmark (benchmarks/gpu_throughput.py) and one seed of the claims grid
# (configs/grids/claims-gpu.toml), each part under its own time box so a slow part cannot eat the
# others' time; about 8 minutes in all on one H100/H200.
#
#   OUT=/some/folder bash benchmarks/gpu_check.sh            # on a lent GPU machine
#   OUT=/tmp/check  bash benchmarks/gpu_check.sh --quick    # the same parts, tiny, on a CPU (~1 min)
#
# --quick runs every part in its smallest form (the tier collects and skips without CUDA; the
# benchmark's --quick shapes; a two-arm grid on the built-in corpus instead of the claims grid), so
# the script is exercised by the CPU test suite (tests/test_gpu_check.py) and cannot rot between loans.
#
# Written under $OUT (at most 8 files, nothing in sub-folders: what a lent machine hands back):
#   summary.json     every part: status (passed, failed, timed out, skipped), seconds, exit code, note
#   tier.log         pytest's output for tests/cuda (slowest tests listed)
#   throughput.log   gpu_throughput.py's output (its report table included)
#   throughput.json  its raw figures (rewritten after each model group: a cut-short run keeps them)
#   grid.log         the comparison's output; grid.md / grid.json its report (results.md / .json)
# Work folders (token caches, checkpoints) go under $GPU_CHECK_WORK (default: a fresh temporary
# folder), never under $OUT. Time boxes in seconds, each overridable: GPU_CHECK_TIER_S (150),
# GPU_CHECK_THROUGHPUT_S (90), GPU_CHECK_GRID_S (240: one seed of claims-gpu.toml is sized to about
# 210 s by benchmarks/claims_sizing.py); 480 s in all; --quick: 120, 120, 120.
# The exit status is 0 when every part passed or was skipped for a stated reason, else 1.

set -u
QUICK=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "error: unknown option $arg; use --quick or nothing" >&2; exit 2 ;;
  esac
done
if [ -z "${OUT:-}" ]; then
  echo "error: OUT is not set; set OUT to the folder that receives the results, e.g. OUT=/tmp/check" >&2
  exit 2
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
WORK="${GPU_CHECK_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}"
mkdir -p "$WORK" || exit 2
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
# lmlab from this checkout when it is not installed (a lent machine has the checkout only)
if ! "$PY" -c "import lmlab" >/dev/null 2>&1; then
  export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ "$QUICK" = 1 ]; then
  TIER_S="${GPU_CHECK_TIER_S:-120}"; THROUGHPUT_S="${GPU_CHECK_THROUGHPUT_S:-120}"; GRID_S="${GPU_CHECK_GRID_S:-120}"
else
  TIER_S="${GPU_CHECK_TIER_S:-150}"; THROUGHPUT_S="${GPU_CHECK_THROUGHPUT_S:-90}"; GRID_S="${GPU_CHECK_GRID_S:-240}"
fi
PARTS="$WORK/parts.tsv"
: > "$PARTS"

# record PART STATUS SECONDS RC NOTE: one line of the summary
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(printf '%s' "$5" | tr '\t\n' '  ')" >> "$PARTS"
  echo "== $1: $2 (${3} s)${5:+; $5}"
}

# boxed PART SECONDS LOG CMD...: run CMD under `timeout`, output to LOG, and record how it ended
boxed() {
  local part="$1" box="$2" log="$3"
  shift 3
  local start end rc status
  start=$(date +%s)
  echo "== $part: up to $box s: $*"
  timeout --kill-after=15 "$box" "$@" > "$log" 2>&1
  rc=$?
  end=$(date +%s)
  case $rc in
    0) status="passed" ;;
    124|137) status="timed out" ;;
    *) status="failed" ;;
  esac
  record "$part" "$status" "$((end - start))" "$rc" "$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
  return 0
}

# ------------------------------------------------------------------------- the machine
"$PY" - > "$WORK/machine.txt" 2>&1 <<'EOF'
import platform
import torch
import lmlab
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"python {platform.python_version()}, torch {torch.__version__}, lmlab {lmlab.__file__}, {gpu}")
EOF
if [ $? -ne 0 ]; then
  record machine failed 0 1 "$(tail -n 1 "$WORK/machine.txt") (install lmlab's dependencies: docs/gpu.md)"
else
  record machine passed 0 0 "$(cat "$WORK/machine.txt")"
fi
HAS_CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)

# ------------------------------------------------------------------------- 1. the CUDA tier
boxed cuda-tier "$TIER_S" "$OUT/tier.log" "$PY" -m pytest -q -p no:cacheprovider tests/cuda -rs --durations=15

# ------------------------------------------------------------------------- 2. throughput
if [ "$QUICK" = 1 ]; then
  boxed throughput "$THROUGHPUT_S" "$OUT/throughput.log" "$PY" benchmarks/gpu_throughput.py --quick --no-write \
    --models gpt2 --threads 1 --json "$OUT/throughput.json"
elif [ "$HAS_CUDA" = 1 ]; then
  # the GPT-2 and packed-document groups, fewer steps than the full report; the groups measured
  # before a time-out stay in throughput.json
  boxed throughput "$THROUGHPUT_S" "$OUT/throughput.log" "$PY" benchmarks/gpu_throughput.py --no-write \
    --models gpt2,packed --warmup 2 --steps 5 --json "$OUT/throughput.json"
else
  record throughput skipped 0 0 "no CUDA device: the full benchmark needs one (--quick runs its CPU form)"
fi

# ------------------------------------------------------------------------- 3. one seed of the claims grid
DATA="${LMLAB_DATA:-$ROOT/../shared/data}"
GRID_OUT="$WORK/grid"
if [ "$QUICK" = 1 ]; then
  # two arms on the built-in corpus, no fine-tuning data needed: the grid machinery end to end
  CORPUS="$ROOT/src/lmlab/assets/tinyshakespeare.txt"
  head -c 60000 "$CORPUS" > "$WORK/train.txt"
  tail -c 20000 "$CORPUS" > "$WORK/val.txt"
  cat > "$WORK/grid.toml" <<EOF
name = "gpu-check-quick"
seeds = [0]
budget = { tokens = 2560 }
[pretrain.data]
train = ["$WORK/train.txt"]
val = ["$WORK/val.txt"]
tokenizer = { algo = "bytelevel", vocab_size = 300 }
[pretrain.train]
batch_size = 8
seq_len = 32
eval_batches = 2
threads = 1
[pretrain.model]
d_model = 32
n_layers = 1
n_heads = 2
d_ff = 64
max_positions = 64
[[arms]]
name = "mlm"
preset = "bert-tiny"
objective = "mlm"
[[arms]]
name = "clm"
preset = "gpt2-tiny"
objective = "clm"
EOF
  GRID=("$WORK/grid.toml")
elif [ ! -f "$DATA/pretrain/imdb-unsup/imdb_unsup.txt.gz" ] || [ ! -f "$DATA/glue/sst2/train.tsv" ]; then
  GRID=()
  record claims-grid skipped 0 0 "no data at $DATA (IMDB, WikiText-2, SST-2): carry it and set LMLAB_DATA (docs/gpu.md)"
else
  GRID=(configs/grids/claims-gpu.toml --set "seeds=[0]")
fi
if [ "${#GRID[@]}" -gt 0 ]; then
  boxed claims-grid "$GRID_S" "$OUT/grid.log" "$PY" -m lmlab.cli compare --config "${GRID[@]}" \
    --out "$GRID_OUT" --progress off
  # the report of what finished, also after a time-out (the runs left unfinished are counted out)
  if [ -d "$GRID_OUT" ]; then
    "$PY" -m lmlab.cli compare --config "${GRID[@]}" --out "$GRID_OUT" --report-only --progress off \
      >> "$OUT/grid.log" 2>&1
    [ -f "$GRID_OUT/results.md" ] && cp "$GRID_OUT/results.md" "$OUT/grid.md"
    [ -f "$GRID_OUT/results.json" ] && cp "$GRID_OUT/results.json" "$OUT/grid.json"
  fi
fi

# ------------------------------------------------------------------------- the summary
"$PY" - "$PARTS" "$OUT/summary.json" "$QUICK" <<'EOF'
import json
import sys

parts_file, out, quick = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
parts = []
for line in open(parts_file, encoding="utf-8"):
    name, status, seconds, rc, note = line.rstrip("\n").split("\t")
    parts.append({"part": name, "status": status, "seconds": int(seconds), "exit_code": int(rc), "note": note})
ok = all(p["status"] in ("passed", "skipped") for p in parts)
summary = {"quick": quick, "ok": ok, "seconds": sum(p["seconds"] for p in parts), "parts": parts}
with open(out + ".tmp", "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
import os

os.replace(out + ".tmp", out)
for p in parts:
    print(f"{p['part']:12} {p['status']:10} {p['seconds']:5d} s  {p['note'][:90]}")
print("all parts passed or skipped" if ok else "some part failed or timed out")
EOF
status=$?
[ -z "${GPU_CHECK_WORK:-}" ] && rm -rf "$WORK"
[ $status -ne 0 ] && exit 2
"$PY" -c "import json,sys; sys.exit(0 if json.load(open('$OUT/summary.json'))['ok'] else 1)"
