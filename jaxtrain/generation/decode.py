"""Token-by-token generation with a key-value cache: the prompt runs through the model once
(prefill), then each new token is one position's forward pass against the cached keys and values
of the positions before it, in a jitted loop. Both are the model's own forward pass, given a
key-value cache (core/kvcache.py) to extend.

The context window: a model sees at most `seq_len` tokens. Once the window is full, it restarts
from its last `keep` tokens (half of seq_len), which run through the model again as a prefill at
positions 0.. (RoPE's and learned positions both restart there), and the cache fills up again.
A no-cache path (`use_cache=False`: the whole window through the model for every token) uses the
same windows, so both give the same tokens; tests/test_decode.py checks it for every model switch.
Shape suffixes as in model.py, plus L token buffer length.
"""

import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain.core import kvcache
from jaxtrain.core import model as model_lib
from jaxtrain.system.errors import UserError

PROMPT_BUCKET = 16  # the smallest padded prefill (prompt_bucket)


def keep_length(seq_len: int) -> int:
  """Tokens a full window restarts from: the prefill of a restart is amortized over the
  seq_len - keep tokens decoded after it."""
  return max(1, seq_len // 2)


def window_start(n, seq_len: int, keep: int):
  """Where the window of a model that knows `n` tokens starts (numpy or traced ints). Up to
  seq_len tokens it starts at 0; then it restarts at n - keep each time it would pass seq_len."""
  period = seq_len - keep + 1  # a restart's window grows from keep to seq_len tokens
  restart = seq_len + 1 + (n - seq_len - 1) // period * period
  if isinstance(n, int):
    return 0 if n <= seq_len else restart - keep
  return jnp.where(n <= seq_len, 0, restart - keep)


def pick(logits_BV: jax.Array, key: jax.Array, temperature: float, top_k: int,
         top_p: float) -> jax.Array:
  """The next token of each row: the argmax at temperature 0, else a draw from the tempered
  distribution cut to its `top_k` likeliest tokens (0: all) and then to the smallest set whose
  probability reaches `top_p` (1: all)."""
  if temperature == 0.0:
    return jnp.argmax(logits_BV, axis=-1)
  logits_BV = logits_BV / temperature
  if 0 < top_k < logits_BV.shape[-1]:  # a k past the vocabulary keeps every token
    kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV < kth_B1, -jnp.inf, logits_BV)
  if top_p < 1.0:
    sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV  # probability of the likelier tokens
    kept_BV = (before_BV < top_p) | (jnp.arange(logits_BV.shape[-1]) == 0)  # the likeliest always
    lowest_B1 = jnp.min(jnp.where(kept_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    logits_BV = jnp.where(logits_BV < lowest_B1, -jnp.inf, logits_BV)
  return jax.random.categorical(key, logits_BV, axis=-1)


def _logits_at(model, buf_BL, n, cache, *, use_cache: bool, keep: int):
  """The logits for token n (the model knows buf[:, :n]), and the cache with token n - 1 (or the
  restarted window) in it."""
  T = model.c.seq_len
  start = window_start(n, T, keep)
  if not use_cache:  # the whole window, padded: the model is causal, so padding is never seen
    window_BT = jax.lax.dynamic_slice_in_dim(buf_BL, start, T, axis=1)
    logits_BTV = model(window_BT)
    return jax.lax.dynamic_index_in_dim(logits_BTV, n - 1 - start, axis=1, keepdims=False), cache

  def restart(cache):
    window_BK = jax.lax.dynamic_slice_in_dim(buf_BL, start, keep, axis=1)
    logits_BKV, cache = model(window_BK, cache=cache, pos=jnp.int32(0))
    return logits_BKV[:, -1], cache

  def step(cache):
    last_B1 = jax.lax.dynamic_slice_in_dim(buf_BL, n - 1, 1, axis=1)
    logits_B1V, cache = model(last_B1, cache=cache, pos=n - 1 - start)
    return logits_B1V[:, 0], cache

  # A window that started anew (n - start == keep then) runs through whole, as a prefill.
  restarted = start != window_start(n - 1, T, keep)
  return jax.lax.cond(restarted, restart, step, cache)


@functools.partial(jax.jit, static_argnames=("graphdef", "use_cache", "keep", "temperature",
                                             "top_k", "top_p"),
                   donate_argnames=("carry",))
def _decode(params, graphdef, carry, n_steps, *, use_cache: bool, keep: int,
            temperature: float, top_k: int, top_p: float):
  """`n_steps` tokens (traced: one compile for any count): each is drawn from the carried logits,
  written to the buffer, then run through the model for the next logits."""
  model = nnx.merge(graphdef, params)

  def body(_, carry):
    buf_BL, cache, n, logits_BV, key = carry
    key, sub = jax.random.split(key)
    next_B = pick(logits_BV, sub, temperature, top_k, top_p).astype(buf_BL.dtype)
    buf_BL = jax.lax.dynamic_update_slice_in_dim(buf_BL, next_B[:, None], n, axis=1)
    n = n + 1
    logits_BV, cache = _logits_at(model, buf_BL, n, cache, use_cache=use_cache, keep=keep)
    return buf_BL, cache, n, logits_BV, key

  return jax.lax.fori_loop(0, n_steps, body, carry)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _prefill(params, graphdef, window_BW, length):
  """The logits for the token after the prompt's window (its first `length` tokens: the rest is
  padding, so that prompts of similar lengths share a compile), and the cache holding it. The
  padding's keys and values in the cache are never seen: each later token writes its own at its
  position before attending up to it."""
  model = nnx.merge(graphdef, params)
  logits_BWV, cache = model(window_BW, cache=kvcache.empty(model.c, window_BW.shape[0]),
                             pos=jnp.int32(0))
  return jax.lax.dynamic_index_in_dim(logits_BWV, length - 1, axis=1, keepdims=False), cache


@functools.partial(jax.jit, static_argnames=("graphdef", "keep"))
def _prefill_uncached(params, graphdef, buf_BL, n, *, keep: int):
  return _logits_at(nnx.merge(graphdef, params), buf_BL, n, None, use_cache=False, keep=keep)[0]


def stream(state, prompts_BP: np.ndarray, n_new: int, *,
           temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
           use_cache: bool = True, chunk: int = 0) -> Iterator[np.ndarray]:
  """Yields the new tokens of every row, `chunk` at a time (0: all at once), as they are made:
  the same seed gives the same tokens however they are chunked. `state`: a TrainState (or
  anything with its params, graphdef and model_cfg), used on one device outside any mesh."""
  params, graphdef, c = jax.device_get(state.params), state.graphdef, state.model_cfg
  use_cache = use_cache and not model_lib.kv_cache(c)  # an extension's part may extend none
  B, P = prompts_BP.shape
  if P == 0:
    raise UserError("a prompt needs at least one token")
  if n_new <= 0:
    return
  T, keep = c.seq_len, keep_length(c.seq_len)
  chunk = n_new if chunk <= 0 else min(chunk, n_new)
  n_chunks = -(-n_new // chunk)
  # Room for every chunk in full, and for a whole window past the last token (no-cache path);
  # the same for every prompt that fits the context, and rounded up: one decode program serves
  # them all.
  buf_BL = np.zeros((B, _bucket(max(P, T) + n_chunks * chunk + T, 256)), np.int32)
  buf_BL[:, :P] = prompts_BP
  if use_cache:
    start = window_start(P, T, keep)
    window_BW = np.zeros((B, prompt_bucket(P - start, T)), np.int32)
    window_BW[:, :P - start] = buf_BL[:, start:P]
    logits_BV, cache = _prefill(params, graphdef, jnp.asarray(window_BW), jnp.int32(P - start))
  else:
    logits_BV, cache = _prefill_uncached(params, graphdef, jnp.asarray(buf_BL), jnp.int32(P),
                                         keep=keep), None
  carry = (jnp.asarray(buf_BL), cache, jnp.int32(P), logits_BV, jax.random.PRNGKey(seed))
  for done in range(0, n_new, chunk):
    carry = _decode(params, graphdef, carry, jnp.int32(chunk), use_cache=use_cache, keep=keep,
                    temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
    yield np.array(carry[0])[:, P + done:P + min(done + chunk, n_new)]  # host slice: no program per chunk


def prompt_bucket(n: int, seq_len: int) -> int:
  """The length a prefill of a window of `n` tokens is padded to: 16, 64, 256, 1024, ... (x4)
  or seq_len, whichever is less. Every prompt length then shares one of a handful of prefill
  programs, at the cost of at most 4x a prompt's tokens (16 for a shorter one) in its prefill."""
  size = PROMPT_BUCKET
  while size < n:
    size *= 4
  return min(size, seq_len)


def _bucket(n: int, smallest: int) -> int:
  """The power of two (at least `smallest`) at or above n."""
  return max(smallest, 1 << (n - 1).bit_length())


def generate(state, prompts, n_new: int, *, tokenizer=None, **kwargs):
  """Continues each prompt by `n_new` tokens; returns prompt and continuation together, in the
  prompts' own form: token ids int[P] -> int32[P + n_new], int[B, P] (prompts of one length) ->
  int32[B, P + n_new]; text, a str -> str or a list of str -> list of str, encoded and decoded with
  the run's `tokenizer` (`load_tokenizer(workdir)`). kwargs: those of `stream` (temperature, top_k,
  top_p, seed, use_cache: with a key-value cache, or False to run the whole window for every token,
  with the same tokens; a model with a part of an extension that extends no cache runs without
one). Anything else is a UserError that says what a prompt is."""
  if not all(hasattr(state, a) for a in ("params", "graphdef", "model_cfg")):
    raise UserError(f"generate continues with a train state, not {type(state).__name__}: pass "
                    "jt.load_state(workdir) (or a state of jt.init, jt.build)")
  if isinstance(n_new, bool) or not isinstance(n_new, int | np.integer) or n_new < 0:
    raise UserError(f"generate: n_new={n_new!r} is not a count of tokens; pass an int >= 0")
  texts = [prompts] if isinstance(prompts, str) else prompts
  if isinstance(texts, list | tuple) and texts and all(isinstance(t, str) for t in texts):
    if not all(callable(getattr(tokenizer, f, None)) for f in ("encode", "decode")):
      raise UserError("generate: a text prompt needs the run's tokenizer: pass "
                      "tokenizer=jt.load_tokenizer(workdir), or token ids")
    ids, made = [np.asarray(tokenizer.encode(t), np.int32) for t in texts], {}
    for length in {len(x) for x in ids}:  # rows of one length go through together
      at = [i for i, x in enumerate(ids) if len(x) == length]
      made |= zip(at, generate(state, np.stack([ids[i] for i in at]), n_new, **kwargs))
    rows = [tokenizer.decode(made[i]) for i in range(len(ids))]
    return rows[0] if isinstance(prompts, str) else rows
  ids = _prompt_ids(prompts, state.model_cfg.vocab_size)
  made = np.concatenate([np.atleast_2d(ids), *stream(state, np.atleast_2d(ids), n_new, **kwargs)], 1)
  return made[0] if ids.ndim == 1 else made


def _prompt_ids(prompts, vocab_size: int) -> np.ndarray:
  """`prompts` as int32 token ids, int[P] or int[B, P], each in the vocabulary; else a UserError
  that says what a prompt is."""
  what = ("a prompt is text (a str, or a list of str, with tokenizer=...) or token ids (int[P], "
          "or int[B, P] for prompts of one length)")
  try:
    ids = np.asarray(prompts)
  except ValueError:  # rows of unequal lengths
    raise UserError(f"generate: the prompts' rows differ in length; {what}: pass text, or one "
                    "prompt at a time") from None
  if ids.dtype.kind not in "iu" or ids.ndim not in (1, 2):
    got = f"{type(prompts).__name__} of {ids.dtype}, shape {ids.shape}" if ids.ndim else \
        type(prompts).__name__
    raise UserError(f"generate: {what}, not {got}")
  if ids.size == 0:
    raise UserError("generate: a prompt needs at least one token")
  if ids.min() < 0 or ids.max() >= vocab_size:
    raise UserError(f"generate: token ids must be in 0..{vocab_size - 1}, the model's vocabulary "
                    f"(these run {ids.min()}..{ids.max()}); encode text with the run's tokenizer")
  return ids.astype(np.int32)
