"""An exported model run from its written weights, in numpy (float64), as its target computes it:
the check every export makes before it puts a file in place (`check`), where no transformers is
installed to run the Hugging Face directory, and always for a GGUF file.

Each target's reader (hf.py, gguf_file.py) turns the tensors it wrote back into `Weights` by the
target's own names and layouts, and says in a `Spec` what the target computes with them (its rope
layout, norms and epsilons): a weight mapped wrongly, or a switch the target lacks, shows as a
difference from jaxtrain's own logits.
Shape suffixes: B batch, T time, D d_model, H heads, G key/value heads, K head size, V vocab.
"""

import dataclasses
import math

import numpy as np

from jaxtrain.system.errors import UserError


@dataclasses.dataclass(frozen=True)
class Spec:
  n_layers: int
  n_heads: int
  n_kv_heads: int
  norm: str  # rmsnorm | layernorm
  norm_eps: float
  pos: str  # rope | learned
  mlp: str  # swiglu | gelu | relu2
  rope_theta: float = 10000.0
  rope_pairs: bool = False  # RoPE on consecutive pairs (llama.cpp's llama), else on halves
  qk_norm: bool = False
  qk_eps: float = 1e-6
  x0_mix: bool = False
  canon: int = 0


# Weights: "embed" [V, D], "head" [D, V], "final_norm" [D], "pos" [T, D] where learned; for layer i
# "i/<name>": norm1, norm2 [D] (and "_b" biases), q [D, H*K], k, v [D, G*K] (q_b, k_b, v_b), o
# [D, D] (o_b), up [D, F] (up_b), gate [D, F] (SwiGLU), down [F, D] (down_b), q_norm, k_norm [K],
# conv_attn, conv_mlp [W, D]; "x0_scale" [L]. Kernels [in, out]: y = x @ w.
Weights = dict


def _norm(x, w: dict, name: str, s: Spec):
  if s.norm == "layernorm":
    x = x - x.mean(-1, keepdims=True)
  y = x / np.sqrt((x * x).mean(-1, keepdims=True) + s.norm_eps) * w[name]
  return y + w[name + "_b"] if name + "_b" in w else y


def _rope(x_BTHK, s: Spec):
  T, K = x_BTHK.shape[1], x_BTHK.shape[-1]
  inv = 1.0 / s.rope_theta ** (np.arange(0, K, 2, dtype=np.float64) / K)
  angles = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
  cos, sin = np.cos(angles)[None, :, None, :], np.sin(angles)[None, :, None, :]
  if s.rope_pairs:
    x1, x2 = x_BTHK[..., 0::2], x_BTHK[..., 1::2]
    out = np.empty_like(x_BTHK)
    out[..., 0::2], out[..., 1::2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return out
  x1, x2 = x_BTHK[..., :K // 2], x_BTHK[..., K // 2:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _linear(x, w: dict, name: str):
  y = x @ w[name]
  return y + w[name + "_b"] if name + "_b" in w else y


def _conv(x_BTD, w_WD):
  W, T = w_WD.shape[0], x_BTD.shape[1]
  padded = np.pad(x_BTD, ((0, 0), (W - 1, 0), (0, 0)))
  return x_BTD + sum(padded[:, W - 1 - i:W - 1 - i + T] * w_WD[i] for i in range(W))


def _attention(x_BTD, w: dict, s: Spec):
  B, T, _ = x_BTD.shape
  H, G = s.n_heads, s.n_kv_heads
  q, k, v = (_linear(x_BTD, w, n) for n in ("q", "k", "v"))
  K = q.shape[-1] // H
  q, k, v = q.reshape(B, T, H, K), k.reshape(B, T, G, K), v.reshape(B, T, G, K)
  if s.qk_norm:
    q = q / np.sqrt((q * q).mean(-1, keepdims=True) + s.qk_eps) * w.get("q_norm", 1.0)
    k = k / np.sqrt((k * k).mean(-1, keepdims=True) + s.qk_eps) * w.get("k_norm", 1.0)
  if s.pos == "rope":
    q, k = _rope(q, s), _rope(k, s)
  k, v = np.repeat(k, H // G, axis=2), np.repeat(v, H // G, axis=2)
  scores = np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(K)
  scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  y = np.einsum("bhts,bshk->bthk", p / p.sum(-1, keepdims=True), v)
  return _linear(y.reshape(B, T, H * K), w, "o")


def _mlp(x, w: dict, s: Spec):
  h = _linear(x, w, "up")
  if s.mlp == "swiglu":
    g = _linear(x, w, "gate")
    h = g / (1.0 + np.exp(-g)) * h
  elif s.mlp == "relu2":
    h = np.square(np.maximum(h, 0.0))
  else:  # GELU, tanh form
    h = 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
  return _linear(h, w, "down")


def logits(spec: Spec, weights: Weights, tokens_BT: np.ndarray) -> np.ndarray:
  """float64 [B, T, V] logits of the written model on `tokens_BT` (one document a row)."""
  w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
  T = tokens_BT.shape[1]
  x = w["embed"][tokens_BT]
  if spec.pos == "learned":
    x = x + w["pos"][:T]
  x0 = x
  for i in range(spec.n_layers):
    layer = {k.split("/", 1)[1]: v for k, v in w.items() if k.startswith(f"{i}/")}
    if spec.x0_mix and i > 0:
      x = x + w["x0_scale"][i] * x0
    a = _norm(x, layer, "norm1", spec)
    x = x + _attention(_conv(a, layer["conv_attn"]) if spec.canon else a, layer, spec)
    m = _norm(x, layer, "norm2", spec)
    x = x + _mlp(_conv(m, layer["conv_mlp"]) if spec.canon else m, layer, spec)
  return _norm(x, w, "final_norm", spec) @ w["head"]


def probe(vocab: int, eot_id: int, seq_len: int, rows: int = 2, length: int = 64) -> np.ndarray:
  """The probe batch: `rows` rows of random ids of the tokenizer's vocabulary, end-of-text left
  out (one document a row, as a prompt is), at most the model's context long."""
  ids = np.array([i for i in range(vocab) if i != eot_id], np.int32)
  return np.random.default_rng(0).choice(ids, (rows, min(length, seq_len)))


def compare(theirs: np.ndarray, ours: np.ndarray, what: str, tolerance: float = 1e-3) -> float:
  """The largest |logit difference| of the exported model (`theirs`) from jaxtrain's (`ours`);
  above `tolerance` x the logits' scale, a UserError naming it: the export is refused."""
  diff = np.abs(np.asarray(theirs, np.float64) - np.asarray(ours, np.float64))
  worst = float(diff.max())
  if not np.isfinite(worst) or worst > tolerance * max(1.0, float(np.abs(ours).max())):
    b, t, v = np.unravel_index(int(np.nanargmax(np.where(np.isfinite(diff), diff, np.inf))),
                               diff.shape)
    raise UserError(f"{what} does not compute the trained model: its logits differ from "
                    f"jaxtrain's by up to {worst:.4g} (row {b}, position {t}, token {v}: "
                    f"{float(theirs[b, t, v]):.4f} against {float(ours[b, t, v]):.4f}) on a probe "
                    "batch; nothing was written. This is a bug in the export's mapping: report it")
  return worst
