"""The samples at the end of a run: prompts from the validation text, continued, printed and
appended to samples.txt; and their programs compiled ahead (`warm`), beside the run's first
compile. Text from a saved run: `python -m jaxtrain.sample` (tools/sample.py)."""

import time
from pathlib import Path

import jax
import ml_collections
import numpy as np

from jaxtrain.core import steps
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.generation import decode, fit
from jaxtrain.system import signals


def wanted(s: ml_collections.ConfigDict) -> bool:
  return s.num_samples > 0 and s.max_new_tokens > 0


def run_prompts(s: ml_collections.ConfigDict, seq_len: int, seed: int, val_tokens: np.ndarray,
                tok, say=None) -> np.ndarray:
  """The prompts of the `sample` section's samples: its `prompt`, or windows of the validation
  text, each starting after a newline if possible. `say`: where the line goes that says what of a
  long `prompt` was cut."""
  if s.prompt:
    ids = fit.seen(np.asarray(tok.encode(s.prompt), np.int32), "sample.prompt",
                   "sample.max_new_tokens", s.max_new_tokens, seq_len, say)
    return np.tile(ids, (s.num_samples, 1))
  length, newline_id = min(32, seq_len // 2), tokenizer_lib.newline_id(tok)
  rng = np.random.default_rng([seed, 2])
  rows = []
  for start in rng.integers(0, len(val_tokens) - 2 * length, size=s.num_samples):
    if newline_id is not None:
      hits = np.flatnonzero(np.asarray(val_tokens[start:start + length]) == newline_id)
      if len(hits):
        start += hits[0] + 1
    rows.append(np.asarray(val_tokens[start:start + length], np.int32))
  return np.stack(rows)


def warm(s: ml_collections.ConfigDict, seq_len: int, seed: int, abstract: steps.TrainState,
         val_tokens: np.ndarray, tok, timed: bool = False) -> float:
  """Compiles the programs `write_samples` will run (the same shapes and settings; zeros for
  params) by decoding a token; `timed`: then makes the samples once, and returns how long
  they took, as they will at the end (else 0)."""
  prompts = run_prompts(s, seq_len, seed, val_tokens, tok)
  zeros = jax.tree.map(lambda a: np.broadcast_to(np.zeros((), a.dtype), a.shape), abstract.params)
  state = abstract.replace(params=zeros)
  kwargs = dict(temperature=s.temperature, top_k=s.top_k, seed=seed)
  # One token a chunk: the buffers have the shapes of the whole call's, one chunk decodes 1 token.
  next(decode.stream(state, prompts, s.max_new_tokens, chunk=1, **kwargs))
  if not timed:
    return 0.0
  t0 = time.perf_counter()
  decode.generate(state, prompts, s.max_new_tokens, **kwargs)
  return time.perf_counter() - t0


def write_samples(s: ml_collections.ConfigDict, seq_len: int, seed: int, state: steps.TrainState,
                  val_tokens: np.ndarray, tok, workdir: Path, out) -> list[str]:
  """The `sample` section's samples at the end of a run: printed, appended to samples.txt."""
  if not wanted(s):
    return []
  prompts = run_prompts(s, seq_len, seed, val_tokens, tok, out.print)
  t0 = time.time()
  ids = decode.generate(state, prompts, s.max_new_tokens, temperature=s.temperature,
                        top_k=s.top_k, seed=seed)
  signals.check()  # a Ctrl-C that Python dropped while generating: nothing is written
  texts = [tok.decode(row[:len(p)]) + "\u2502" + tok.decode(row[len(p):])
           for row, p in zip(ids, prompts)]
  step = int(state.step)
  with open(workdir / "samples.txt", "a", encoding="utf-8") as f:
    for i, text in enumerate(texts):
      f.write(f"=== step {step} sample {i} (prompt {len(prompts[i])} tokens, then "
              f"{s.max_new_tokens} sampled at temperature {s.temperature}) ===\n{text}\n")
  out.print(f"samples at step {step} ({time.time() - t0:.1f}s; the prompt ends at \u2502), also in "
            f"{workdir / 'samples.txt'}:")
  for i, text in enumerate(texts):
    out.print(f"--- sample {i} ---\n{text}")
  return texts

