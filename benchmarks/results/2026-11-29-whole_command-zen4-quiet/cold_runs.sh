# usage: cold_runs.sh NAME ROUNDS "JAXTRAIN ARGS" TREE...: `python -m jaxtrain ARGS` in each TREE
# (a git worktree at /tmp/bis/TREE: git worktree add --detach /tmp/bis/REF REF), each run from a
# fresh HOME (cold caches), the trees alternating. Prints the wall time, /usr/bin/time's peak RSS
# and CPU seconds (the log's last line), the last eval line and jaxtrain's `time:` line.
#   the recipe:   cold_runs.sh recipe 2 "--config=configs/shakespeare_char.py --config.data.path=tinyshakespeare.txt" 07b332e 4f4151d nopurge
#   one step:     cold_runs.sh one 3 "--config=configs/nano.py --config.train.max_steps=1" 4f4151d par
name=$1 rounds=$2 args=$3; shift 3
PY=/work/main/.venv/bin/python
for i in $(seq "$rounds"); do
  for t in "$@"; do
    export HOME=$(mktemp -d /tmp/bis/home-XXXX)
    w=/tmp/bis/w/$name-$t-$i; rm -rf "$w"
    s=$(date +%s.%N)
    (cd /tmp/bis/$t && /usr/bin/time -f "%M KB %U+%S cpu" $PY -m jaxtrain $args --config.headless=True --config.workdir=$w > $w.log 2>&1)
    e=$(date +%s.%N)
    echo "round $i $t wall $(python3 -c "print(round($e-$s,2))") | $(tail -1 $w.log) | $(grep -aE '^eval step .*val loss' $w.log | tail -1 | cut -c1-40) | $(grep -a '^time' $w.log)"
    rm -rf "$HOME"
  done
done
