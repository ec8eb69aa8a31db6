"""Completions of many prompts at once, and the log-likelihood of given continuations.

A prompt is a document's start: a model trained with document masks (prompt/completion data) sees
it alone, as in training; any other model sees it after an end-of-text token, as documents follow
one another in its training stream.
"""

import functools
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.generation import decode
from jaxtrain.system.errors import UserError

CHUNK = 16  # tokens per compiled call: rows that all ended stop after at most this many more


def context_ids(state, tok, text: str | np.ndarray) -> np.ndarray:
  """The tokens the model sees before a completion of `text` (or of these tokens)."""
  ids = np.asarray(tok.encode(text) if isinstance(text, str) else text, np.int32)
  if state.model_cfg.doc_mask and len(ids):
    return ids
  return np.concatenate([np.array([tok.eot_id], np.int32), ids])


def prompt_ids(tok, text: str, fix: str = "pass --prompt=...") -> np.ndarray:
  """The tokens of a prompt to continue (sample's, the server's); an empty prompt starts from a
  newline where the vocabulary has one, else it is a UserError ending in `fix`. A character
  outside the vocabulary is a UserError."""
  if text == "":
    nl = tokenizer_lib.newline_id(tok)
    if isinstance(tok, tokenizer_lib.IdsTokenizer) and tok.eot_id >= 0:
      nl = tok.eot_id  # token ids without text: a new document's start
    if nl is None:
      which = "token ids (without a tokenizer) have" if isinstance(tok, tokenizer_lib.IdsTokenizer) \
          else "char vocabulary has"
      raise UserError(f"this run's {which} no newline to start from; {fix}")
    return np.array([nl], np.int32)
  return np.asarray(tok.encode(text), np.int32)  # a char outside the vocabulary: UserError


def complete(state, tok, prompts: list[str], max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, batch_size: int = 64,
             keep: int = 0) -> list[str]:
  """The completion of each prompt, up to its end-of-text token or `max_new_tokens` tokens.
  `keep`: each prompt's last `keep` tokens (fit.room; the caller says which were cut); 0: all,
  the decoder's window then taking the latest tokens where they pass the context."""
  ids = [context_ids(state, tok, p) for p in prompts]
  if keep:
    ids = [x[-keep:] for x in ids]
  by_length = defaultdict(list)
  for i, x in enumerate(ids):
    by_length[len(x)].append(i)
  out: list[str] = [""] * len(prompts)
  for rows in by_length.values():
    for at in range(0, len(rows), batch_size):
      group = rows[at:at + batch_size]
      # Rows repeated up to a power of two, so that a few batch sizes share the compiles.
      padded = group + group[:1] * (decode._bucket(len(group), 1) - len(group))
      prompts_BP = np.stack([ids[i] for i in padded])
      new_BN = _until_eot(state, prompts_BP, max_new_tokens, tok.eot_id, len(group),
                          temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
      for i, row in zip(group, new_BN):
        ends = np.flatnonzero(row == tok.eot_id)
        out[i] = tok.decode(row[:ends[0]] if len(ends) else row)
  return out


def _until_eot(state, prompts_BP: np.ndarray, n_new: int, eot_id: int, rows: int,
               **kwargs) -> np.ndarray:
  """The new tokens of the first `rows` rows, made until each has an end-of-text token."""
  parts = []
  for part in decode.stream(state, prompts_BP, n_new, chunk=CHUNK, **kwargs):
    parts.append(part[:rows])
    if (np.concatenate(parts, axis=1) == eot_id).any(axis=1).all():
      break
  return np.concatenate(parts, axis=1)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _target_logprobs(params, graphdef, tokens_BL):
  logits_BTV = nnx.merge(graphdef, params)(tokens_BL[:, :-1]).astype(jnp.float32)
  logp_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
  top_BT = jnp.argmax(logits_BTV, axis=-1) == tokens_BL[:, 1:]
  return jnp.take_along_axis(logp_BTV, tokens_BL[:, 1:, None], axis=-1)[..., 0], top_BT


def score(state, pairs: list[tuple[np.ndarray, np.ndarray]], batch_size: int = 32,
          greedy: list | None = None) -> np.ndarray:
  """Summed log-probability (nats) of each continuation given its context: float64[N]. A pair
  longer than the model's window keeps its last seq_len + 1 tokens (the context's start goes).
  `greedy`: a list that gets, for each pair, whether every continuation token is the likeliest."""
  window = state.model_cfg.seq_len + 1
  seqs = [np.concatenate([c, x])[-window:] for c, x in pairs]
  counts = [min(len(x), window - 1) for _, x in pairs]
  out, tops = np.zeros(len(pairs)), [False] * len(pairs)
  order = np.argsort([len(s) for s in seqs])  # similar lengths share a batch and a compile
  for at in range(0, len(order), batch_size):
    group = order[at:at + batch_size]
    L = min(window, decode._bucket(max(len(seqs[i]) for i in group), 8))
    # Right padding, which a causal model never sees; rows padded to a power of two.
    tokens_BL = np.zeros((decode._bucket(len(group), 1), L), np.int32)
    for row, i in enumerate(group):
      tokens_BL[row, :len(seqs[i])] = seqs[i]
    logp_BT, top_BT = map(np.asarray, _target_logprobs(state.params, state.graphdef,
                                                       jnp.asarray(tokens_BL)))
    for row, i in enumerate(group):
      n = len(seqs[i])
      out[i] = float(logp_BT[row, n - 1 - counts[i]:n - 1].astype(np.float64).sum())
      tops[i] = bool(top_BT[row, n - 1 - counts[i]:n - 1].all())
  if greedy is not None:
    greedy[:] = tops
  return out
