"""Many requests decoded together on the key-value cache: a fixed number of rows (slots), each at
its own position, advanced a few tokens at a time by one compiled program.

A request's prompt enters a free row by its own prefill (`admit`: generation/decode.py's prefill,
the prompt padded to decode.prompt_bucket's lengths), written into that row of the cache; the
rows then advance together (`advance`), each drawing its next token with its own temperature,
top-k, top-p and random key, and running it through the model at its own position: the model's
forward pass for one row, vmapped over the rows. A row whose window passes the context restarts
it as decode.py does (from its latest half). So a request's tokens are those `jt.generate` makes
for its prompt alone, whoever shares the batch: the same seed, the same tokens.

Static shapes (rows, buffer length, tokens per advance): a handful of programs, compiled once. An
advance runs the first 1, 4, 16, ... rows that hold every live one (`row_buckets`; a request takes
the first free row), so a lone request on a large batch does not pay for the free rows.
Shape suffixes as in core/model.py, plus R rows, L token buffer length, S tokens per advance.
"""

import concurrent.futures
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain.core import kvcache
from jaxtrain.generation import decode


class Rows(NamedTuple):
  """What the device holds of every row."""
  buf_RL: jax.Array  # int32: the row's tokens, its prompt then what it made
  cache: kvcache.Cache
  n_R: jax.Array  # int32: the tokens each row knows
  logits_RV: jax.Array  # float32: each row's logits for its next token
  key_R2: jax.Array  # uint32: each row's random key (jax.random.PRNGKey's, split every token)
  temperature_R: jax.Array
  top_k_R: jax.Array
  top_p_R: jax.Array
  live_R: jax.Array  # bool: the row holds a request


def empty_rows(c, rows: int, length: int) -> Rows:
  f32 = lambda: jnp.zeros((rows,), jnp.float32)  # noqa: E731
  return Rows(jnp.zeros((rows, length), jnp.int32), kvcache.empty(c, rows), jnp.ones((rows,), jnp.int32),
              jnp.zeros((rows, c.vocab_size), jnp.float32), jnp.zeros((rows, 2), jnp.uint32), f32(),
              jnp.zeros((rows,), jnp.int32), jnp.ones((rows,), jnp.float32), jnp.zeros((rows,), bool))


def pick_rows(logits_RV: jax.Array, key_R2: jax.Array, temperature_R: jax.Array, top_k_R: jax.Array,
              top_p_R: jax.Array) -> jax.Array:
  """Each row's next token as decode.pick draws it for that row alone, with the row's own
  settings: the argmax at temperature 0; else a draw from the tempered logits cut to the top_k
  likeliest (0: all) and then to the smallest set whose probability reaches top_p."""
  V = logits_RV.shape[-1]
  warm_R = temperature_R > 0
  scaled_RV = logits_RV / jnp.where(warm_R, temperature_R, 1.0)[:, None]

  def cut(x_RV):
    desc_RV = jnp.sort(x_RV, axis=-1)[:, ::-1]
    kth_R1 = jnp.take_along_axis(desc_RV, jnp.clip(top_k_R - 1, 0, V - 1)[:, None], axis=-1)
    by_k_R1 = ((top_k_R > 0) & (top_k_R < V))[:, None]
    x_RV = jnp.where(by_k_R1 & (x_RV < kth_R1), -jnp.inf, x_RV)
    desc_RV = jnp.sort(x_RV, axis=-1)[:, ::-1]
    probs_RV = jax.nn.softmax(desc_RV, axis=-1)
    before_RV = jnp.cumsum(probs_RV, axis=-1) - probs_RV
    kept_RV = (before_RV < top_p_R[:, None]) | (jnp.arange(V) == 0)  # the likeliest always stays
    lowest_R1 = jnp.min(jnp.where(kept_RV, desc_RV, jnp.inf), axis=-1, keepdims=True)
    return jnp.where((top_p_R < 1.0)[:, None] & (x_RV < lowest_R1), -jnp.inf, x_RV)

  cutting = jnp.any(warm_R & ((top_k_R > 0) | (top_p_R < 1.0)))
  scaled_RV = jax.lax.cond(cutting, cut, lambda x: x, scaled_RV)
  # One row's draw as decode.pick makes it for a batch of that row alone.
  drawn_R = jax.vmap(lambda k, x: jax.random.categorical(k, x[None], axis=-1)[0])(key_R2, scaled_RV)
  return jnp.where(warm_R, drawn_R, jnp.argmax(logits_RV, axis=-1))


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("rows",))
def _admit(params, graphdef, rows: Rows, row, window_W, length, temperature, top_k, top_p, key):
  """`rows` with row `row` holding a new request: its prompt (the first `length` tokens of
  `window_W`), its prefill's cache and logits, and its settings."""
  model = nnx.merge(graphdef, params)
  logits_1WV, cache_1 = model(window_W[None], cache=kvcache.empty(model.c, 1), pos=jnp.int32(0))
  put = lambda all_R, one: jax.lax.dynamic_update_slice_in_dim(all_R, one.astype(all_R.dtype), row, 0)  # noqa: E731
  prompt_1L = jnp.zeros((1, rows.buf_RL.shape[1]), jnp.int32).at[0, :window_W.shape[0]].set(window_W)
  at = lambda x_R, value: x_R.at[row].set(value)  # noqa: E731
  return Rows(put(rows.buf_RL, prompt_1L), jax.tree.map(put, rows.cache, cache_1),
              at(rows.n_R, length),
              put(rows.logits_RV, jax.lax.dynamic_index_in_dim(logits_1WV, length - 1, axis=1)[0]),
              put(rows.key_R2, key[None]), at(rows.temperature_R, temperature),
              at(rows.top_k_R, top_k), at(rows.top_p_R, top_p), at(rows.live_R, True))


@functools.partial(jax.jit, donate_argnames=("rows",))
def _release(rows: Rows, row) -> Rows:
  """`rows` with row `row` free: it stays at one token, so its window never restarts."""
  return rows._replace(n_R=rows.n_R.at[row].set(1), live_R=rows.live_R.at[row].set(False),
                       temperature_R=rows.temperature_R.at[row].set(0.0))


def _row_logits(model, buf_L, n, cache, *, keep: int, restart: bool):
  """One row's logits for token n (the row knows buf[:n]), and its cache with token n - 1 in it
  (`restart`: with its window restarted, run whole). decode._logits_at for a row of one."""
  T = model.c.seq_len
  start = decode.window_start(n, T, keep)
  cache_1 = jax.tree.map(lambda x: x[None], cache)
  if restart:
    logits_1TV, cache_1 = model(jax.lax.dynamic_slice_in_dim(buf_L, start, keep)[None], cache=cache_1,
                                pos=jnp.int32(0))
  else:
    logits_1TV, cache_1 = model(jax.lax.dynamic_slice_in_dim(buf_L, n - 1, 1)[None], cache=cache_1,
                                pos=n - 1 - start)
  return logits_1TV[0, -1], jax.tree.map(lambda x: x[0], cache_1)


@functools.partial(jax.jit, static_argnames=("graphdef", "keep", "steps", "first"),
                   donate_argnames=("rows",))
def _advance(params, graphdef, rows: Rows, *, keep: int, steps: int,
             first: int) -> tuple[Rows, jax.Array]:
  """`steps` tokens of every live row among the `first` rows (the others are left as they are):
  (the rows, int32[first, steps] the tokens drawn)."""
  model = nnx.merge(graphdef, params)
  T = model.c.seq_len
  step = jax.vmap(functools.partial(_row_logits, model, keep=keep, restart=False))
  restart = jax.vmap(functools.partial(_row_logits, model, keep=keep, restart=True))

  def body(t, carry):
    rows, made_RS = carry
    key_R2, sub_R2 = jnp.moveaxis(jax.vmap(jax.random.split)(rows.key_R2), 1, 0)
    next_R = pick_rows(rows.logits_RV, sub_R2, rows.temperature_R, rows.top_k_R, rows.top_p_R)
    buf_RL = jax.vmap(lambda b, x, i: jax.lax.dynamic_update_slice_in_dim(b, x[None], i, 0))(
        rows.buf_RL, next_R.astype(jnp.int32), rows.n_R)
    n_R = rows.n_R + rows.live_R
    restarted_R = rows.live_R & (decode.window_start(n_R, T, keep) != decode.window_start(n_R - 1, T, keep))

    stepped = step(buf_RL, n_R, rows.cache)

    def with_restarts(stepped):  # only where a row restarts: that row's window run whole instead
      # The restart rewrites the cache's first `keep` positions, the step's write among them.
      fresh = restart(buf_RL, n_R, stepped[1])
      pick = lambda a, b: jnp.where(restarted_R.reshape(-1, *[1] * (a.ndim - 1)), a, b)  # noqa: E731
      return jax.tree.map(pick, fresh, stepped)

    logits_RV, cache = jax.lax.cond(jnp.any(restarted_R), with_restarts, lambda s: s, stepped)
    rows = rows._replace(buf_RL=buf_RL, cache=cache, n_R=n_R, logits_RV=logits_RV, key_R2=key_R2)
    return rows, made_RS.at[:, t].set(next_R.astype(jnp.int32))

  part = jax.tree.map(lambda x: x[:first], rows)
  part, made_RS = jax.lax.fori_loop(0, steps, body, (part, jnp.zeros((first, steps), jnp.int32)))
  return jax.tree.map(lambda x, y: jax.lax.dynamic_update_slice_in_dim(x, y, 0, 0), rows, part), made_RS


def row_buckets(rows: int) -> list[int]:
  """The numbers of first rows an advance runs: 1, 4, 16, ... (x4) and `rows`, so that a few
  requests on a large batch do not pay for its free rows."""
  sizes = [1]
  while sizes[-1] * 4 < rows:
    sizes.append(sizes[-1] * 4)
  return sizes + [rows] * (sizes[-1] < rows)


class Engine:
  """`rows` requests at once, `steps` tokens per `advance`, each request at most `max_tokens` new
  tokens after a prompt of at most the model's seq_len. Used from one thread."""

  def __init__(self, state, rows: int, max_tokens: int, steps: int = 8):
    self.c = state.model_cfg
    self.params, self.graphdef = jax.device_put(jax.device_get(state.params)), state.graphdef
    self.n_rows, self.steps, self.keep = rows, steps, decode.keep_length(self.c.seq_len)
    # A row's prompt, every token it may make and a whole advance past them.
    self.length = self.c.seq_len + max_tokens + steps
    self.rows = empty_rows(self.c, rows, self.length)
    self.live: set[int] = set()

  def admit(self, row: int, prompt: np.ndarray, *, temperature: float, top_k: int, top_p: float,
            seed: int) -> None:
    """Row `row` starts on `prompt` (int ids, 1 to seq_len of them)."""
    P = len(prompt)
    assert 0 < P <= self.c.seq_len, P
    window_W = np.zeros(decode.prompt_bucket(P, self.c.seq_len), np.int32)
    window_W[:P] = prompt
    self.live.add(row)
    self.rows = _admit(self.params, self.graphdef, self.rows, jnp.int32(row), jnp.asarray(window_W),
                       jnp.int32(P), jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p),
                       jax.random.PRNGKey(seed))

  def release(self, row: int) -> None:
    self.live.discard(row)
    self.rows = _release(self.rows, jnp.int32(row))

  def advance(self) -> np.ndarray:
    """int32[first rows, steps]: the next tokens of the first rows, every live one among them
    (a free row's are noise)."""
    first = next(k for k in row_buckets(self.n_rows) if k > max(self.live, default=0))
    self.rows, made_RS = _advance(self.params, self.graphdef, self.rows, keep=self.keep,
                                  steps=self.steps, first=first)
    return np.asarray(made_RS)

  def reset(self) -> None:
    """Every row free, on fresh buffers (after a failed call, whose donated ones are gone)."""
    self.rows = empty_rows(self.c, self.n_rows, self.length)
    self.live = set()

  def warm(self, threads: int = 2) -> None:
    """Compiles what serving runs, `threads` programs at a time: a prefill for each padded prompt
    length, and an advance for each row bucket."""
    sizes = [decode.PROMPT_BUCKET]
    while sizes[-1] < self.c.seq_len:
      sizes.append(sizes[-1] * 4)

    def prefill(size: int) -> None:
      _admit(self.params, self.graphdef, empty_rows(self.c, self.n_rows, self.length), jnp.int32(0),
             jnp.zeros(min(size, self.c.seq_len), jnp.int32), jnp.int32(1), jnp.float32(0.0),
             jnp.int32(0), jnp.float32(1.0), jax.random.PRNGKey(0))

    def advance(first: int) -> None:
      _advance(self.params, self.graphdef, empty_rows(self.c, self.n_rows, self.length),
               keep=self.keep, steps=self.steps, first=first)[1].block_until_ready()

    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
      done = [pool.submit(advance, k) for k in row_buckets(self.n_rows)]
      done += [pool.submit(prefill, size) for size in sizes]
      for future in done:
        future.result()
