"""jaxtrain's model in PyTorch, for Hugging Face transformers: the modeling file an export writes
beside its weights (as modeling_jaxtrain.py) where no transformers class computes the same thing
(QK-norm, ReLU^2, x0-mix, short convolutions, ...). It needs torch and transformers only, so the
export directory loads anywhere:

    AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)

The parameters keep jaxtrain's names and layouts (kernels [in, out]), so the weights are the
checkpoint's as they are. Every switch of jaxtrain's ModelConfig is computed as jaxtrain computes
it, in float32 (or the dtype it is loaded in); dropout is off (inference). Generation recomputes
the whole window at each token (there is no key-value cache: the convolutions would need one of
their own).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

NORM_EPS, QK_EPS = 1e-5, 1e-6


class JaxtrainConfig(PretrainedConfig):
  model_type = "jaxtrain"

  def __init__(self, vocab_size=256, n_layers=2, n_heads=2, d_model=64, seq_len=128,
               norm="rmsnorm", pos="rope", mlp="swiglu", mlp_hidden=256, tie_embeddings=True,
               rope_theta=10000.0, n_kv_heads=0, qk_norm=False, x0_mix=False,
               canon=0, doc_mask=False, eot_id=-1, **kwargs):
    self.vocab_size, self.n_layers, self.n_heads, self.d_model = vocab_size, n_layers, n_heads, d_model
    self.seq_len, self.norm, self.pos, self.mlp, self.mlp_hidden = seq_len, norm, pos, mlp, mlp_hidden
    self.tie_embeddings, self.rope_theta, self.n_kv_heads = tie_embeddings, rope_theta, n_kv_heads
    self.qk_norm, self.x0_mix, self.canon = qk_norm, x0_mix, canon
    self.doc_mask, self.eot_id = doc_mask, eot_id
    # What transformers' generation and pipelines look for under their usual names.
    self.hidden_size, self.num_hidden_layers, self.num_attention_heads = d_model, n_layers, n_heads
    self.max_position_embeddings = seq_len
    kwargs.setdefault("tie_word_embeddings", False)  # a tied head is computed, not tied by name
    kwargs.setdefault("use_cache", False)
    super().__init__(**kwargs)


class Norm(nn.Module):
  """RMSNorm or LayerNorm (no bias), with a learned scale."""

  def __init__(self, d: int, kind: str):
    super().__init__()
    self.kind, self.scale = kind, nn.Parameter(torch.ones(d))

  def forward(self, x):
    if self.kind != "rmsnorm":
      x = x - x.mean(-1, keepdim=True)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.scale


class Dense(nn.Module):
  """x @ kernel, the kernel [in, out] as jaxtrain stores it."""

  def __init__(self, d_in: int, d_out: int):
    super().__init__()
    self.kernel = nn.Parameter(torch.zeros(d_in, d_out))

  def forward(self, x):
    return x @ self.kernel


def rope(x, theta: float, pos):
  """Rotate-half RoPE of x [B, T, H, K] at positions `pos` [B, T]."""
  K = x.shape[-1]
  inv_freq = 1.0 / (theta ** (torch.arange(0, K, 2, dtype=torch.float32) / K))
  angles = pos[..., None].float() * inv_freq.to(x.device)
  # in x's dtype: a model loaded with torch_dtype=bfloat16 stays in it, as transformers' Llama does
  cos, sin = (t[:, :, None, :].to(x.dtype) for t in (angles.cos(), angles.sin()))
  x1, x2 = x[..., :K // 2], x[..., K // 2:]
  return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rms_heads(x):
  return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + QK_EPS)


def causal_conv(x, w, same_doc):
  """x plus its short causal depthwise convolution: position t adds w[i] * x[t - i] (within its
  document where `same_doc` [B, T, T] is given)."""
  K, T = w.shape[0], x.shape[1]
  padded = F.pad(x, (0, 0, K - 1, 0))
  y = x
  for i in range(K):
    shifted = padded[:, K - 1 - i:K - 1 - i + T]
    if same_doc is not None and i > 0:
      same = F.pad(torch.diagonal(same_doc, -i, 1, 2), (i, 0))
      shifted = torch.where(same[..., None], shifted, torch.zeros_like(shifted))
    y = y + shifted * w[i]
  return y


class Attention(nn.Module):

  def __init__(self, c: JaxtrainConfig):
    super().__init__()
    self.c = c
    self.H, self.G, self.K = c.n_heads, c.n_kv_heads or c.n_heads, c.d_model // c.n_heads
    self.qkv = Dense(c.d_model, (self.H + 2 * self.G) * self.K)
    self.out = Dense(c.d_model, c.d_model)

  def forward(self, x, allowed, pos):
    B, T, _ = x.shape
    H, G, K = self.H, self.G, self.K
    q, k, v = self.qkv(x).split([H * K, G * K, G * K], dim=-1)
    q, k, v = q.reshape(B, T, H, K), k.reshape(B, T, G, K), v.reshape(B, T, G, K)
    if self.c.qk_norm:
      q, k = rms_heads(q), rms_heads(k)
    if self.c.pos == "rope":
      q, k = rope(q, self.c.rope_theta, pos), rope(k, self.c.rope_theta, pos)
    k, v = k.repeat_interleave(H // G, dim=2), v.repeat_interleave(H // G, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, K]
    scores = (q * K**-0.5) @ k.transpose(-1, -2)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return self.out(y.transpose(1, 2).reshape(B, T, H * K))


class MLP(nn.Module):

  def __init__(self, c: JaxtrainConfig):
    super().__init__()
    self.kind = c.mlp
    self.up = Dense(c.d_model, 2 * c.mlp_hidden if c.mlp == "swiglu" else c.mlp_hidden)
    self.down = Dense(c.mlp_hidden, c.d_model)

  def forward(self, x):
    h = self.up(x)
    if self.kind == "swiglu":
      gate, up = h.chunk(2, dim=-1)
      h = F.silu(gate) * up
    elif self.kind == "relu2":
      h = F.relu(h).square()
    else:
      h = F.gelu(h, approximate="tanh")
    return self.down(h)


class Block(nn.Module):

  def __init__(self, c: JaxtrainConfig):
    super().__init__()
    self.norm1, self.attn = Norm(c.d_model, c.norm), Attention(c)
    self.norm2, self.mlp = Norm(c.d_model, c.norm), MLP(c)
    self.canon = c.canon
    if c.canon:
      self.conv_attn = nn.Parameter(torch.zeros(c.canon, c.d_model))
      self.conv_mlp = nn.Parameter(torch.zeros(c.canon, c.d_model))

  def forward(self, x, allowed, same_doc, pos, real):
    a = self.norm1(x)
    if self.canon:  # padding is the zeros before a sequence's start, as jaxtrain's window has
      a = causal_conv(torch.where(real[..., None], a, 0.0), self.conv_attn, same_doc)
    x = x + self.attn(a, allowed, pos)
    m = self.norm2(x)
    if self.canon:
      m = causal_conv(torch.where(real[..., None], m, 0.0), self.conv_mlp, same_doc)
    return x + self.mlp(m)


class JaxtrainForCausalLM(PreTrainedModel, GenerationMixin):
  config_class = JaxtrainConfig
  base_model_prefix = "jaxtrain"
  _no_split_modules = ["Block"]

  def __init__(self, config: JaxtrainConfig):
    super().__init__(config)
    c = config
    self.wte = nn.Module()
    self.wte.embedding = nn.Parameter(torch.zeros(c.vocab_size, c.d_model))
    if c.pos == "learned":
      self.wpe = nn.Parameter(torch.zeros(c.seq_len, c.d_model))
    self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layers)])
    if c.x0_mix:
      self.x0_scale = nn.Parameter(torch.zeros(c.n_layers))
    self.norm_f = Norm(c.d_model, c.norm)
    if not c.tie_embeddings:
      self.lm_head = Dense(c.d_model, c.vocab_size)
    self.post_init()

  @classmethod
  def _supports_default_dynamic_cache(cls) -> bool:
    return False  # no key-value cache: each step runs the whole window

  def _init_weights(self, module):
    pass  # every weight comes from the export

  def get_input_embeddings(self):
    return None

  def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
    return {"input_ids": input_ids, "attention_mask": attention_mask}

  def forward(self, input_ids=None, labels=None, attention_mask=None, **kwargs):
    c = self.config
    T = input_ids.shape[1]
    # Padding (attention_mask 0: a batch of prompts of several lengths) is seen by no token, and
    # each row's own tokens sit at positions 0.. as the prompt alone would.
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else \
        attention_mask.bool()
    pos = (real.long().cumsum(1) - 1).clamp(min=0)
    if c.pos == "learned" and int(pos.max()) >= c.seq_len:
      raise ValueError(f"{int(pos.max()) + 1} tokens, and this model's learned positions end at "
                       f"{c.seq_len}")
    x = self.wte.embedding[input_ids]
    if c.pos == "learned":
      x = x + self.wpe[pos]
    eye = torch.eye(T, dtype=torch.bool, device=x.device)  # a padding's own row stays finite
    allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()[None] & real[:, None, :] | eye
    same_doc = None
    if c.doc_mask:  # a document's end-of-text token is its last; attention stays inside it
      eot = (input_ids == c.eot_id).long()
      doc = eot.cumsum(1) - eot
      same_doc = doc[:, :, None] == doc[:, None, :]
      allowed = allowed & same_doc
    x0 = x
    for i, block in enumerate(self.blocks):
      if c.x0_mix and i > 0:
        x = x + self.x0_scale[i] * x0
      x = block(x, allowed, same_doc, pos, real)
    x = self.norm_f(x)
    logits = x @ (self.wte.embedding.T if c.tie_embeddings else self.lm_head.kernel)
    loss = None
    if labels is not None:  # transformers' convention: labels are the inputs, shifted here
      loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                             labels[:, 1:].reshape(-1), ignore_index=-100)
    return CausalLMOutput(loss=loss, logits=logits)

