#!/usr/bin/env bash
# Shakespeare GPU recipe variants, 8 at once on the one GPU (val loss by step; times are shared),
# then the best of them alone, whole command, through gpu_side_by_side.py --part=shakespeare.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
JAXTRAIN_TEST_GPU=1 timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -s \
  "tests/test_gpu.py::test_the_gpu_step_is_scatter_free_and_its_embedding_gradient_fast_for_any_ids" \
  > $OUT/scatter_test.log 2>&1 &
declare -A V=(
 [base]=""
 [drop3]="--config.model.dropout=0.3 --config.train.max_steps=1500"
 [lowlr]="--config.optim.matrix_lr=0.01 --config.optim.lr=3e-3 --config.train.max_steps=1500"
 [wd5]="--config.optim.weight_decay=0.5 --config.model.dropout=0.25 --config.train.max_steps=1500"
 [canon]="--config.model.canon=4 --config.model.x0_mix=True --config.optim.z_loss=1e-4"
 [canon_drop3]="--config.model.canon=4 --config.model.x0_mix=True --config.optim.z_loss=1e-4 --config.model.dropout=0.3 --config.train.max_steps=1500"
 [big]="--config.model.n_layers=8 --config.model.d_model=512 --config.model.n_heads=8 --config.model.dropout=0.3 --config.train.max_steps=1500"
 [big_canon]="--config.model.n_layers=8 --config.model.d_model=512 --config.model.n_heads=8 --config.model.canon=4 --config.model.x0_mix=True --config.model.dropout=0.35 --config.train.max_steps=1500"
)
mkdir -p $OUT/sweep
for k in "${!V[@]}"; do
  timeout 150 python3 -m jaxtrain --config=configs/shakespeare_char_gpu.py --config.workdir=/tmp/sw/$k \
    --config.data.path=.gpu/input.txt --config.headless=True --config.sample.num_samples=0 \
    --config.train.early_stop_patience=3 ${V[$k]} > $OUT/sweep/$k.log 2>&1 &
done
wait
grep -H "summary:\|^time:" $OUT/sweep/*.log
best=$(for k in "${!V[@]}"; do v=$(grep -o "best val loss [0-9.]*" $OUT/sweep/$k.log | awk '{print $4}'); echo "${v:-9} $k"; done | sort -n | head -1 | awk '{print $2}')
echo "best variant: $best (${V[$best]})"
flags=""; for f in ${V[$best]} --config.train.early_stop_patience=3; do flags="$flags --jaxtrain_flag=$f"; done
unset XLA_PYTHON_CLIENT_PREALLOCATE
timeout -s INT 75 python3 benchmarks/gpu_side_by_side.py --part=shakespeare --data=$PWD/.gpu/input.txt \
  --out=/tmp/solo $flags > $OUT/solo.log 2>&1; echo "solo rc=$?"; tail -12 $OUT/solo.log
cp /tmp/solo/logs/jaxtrain_shakespeare.log $OUT/solo_jaxtrain.log; cp /tmp/solo/shakespeare.json $OUT/ 2>/dev/null
cd $OUT && tar czf sweep.tgz sweep && rm -rf sweep; cat scatter_test.log | tail -5; ls $OUT
