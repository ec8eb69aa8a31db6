"""The samples at the end of a run: prompts from the validation text, continued, printed and
appended to samples.txt. Text from a saved run: `python -m jaxtrain.sample` (tools/sample.py)."""

import time
from pathlib import Path

import ml_collections
import numpy as np

from jaxtrain.core import steps
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.generation import decode, fit
from jaxtrain.system import signals


def prompts_from_text(tokens: np.ndarray, newline_id: int | None, n: int, length: int,
                      seed: int) -> np.ndarray:
  """`n` prompts of `length` tokens taken from `tokens`, each starting after a newline if possible."""
  rng = np.random.default_rng([seed, 2])
  rows = []
  for start in rng.integers(0, len(tokens) - 2 * length, size=n):
    chunk = np.asarray(tokens[start:start + 2 * length])
    if newline_id is not None:
      hits = np.flatnonzero(chunk[:length] == newline_id)
      if len(hits):
        start += hits[0] + 1
    rows.append(np.asarray(tokens[start:start + length], np.int32))
  return np.stack(rows)


def write_samples(s: ml_collections.ConfigDict, seq_len: int, seed: int, state: steps.TrainState,
                  val_tokens: np.ndarray, tok, workdir: Path, out) -> list[str]:
  """The `sample` section's samples at the end of a run: printed, appended to samples.txt."""
  if s.num_samples == 0 or s.max_new_tokens == 0:
    return []
  if s.prompt:
    ids = np.asarray(tok.encode(s.prompt), np.int32)
    note = fit.cut_line("sample.prompt", len(ids), "sample.max_new_tokens", s.max_new_tokens,
                        seq_len)
    if note:
      out.print(note)
    prompts = np.tile(fit.keep_last(ids, fit.room(seq_len, s.max_new_tokens)),
                      (s.num_samples, 1))
  else:
    prompts = prompts_from_text(val_tokens, tokenizer_lib.newline_id(tok), s.num_samples,
                                min(32, seq_len // 2), seed)
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

