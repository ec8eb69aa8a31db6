#!/usr/bin/env bash
# The lent GPU's first call: the prepared side-by-side (--part=all), then a micro-batch variant if time is left.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
lscpu | grep -E '^(Model name|CPU family|Model):'
python3 -c "import jax,flax,optax,grain,torch,orbax.checkpoint as o;print('jax',jax.__version__,'flax',flax.__version__,'optax',optax.__version__,'orbax',o.__version__,'torch',torch.__version__,jax.devices())"
R=/tmp/gpu
timeout -s INT 545 python3 benchmarks/gpu_side_by_side.py --part=all --nanogpt=$PWD/.gpu/nanoGPT \
  --data=$PWD/.gpu/input.txt --out=$R 2>&1 | tee $OUT/run.log
echo "side_by_side rc=$? at ${SECONDS}s" | tee -a $OUT/run.log
if [ $SECONDS -lt 450 ]; then
  timeout -s INT $((580-SECONDS)) python3 benchmarks/gpu_side_by_side.py --part=throughput --batch=32 \
    --data=$PWD/.gpu/input.txt --out=$R/variant_b32 2>&1 | tail -30 | tee -a $OUT/run.log
  echo "variant b32 rc=$? at ${SECONDS}s" | tee -a $OUT/run.log
fi
cd $R && find . \( -name tokens -o -name nanogpt_out -o -name profiles -o -name checkpoints \) -prune -o \
  -type f \( -name '*.json' -o -name '*.md' -o -name '*.png' -o -name '*.log' -o -name '*.jsonl' \) -size -20M -print \
  | tar czf $OUT/results.tgz -T -
find . -name '*trace.json*' -size -60M | tar czf $OUT/traces.tgz -T - ; ls -la $OUT; du -sh $R/* 2>/dev/null | head -20
