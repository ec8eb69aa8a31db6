#!/usr/bin/env bash
# One venv per pairing; install the project with the pair pinned; smoke + a few tests.
set -u
PY312=$(pyenv prefix 3.12.1)/bin/python3.12
PY311=$(pyenv prefix 3.11.7)/bin/python3.11
cd /work/main
pair() {  # name python pins...
  local name=$1 py=$2; shift 2
  local v=/tmp/compat/v-$name log=/tmp/compat/$name.log
  rm -rf $v; $py -m venv $v
  { echo "== $name: $*"; $v/bin/pip install -q --cache-dir /tmp/pipcache -e . pytest==9.2.0 "$@" 2>&1 | grep -v "^WARNING: Loc";
    $v/bin/pip freeze | grep -iE "^(jax|jaxlib|flax|optax|orbax-checkpoint|grain|numpy|matplotlib|pyarrow|tokenizers|tiktoken|safetensors)=="
    echo "-- import"; HOME=/tmp/compat/home-$name $v/bin/python -c "import flax.nnx, jaxtrain; print('import ok')" 2>&1 | tail -2
    echo "-- tests"; HOME=/tmp/compat/home-$name timeout 900 $v/bin/python -m pytest -p no:cacheprovider -q -x tests/test_steps.py tests/test_checkpoint.py 2>&1 | tail -3
  } > $log 2>&1
  echo "$name done: $(tail -1 $log)"
}
pair j0110-f0128 $PY312 jax==0.11.0 jaxlib==0.11.0 flax==0.12.8
pair j0111-f0128 $PY312 jax==0.11.1 jaxlib==0.11.1 flax==0.12.8
pair j0111-f0129 $PY312 jax==0.11.1 jaxlib==0.11.1 flax==0.12.9
pair j0112-f0129 $PY312 jax==0.11.2 jaxlib==0.11.2 flax==0.12.9
pair j0112-f01210-o0124 $PY312 jax==0.11.2 jaxlib==0.11.2 flax==0.12.10 orbax-checkpoint==0.12.4
pair j0120-f01210 $PY312 jax==0.12.0.1 jaxlib==0.12.0.1 flax==0.12.10
pair j0120-f0128 $PY312 jax==0.12.0.1 jaxlib==0.12.0.1 flax==0.12.8
pair j0102-py312-f0128 $PY312 jax==0.10.2 jaxlib==0.10.2 flax==0.12.8
pair floor-py311 $PY311 jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.4 grain==0.2.18 ml-collections==1.1.0 absl-py==2.1.0 numpy==2.0.2 tqdm==4.66.1 matplotlib==3.9.4 safetensors==0.6.2 tokenizers==0.21.4 tiktoken==0.9.0 pyarrow==18.1.0 cmeel-mimalloc==3.2.8
echo ALL DONE
