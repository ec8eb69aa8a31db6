# Each TREE is a git worktree at /tmp/bis/TREE (git worktree add --detach /tmp/bis/REF REF).
# usage: cold.sh ROUNDS TREE...: the Shakespeare recipe as shipped, whole command from a fresh HOME, alternating.
rounds=$1; shift
PY=/work/main/.venv/bin/python
for i in $(seq $rounds); do
  for t in "$@"; do
    export HOME=$(mktemp -d /tmp/bis/coldhome-XXXX)
    w=/tmp/bis/w/cold-$t-$i; rm -rf $w
    s=$(date +%s.%N)
    (cd /tmp/bis/$t && $PY -m jaxtrain --config=configs/shakespeare_char.py --config.data.path=/work/shared/data/tinyshakespeare.txt --config.headless=True --config.workdir=$w > $w.log 2>&1)
    e=$(date +%s.%N)
    echo "round $i $t wall $(python3 -c "print(round($e-$s,1))") | $(grep -E '^eval step .*val loss' $w.log | tail -1 | cut -c1-40) | $(grep '^time' $w.log)"
    rm -rf $HOME
  done
done
