# Each TREE is a git worktree at /tmp/bis/TREE (git worktree add --detach /tmp/bis/REF REF).
# usage: run.sh ROUNDS TREE... : shakespeare_char 600 steps warm (each tree's own HOME, warmed once),
# alternating; prints wall and median tokens/s per run.
rounds=$1; shift
PY=/work/main/.venv/bin/python
for t in "$@"; do
  export HOME=/tmp/bis/home-$t; mkdir -p $HOME
  (cd /tmp/bis/$t && $PY -m jaxtrain --config=configs/shakespeare_char.py --config.data.path=/work/shared/data/tinyshakespeare.txt --config.headless=True --config.train.max_steps=600 --config.workdir=/tmp/bis/w/$t-warm >/dev/null 2>&1)
done
for i in $(seq $rounds); do
  for t in "$@"; do
    export HOME=/tmp/bis/home-$t
    rm -rf /tmp/bis/w/$t-$i
    s=$(date +%s.%N)
    (cd /tmp/bis/$t && $PY -m jaxtrain --config=configs/shakespeare_char.py --config.data.path=/work/shared/data/tinyshakespeare.txt --config.headless=True --config.train.max_steps=600 --config.workdir=/tmp/bis/w/$t-$i > /tmp/bis/w/$t-$i.log 2>&1)
    e=$(date +%s.%N)
    tps=$($PY -c "
import json,statistics,sys
r=[json.loads(l) for l in open('/tmp/bis/w/$t-$i/metrics.jsonl')]
print(round(statistics.median([x['tokens_per_sec'] for x in r if 'tokens_per_sec' in x])))")
    echo "round $i $t wall $(python3 -c "print(round($e-$s,1))") tok/s $tps | $(grep '^time' /tmp/bis/w/$t-$i.log)"
  done
done
