"""Text generation from a trained state: temperature and top-k sampling, one compiled loop."""

import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from jaxtrain import steps
from jaxtrain import tokenizer as tokenizer_lib


@functools.partial(jax.jit, static_argnames=("graphdef", "n_new", "seq_len", "temperature", "top_k"))
def _generate(params, graphdef, buf_BL, n_prompt, key, *, n_new: int, seq_len: int,
              temperature: float, top_k: int):
  model = nnx.merge(graphdef, params)
  T = seq_len

  def body(i, carry):
    buf_BL, key = carry
    n = n_prompt + i  # tokens known so far
    # The last T known tokens; the model is causal, so anything after them is never seen.
    start = jnp.maximum(0, n - T)
    window_BT = jax.lax.dynamic_slice_in_dim(buf_BL, start, T, axis=1)
    logits_BTV = model(window_BT)
    logits_BV = jax.lax.dynamic_index_in_dim(logits_BTV, n - 1 - start, axis=1, keepdims=False)
    key, sub = jax.random.split(key)
    if temperature == 0.0:
      next_B = jnp.argmax(logits_BV, axis=-1)
    else:
      logits_BV = logits_BV / temperature
      if 0 < top_k < logits_BV.shape[-1]:  # a k past the vocabulary keeps every token
        kth = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
        logits_BV = jnp.where(logits_BV < kth, -jnp.inf, logits_BV)
      next_B = jax.random.categorical(sub, logits_BV, axis=-1)
    buf_BL = jax.lax.dynamic_update_slice_in_dim(buf_BL, next_B[:, None].astype(buf_BL.dtype), n,
                                                 axis=1)
    return buf_BL, key

  buf_BL, _ = jax.lax.fori_loop(0, n_new, body, (buf_BL, key))
  return buf_BL


def generate(state: steps.TrainState, prompts_BP: np.ndarray, n_new: int, *, seq_len: int,
             temperature: float = 0.8, top_k: int = 0, seed: int = 0) -> np.ndarray:
  """Continues each row of `prompts_BP` by `n_new` tokens; returns prompt and continuation."""
  B, P = prompts_BP.shape
  L = max(P + n_new, seq_len)
  buf_BL = np.zeros((B, L), np.int32)
  buf_BL[:, :P] = prompts_BP
  params = jax.device_get(state.params)  # small work: one device, outside the training mesh
  out = _generate(params, state.graphdef, jnp.asarray(buf_BL), P, jax.random.PRNGKey(seed),
                  n_new=n_new, seq_len=seq_len, temperature=float(temperature), top_k=int(top_k))
  return np.asarray(out)[:, :P + n_new]


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
    ids = tok.encode(s.prompt).astype(np.int32)[-seq_len:]
    prompts = np.tile(ids, (s.num_samples, 1))
  else:
    prompts = prompts_from_text(val_tokens, tokenizer_lib.newline_id(tok), s.num_samples,
                                min(32, seq_len // 2), seed)
  t0 = time.time()
  ids = generate(state, prompts, s.max_new_tokens, seq_len=seq_len, temperature=s.temperature,
                 top_k=s.top_k, seed=seed)
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
