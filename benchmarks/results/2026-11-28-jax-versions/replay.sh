#!/usr/bin/env bash
# Issue 52's "Done when", replayed as a user: a venv that holds a jax already, `pip install -e .`,
# then nano trains, resumes bit-exactly (Ctrl-C mid-run, the same command again) and exports.
set -u
py=$1; shift; pins="$*"; name=$($py -c 'import sys; print("py%d.%d" % sys.version_info[:2])')-$(echo $pins | tr ' =' '__')
d=/tmp/replay52/$name; rm -rf $d; mkdir -p $d; cd $d
$py -m venv venv && . venv/bin/activate
pip install -q --cache-dir /tmp/pipcache $pins 2>&1 | grep -v "^WARNING: Loc"
pip freeze | grep -iE "^(jax|jaxlib|flax|numpy)==" > before.txt
pip install -q --cache-dir /tmp/pipcache -e /work/main 2>&1 | grep -v "^WARNING: Loc"
pip freeze | grep -iE "^(jax|jaxlib|flax|numpy)==" > after.txt
echo "before: $(tr '\n' ' ' < before.txt)"; echo "after:  $(tr '\n' ' ' < after.txt)"
diff before.txt after.txt && echo "=> pip install -e . changed none of them"
export HOME=$d/home; mkdir -p $HOME
cmd="python -m jaxtrain --config=/work/main/configs/nano.py --config.headless=True --config.train.max_steps=300 --config.train.log_every=10"
$cmd --config.workdir=runs/straight > straight.log 2>&1; echo "straight: rc=$? | $(head -1 straight.log)"
$cmd --config.workdir=runs/resumed > first.log 2>&1 & pid=$!
until grep -q "step *100/300" first.log 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.2; done
kill -INT $pid; wait $pid; echo "interrupted: rc=$? | $(grep -E '^SIGINT' first.log)"
$cmd --config.workdir=runs/resumed > second.log 2>&1; echo "resumed: rc=$? | $(grep -E 'resum' second.log | head -1)"
python - <<'PY'
import jaxtrain as jt
a, b = (jt.load_state(f"runs/{n}") for n in ("straight", "resumed"))
jt.assert_trees_equal(a, b)
print("=> resumed params equal the uninterrupted run's bit for bit")
PY
python -m jaxtrain.export --workdir=runs/resumed --out=hf > export.log 2>&1; echo "export: rc=$? | $(tail -1 export.log | cut -c1-160)"
