"""`python -m jaxtrain.eval --workdir=runs/task --data=held_out.jsonl [--out=results.json]
[--normalize=strip|lower|none] [--step=latest|best|N]`: how well a trained run does a task
(docs/finetune.md, Task evaluation). The scoring is evals/scoring.py's, which a training run's
`train.eval_tasks` shares; this module holds the flags.
"""

import sys
from pathlib import Path

from absl import flags

from jaxtrain.evals import scoring
from jaxtrain.system import invocation, paths
from jaxtrain.system.errors import UserError
from jaxtrain.tools import cli


def run() -> None:
  f = flags.FLAGS
  if not f.workdir or not f.data:
    raise UserError("pass --workdir=<the run's workdir> and --data=<a .jsonl file of records>")
  fields = scoring.run_fields(f.workdir, f.prompt_field, f.completion_field,
                              context=f.context_field, endings=f.endings_field, label=f.label_field)
  result, seconds = scoring.score_run(f.workdir, f.data, fields, f.normalize, f.max_new_tokens,
                                      f.step, warn=lambda line: print(line, file=sys.stderr))
  print(f"step {result['step']} of {f.workdir} on {f.data} ({seconds:.1f}s)")
  print(scoring.table(result))
  if f.out:
    try:
      paths.write_json(Path(f.out).expanduser(), result)
    except OSError as e:
      raise UserError(f"cannot write {f.out} ({e.strerror}); pass --out=<a writable file>") \
          from None
    print(f"results: {f.out}", file=sys.stderr)


_COMMAND = invocation.command("jaxtrain.eval")
USAGE = (f"usage: {_COMMAND} --workdir=runs/task --data=FILE.jsonl [flags]\n"
         "Task scores of a trained run on held-out records: loss and bpb on completions, exact "
         "match of greedy completions, multiple-choice accuracy.")


def main() -> None:
  flags.DEFINE_string("workdir", None, "The run's workdir (e.g. runs/task).")
  flags.DEFINE_string("data", None, "A .jsonl file of held-out records.")
  flags.DEFINE_string("out", "", "Also write the results to this JSON file.")
  flags.DEFINE_string("step", "latest", "Checkpoint: latest, best (lowest val loss) or a step.")
  flags.DEFINE_string("prompt_field", "", "'': the run's data.prompt_field, else 'prompt'.")
  flags.DEFINE_string("completion_field", "", "'': the run's data.completion_field, else "
                      "'completion'.")
  flags.DEFINE_string("context_field", "context", "Multiple choice: the context's field.")
  flags.DEFINE_string("endings_field", "endings", "Multiple choice: the list of endings; a "
                      "record with this field is a multiple-choice record.")
  flags.DEFINE_string("label_field", "label", "Multiple choice: the index of the right ending.")
  flags.DEFINE_enum("normalize", "strip", list(scoring.NORMALIZE), "Exact match compares completions "
                    "as they are (none), stripped of surrounding whitespace (strip), or stripped "
                    "and lowercased (lower).")
  flags.DEFINE_integer("max_new_tokens", 0, "Tokens a greedy completion may have; 0: one more "
                       "than the longest reference.", lower_bound=0, upper_bound=2**16)
  cli.main(run, USAGE, __name__)
