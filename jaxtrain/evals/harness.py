"""A jaxtrain run as a model of EleutherAI's lm-evaluation-harness (`lm_eval`), registered under
the name `jaxtrain` when this module is imported (`python -m jaxtrain.lm_eval` does so, then runs
lm_eval's own command line):

    python -m jaxtrain.lm_eval --model jaxtrain --model_args workdir=runs/nano,step=best \\
        --tasks hellaswag

Every request runs jaxtrain's own forward pass on the checkpoint, as `python -m jaxtrain.eval` and
`train.eval_tasks` do (`complete.score`, `complete.complete`): no export, no torch, every model
switch. A context is what `complete.context_ids` gives the model (after an end-of-text token,
where documents are not masked), a continuation its own tokens, so that lm_eval's `acc_bytes`
(the ending of highest log-likelihood per UTF-8 byte) of a task whose `target_delimiter` is ""
is the `mc_accuracy` that jaxtrain logs for the same records (docs/after-training.md).
"""

import numpy as np
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from jaxtrain.checkpoints import load
from jaxtrain.generation import complete
from jaxtrain.system.errors import UserError

NAME = "jaxtrain"
MAX_GEN_TOKS = 256  # lm_eval's usual default where a task sets none


@register_model(NAME)
class JaxtrainLM(LM):
  """`--model_args workdir=RUN[,step=latest|best|N]`; lm_eval's batch_size and device are taken
  and ignored (jaxtrain batches and places requests itself)."""

  def __init__(self, workdir: str = "", step="latest", **_ignored):
    super().__init__()
    if not workdir:
      raise UserError("--model jaxtrain needs --model_args workdir=<the workdir of a run>")
    self.state, self.tok = load.load(str(workdir), str(step))

  def _pair(self, context: str, continuation: str) -> tuple[np.ndarray, np.ndarray]:
    return (complete.context_ids(self.state, self.tok, context),
            np.asarray(self.tok.encode(continuation), np.int32))

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    """(log-likelihood of each continuation given its context, whether it is the greedy one)."""
    pairs = [self._pair(*r.args) for r in requests]
    greedy: list = []
    nats = complete.score(self.state, pairs, greedy=greedy)
    return [(float(x), bool(g)) for x, g in zip(nats, greedy)]

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """The log-likelihood of each whole text, in windows of the model's context, each token
    scored once (the first after an end-of-text token, as a document starts)."""
    out = []
    for r in requests:
      ids = self.tok.encode(r.args[0]).tolist()
      windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
          ids, prefix_token=self.tok.eot_id, max_seq_len=self.state.model_cfg.seq_len, context_len=1)]
      pairs = [(np.asarray(c, np.int32), np.asarray(x, np.int32)) for c, x in windows]
      out.append(float(complete.score(self.state, pairs).sum()) if pairs else 0.0)
    return out

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Each context's continuation (greedy unless the task samples), cut before the first of
    its `until` strings; requests with the same settings are generated together."""
    out: list[str] = [""] * len(requests)
    groups: dict = {}
    for i, r in enumerate(requests):
      context, kwargs = r.args
      kwargs = dict(kwargs or {})
      until = kwargs.pop("until", None) or []
      until = [until] if isinstance(until, str) else list(until)
      sample = bool(kwargs.get("do_sample", False))
      key = (int(kwargs.get("max_gen_toks", MAX_GEN_TOKS)),
             float(kwargs.get("temperature", 1.0)) if sample else 0.0)
      groups.setdefault(key, []).append((i, context, until))
    for (n_new, temperature), rows in groups.items():
      made = complete.complete(self.state, self.tok, [c for _, c, _ in rows], n_new,
                               temperature=temperature)
      for (i, _, until), text in zip(rows, made):
        cut = [text.index(u) for u in until if u and u in text]
        out[i] = text[:min(cut)] if cut else text
    return out
