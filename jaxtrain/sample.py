"""Text generation from a trained state: temperature and top-k sampling, one compiled loop."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain import steps


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
      if top_k > 0:
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
