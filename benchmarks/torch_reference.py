"""A PyTorch reference of jaxtrain's GPT-2 layout, and its AdamW train step, in plain eager mode.

Same model as `jaxtrain.core.model.GPT` with norm="layernorm", pos="learned", mlp="gelu",
tie_embeddings=True, dropout=0: pre-norm blocks, LayerNorm without bias, causal attention,
tanh-approximate GELU MLP (4x), learned positions, tied input/output embedding, no biases,
float32. Same optimizer as `jaxtrain.core.optim`: AdamW with decay on matrices only, global-norm
clipping, linear warmup then cosine decay.
Shape suffixes: B batch, T time, D d_model, H heads, K head size, F MLP width, V vocab.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F
from common import Hyper, Shape
from torch import nn


class Block(nn.Module):

  def __init__(self, s: Shape):
    super().__init__()
    D = s.d_model
    self.n_heads = s.n_heads
    self.norm1 = nn.LayerNorm(D, eps=1e-5, bias=False)
    self.qkv = nn.Linear(D, 3 * D, bias=False)
    self.out = nn.Linear(D, D, bias=False)
    self.norm2 = nn.LayerNorm(D, eps=1e-5, bias=False)
    self.up = nn.Linear(D, 4 * D, bias=False)
    self.down = nn.Linear(4 * D, D, bias=False)

  def attention(self, x_BTD: torch.Tensor) -> torch.Tensor:
    B, T, D = x_BTD.shape
    H = self.n_heads
    # qkv's output columns are [q | k | v], each head-major, as jaxtrain's reshape(B, T, 3, H, K).
    q_BHTK, k_BHTK, v_BHTK = self.qkv(x_BTD).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
    y_BHTK = F.scaled_dot_product_attention(q_BHTK, k_BHTK, v_BHTK, is_causal=True)
    return self.out(y_BHTK.transpose(1, 2).reshape(B, T, D))

  def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
    x_BTD = x_BTD + self.attention(self.norm1(x_BTD))
    h_BTF = F.gelu(self.up(self.norm2(x_BTD)), approximate="tanh")
    return x_BTD + self.down(h_BTF)


class GPT(nn.Module):

  def __init__(self, s: Shape):
    super().__init__()
    self.wte = nn.Embedding(s.vocab_size, s.d_model)
    self.wpe = nn.Parameter(torch.empty(s.seq_len, s.d_model))
    self.blocks = nn.ModuleList([Block(s) for _ in range(s.n_layers)])
    self.norm_f = nn.LayerNorm(s.d_model, eps=1e-5, bias=False)
    self.reset_parameters(s.n_layers)

  def reset_parameters(self, n_layers: int) -> None:
    out_std = 0.02 / math.sqrt(2 * n_layers)  # two residual branches per layer add up
    nn.init.normal_(self.wte.weight, std=0.02)
    nn.init.normal_(self.wpe, std=0.01)  # jaxtrain initializes position embeddings at 0.01
    for block in self.blocks:
      nn.init.normal_(block.qkv.weight, std=0.02)
      nn.init.normal_(block.up.weight, std=0.02)
      nn.init.normal_(block.out.weight, std=out_std)
      nn.init.normal_(block.down.weight, std=out_std)

  def forward(self, tokens_BT: torch.Tensor) -> torch.Tensor:
    T = tokens_BT.shape[1]
    x_BTD = self.wte(tokens_BT) + self.wpe[:T]
    for block in self.blocks:
      x_BTD = block(x_BTD)
    return F.linear(self.norm_f(x_BTD), self.wte.weight)  # tied output projection


def loss_fn(model: GPT, tokens_BT1: torch.Tensor) -> torch.Tensor:
  logits_BTV = model(tokens_BT1[:, :-1])
  return F.cross_entropy(logits_BTV.flatten(0, 1), tokens_BT1[:, 1:].flatten())


def lr_at(step: int, h: Hyper) -> float:
  """jaxtrain's schedule: linear warmup (step 0 already moves), then cosine to lr*min_lr_ratio."""
  if step < h.warmup_steps:
    return h.lr * (step + 1) / (h.warmup_steps + 1)
  decay_end = max(h.decay_steps or h.max_steps, h.warmup_steps + 1)
  progress = min(max((step - h.warmup_steps) / (decay_end - h.warmup_steps), 0.0), 1.0)
  end = h.lr * h.min_lr_ratio
  return end + 0.5 * (h.lr - end) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: GPT, h: Hyper) -> torch.optim.AdamW:
  # Decay on matrices only (embeddings and kernels); norm scales are vectors and stay undecayed.
  params = list(model.parameters())
  groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": h.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
  return torch.optim.AdamW(groups, lr=lr_at(0, h), betas=(h.b1, h.b2), eps=h.eps)


def train_step(model: GPT, opt: torch.optim.AdamW, tokens_BT1: torch.Tensor, step: int,
               h: Hyper) -> torch.Tensor:
  """One optimizer step on one batch; returns the loss (before the update)."""
  for group in opt.param_groups:
    group["lr"] = lr_at(step, h)
  loss = loss_fn(model, tokens_BT1)
  opt.zero_grad(set_to_none=True)
  loss.backward()
  if h.clip_norm > 0:
    nn.utils.clip_grad_norm_(model.parameters(), h.clip_norm)
  opt.step()
  return loss.detach()


def load_jaxtrain_params(model: GPT, params: dict) -> None:
  """Copies a jaxtrain param dict (`TrainState.params`, as numpy) into `model`.

  flax kernels are (in, out); torch Linear weights are (out, in).
  """
  def put(dst: torch.Tensor, src: np.ndarray, transpose: bool = False) -> None:
    src_t = torch.from_numpy(np.asarray(src, np.float32))
    src_t = src_t.T if transpose else src_t
    assert dst.shape == src_t.shape, f"{tuple(dst.shape)} != {tuple(src_t.shape)}"
    dst.copy_(src_t)

  with torch.no_grad():
    put(model.wte.weight, params["wte"]["embedding"])
    put(model.wpe, params["wpe"])
    put(model.norm_f.weight, params["norm_f"]["scale"])
    for i, block in enumerate(model.blocks):
      p = params["blocks"][i]
      put(block.norm1.weight, p["norm1"]["scale"])
      put(block.norm2.weight, p["norm2"]["scale"])
      put(block.qkv.weight, p["attn"]["qkv"]["kernel"], transpose=True)
      put(block.out.weight, p["attn"]["out"]["kernel"], transpose=True)
      put(block.up.weight, p["mlp"]["up"]["kernel"], transpose=True)
      put(block.down.weight, p["mlp"]["down"]["kernel"], transpose=True)


def param_count(model: GPT) -> int:
  return sum(p.numel() for p in model.parameters())  # the tied embedding is one Parameter
