# Each TREE is a git worktree at /tmp/bis/TREE (git worktree add --detach /tmp/bis/REF REF).
# usage: one.sh ROUNDS TREE...: nano one step, whole command, cold (fresh HOME), alternating.
rounds=$1; shift
PY=/work/main/.venv/bin/python
for i in $(seq $rounds); do
  for t in "$@"; do
    export HOME=$(mktemp -d /tmp/bis/onehome-XXXX)
    w=/tmp/bis/w/one-$t-$i; rm -rf $w
    s=$(date +%s.%N)
    (cd /tmp/bis/$t && /usr/bin/time -f "%M KB %U+%S cpu" $PY -m jaxtrain --config=configs/nano.py --config.headless=True --config.train.max_steps=1 --config.workdir=$w > $w.log 2>&1)
    e=$(date +%s.%N)
    echo "round $i $t wall $(python3 -c "print(round($e-$s,2))") | $(tail -1 $w.log) | $(grep '^time' $w.log)"
    rm -rf $HOME
  done
done
