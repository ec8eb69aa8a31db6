#!/bin/bash
# usage: screen.sh NAME BUDGET SEED [overrides...]
name=$1; budget=$2; seed=$3; shift 3
wd=/tmp/q5/runs/$name-s$seed; rm -rf $wd
cd /work/main
start=$(date +%s.%N)
flock /work/cpu.lock bash -c "s=\$(date +%s.%N); .venv/bin/python -m jaxtrain --config=configs/shakespeare_char.py --config.data.path=/work/shared/data/tinyshakespeare.txt --config.train.time_budget=$budget --config.seed=$seed --config.workdir=$wd --config.headless=True --config.sample.num_samples=0 --jax_platforms=cpu $* > /tmp/q5/$name-s$seed.log 2>&1; e=\$(date +%s.%N); echo \"wall \$(echo \"\$e - \$s\" | bc)\" >> /tmp/q5/$name-s$seed.log"
/work/main/.venv/bin/python - "$wd" "$name" "$seed" "$*" <<'PY'
import json,sys
wd,name,seed,ov=sys.argv[1:]
lines=[json.loads(l) for l in open(wd+"/metrics.jsonl")]
ev=[l for l in lines if "val_loss" in l]
wall=[l for l in open(f"/tmp/q5/{name}-s{seed}.log") if l.startswith("wall")][-1].split()[1]
r={"name":name,"seed":int(seed),"final":ev[-1]["val_loss"],"best":min(e["val_loss"] for e in ev),"steps":ev[-1]["step"],"wall":float(wall),"overrides":ov}
print(json.dumps(r)); open("/tmp/q5/results.jsonl","a").write(json.dumps(r)+"\n")
PY
