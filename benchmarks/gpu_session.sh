#!/usr/bin/env bash
# One call on a lent GPU machine with no network: the side by side's parts PARTS (default all),
# jaxtrain installed first from the carried wheels, everything small packed into $OUT.
#   bash benchmarks/gpu_session.sh [PARTS] [more gpu_side_by_side.py flags]
# Carried beforehand (benchmarks/README.md, "A GPU session"): .gpu/wheels, .gpu/nanoGPT, .gpu/input.txt.
set -o pipefail
export PYTHONUNBUFFERED=1
PARTS=${1:-all}
shift || true
OUT=${OUT:-/tmp/gpu-out}
RESULTS=${RESULTS:-/tmp/gpu-side-by-side}
mkdir -p "$OUT" "$RESULTS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[[ $PARTS == all || $PARTS == *install* ]] || PARTS="install,$PARTS"  # every call installs first
timeout -s INT "${BUDGET_S:-570}" python3 benchmarks/gpu_side_by_side.py --part="$PARTS" \
  --wheels=.gpu/wheels --nanogpt="$PWD/.gpu/nanoGPT" --data=.gpu/input.txt --out="$RESULTS" "$@" \
  2>&1 | tee "$OUT/run.log" | tail -120
echo "gpu_side_by_side exit status ${PIPESTATUS[0]} after ${SECONDS}s"
cd "$RESULTS" && find . \( -name tokens -o -name nanogpt_out -o -name checkpoints \) -prune -o -type f \
  \( -name '*.json' -o -name '*.md' -o -name '*.png' -o -name '*.log' -o -name '*.jsonl' \) -size -20M \
  -print | tar czf "$OUT/results.tgz" -T -
find . -name '*trace.json*' -size -30M | tar czf "$OUT/traces.tgz" -T -
ls -la "$OUT"
