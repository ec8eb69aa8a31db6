"""`python -m jaxtrain.lm_eval --model jaxtrain --model_args workdir=runs/nano --tasks ...`:
EleutherAI's lm-evaluation-harness on a run, with lm_eval's own command line (every flag of
`lm_eval` works as there: --tasks, --include_path, --limit, --num_fewshot, --output_path, ...) and
jaxtrain's runs known to it as `--model jaxtrain` (evals/harness.py). Needs
`pip install 'jaxtrain[lm_eval]'`; without it, one line says so."""

import sys

from jaxtrain.system import invocation
from jaxtrain.system.errors import UserError
from jaxtrain.tools import cli

INSTALL = "pip install 'jaxtrain[lm_eval]' (EleutherAI's lm-evaluation-harness)"
USAGE = (f"usage: {invocation.command('jaxtrain.lm_eval')} --model jaxtrain "
         "--model_args workdir=RUN[,step=best] --tasks TASKS [lm_eval's flags]\n"
         "lm-evaluation-harness on a run (docs/after-training.md).")


def main() -> None:
  try:
    import lm_eval.__main__ as harness_cli
  except ImportError:
    if any(a in cli.HELP_FLAGS for a in sys.argv[1:]):
      print(f"{USAGE}\nIt needs lm_eval, not installed here: {INSTALL}")
      return
    cli.fail(f"python -m jaxtrain.lm_eval needs lm_eval: {INSTALL}")
  from jaxtrain.evals import harness  # noqa: F401  (registers --model jaxtrain)

  try:
    harness_cli.cli_evaluate()
  except UserError as e:
    cli.fail(str(e))
