"""The PyTorch side of jax_vs_torch.py as nanoGPT itself (karpathy/nanoGPT), not our reference.

nanoGPT's own model.py is imported from its checkout (`--nanogpt_dir`), by file path; nothing of
it is copied here. Its `GPT(GPTConfig(...))` is built at the benchmark's shape (bias=False,
dropout=0), its AdamW comes from its own `configure_optimizers` (device_type="cpu": no fused
AdamW), and each timed step is train.py's on a CPU (float32, no autocast, no GradScaler): forward
`logits, loss = model(X, Y)`, `loss.backward()`, `clip_grad_norm_(model.parameters(), 1.0)`,
`optimizer.step()`, `optimizer.zero_grad(set_to_none=True)`. As train.py does, the learning rate is
set on every param group before each step; the schedule is jaxtrain's (as on the reference side).

jaxtrain's initial parameters are copied in first (`load_jaxtrain_params`): every parameter of
nanoGPT's model must get one, and every one of jaxtrain's must be used, else setup fails. The
models differ in one op: nanoGPT's GELU is exact (erf), jaxtrain's tanh-approximate, so the same
parameters give close, not equal, losses.

Nothing here imports torch at module level: the parent process only describes the checkout.
"""

import contextlib
import hashlib
import importlib.util
import io
import subprocess
import sys
import time
from pathlib import Path

import common
import numpy as np

GRAD_CLIP = 1.0  # train.py's grad_clip
# How close the first losses from the same parameters must be (jax_vs_torch.py asks 1e-4 of the
# reference): nanoGPT's exact-erf GELU and jaxtrain's tanh approximation differ by up to ~5e-4
# per activation, far less at the small activations of an initial model (at the small shape the
# logits differ by ~6e-5 and the float32 losses not at all).
LOSS_TOLERANCE = 1e-3
MODULE_NAME = "nanogpt_model"  # what nanoGPT's model.py is imported as (not "model")


def model_file(nanogpt_dir: str) -> Path:
  return Path(nanogpt_dir).expanduser().resolve() / "model.py"


def _git(cwd: Path, *args: str) -> str | None:
  try:
    out = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                         timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def check_args(torch: str, nanogpt_dir: str | None, no_torch: bool) -> str | None:
  """What is wrong with jax_vs_torch.py's --torch, --nanogpt_dir and --no-torch, if anything."""
  if torch != "nanogpt":
    return "--nanogpt_dir needs --torch=nanogpt" if nanogpt_dir else None
  if no_torch:
    return "--torch=nanogpt and --no-torch contradict each other"
  if not nanogpt_dir:
    return "--torch=nanogpt needs --nanogpt_dir=PATH (a nanoGPT checkout)"
  if not model_file(nanogpt_dir).is_file():
    return f"--nanogpt_dir={nanogpt_dir}: no model.py there (not a nanoGPT checkout)"
  return None


def describe(nanogpt_dir: str) -> dict:
  """Which nanoGPT ran: its directory, git commit (where it is a git checkout) and model.py hash."""
  path = model_file(nanogpt_dir)
  root = path.parent
  commit = _git(root, "rev-parse", "HEAD") if (root / ".git").exists() else None
  modified = bool(_git(root, "status", "--porcelain", "--", "model.py")) if commit else None
  text = f"nanoGPT itself at {root}" + (f", git commit {commit}" if commit else ", not a git checkout")
  if modified:
    text += " (model.py modified since that commit)"
  return {"name": "nanogpt", "description": text, "dir": str(root), "git_commit": commit,
          "model_py_modified": modified,
          "model_py_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def import_model(nanogpt_dir: str):
  """nanoGPT's model.py as a module, loaded from its file."""
  path = model_file(nanogpt_dir)
  spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[MODULE_NAME] = module  # its @dataclass looks itself up there
  spec.loader.exec_module(module)
  return module


def _flatten(tree, prefix: str = "") -> dict[str, np.ndarray]:
  """jaxtrain's param dict (nested dicts, blocks keyed by int) as {"blocks/0/attn/qkv/kernel": a}."""
  if not isinstance(tree, dict):
    return {prefix: np.array(tree, np.float32)}  # a writable copy, for torch.from_numpy
  out = {}
  for k, v in tree.items():
    out.update(_flatten(v, f"{prefix}/{k}" if prefix else str(k)))
  return out


def param_map(n_layers: int) -> dict[str, tuple[str, bool]]:
  """nanoGPT parameter name -> (jaxtrain parameter path, transpose?).

  flax kernels are [in, out], torch Linear weights [out, in]: transposed. jaxtrain's qkv kernel's
  output columns are [q | k | v], each head-major (it splits at H*K and 2*H*K, then reshapes to
  [H, K]); nanoGPT's c_attn splits its output at n_embd and 2*n_embd and views each as
  [n_head, hs]: the same packing, so the kernel maps as a whole. lm_head is tied to wte.
  """
  m = {"transformer.wte.weight": ("wte/embedding", False),
       "lm_head.weight": ("wte/embedding", False),
       "transformer.wpe.weight": ("wpe", False),
       "transformer.ln_f.weight": ("norm_f/scale", False)}
  for i in range(n_layers):
    h, b = f"transformer.h.{i}", f"blocks/{i}"
    m.update({f"{h}.ln_1.weight": (f"{b}/norm1/scale", False),
              f"{h}.ln_2.weight": (f"{b}/norm2/scale", False),
              f"{h}.attn.c_attn.weight": (f"{b}/attn/qkv/kernel", True),
              f"{h}.attn.c_proj.weight": (f"{b}/attn/out/kernel", True),
              f"{h}.mlp.c_fc.weight": (f"{b}/mlp/up/kernel", True),
              f"{h}.mlp.c_proj.weight": (f"{b}/mlp/down/kernel", True)})
  return m


def load_jaxtrain_params(model, params: dict, n_layers: int) -> dict[str, str]:
  """Copies jaxtrain's params into nanoGPT's `model`; returns what went where. Raises if any
  parameter of either side is left out, or a shape differs."""
  import torch

  src = _flatten(params)
  mapping = param_map(n_layers)
  named = dict(model.named_parameters(remove_duplicate=False))
  if model.lm_head.weight is not model.transformer.wte.weight:
    raise RuntimeError("nanoGPT's lm_head is not tied to wte; jaxtrain's embeddings are tied")
  unmapped = sorted(set(named) - set(mapping))
  missing = sorted({path for path, _ in mapping.values()} - set(src))
  unused = sorted(set(src) - {path for path, _ in mapping.values()})
  if unmapped or missing or unused:
    raise RuntimeError(f"cannot map the parameters: nanoGPT's without a jaxtrain source "
                       f"{unmapped}, jaxtrain's expected but absent {missing}, jaxtrain's unused "
                       f"{unused}")
  with torch.no_grad():
    for name, p in named.items():
      path, transpose = mapping[name]
      value = torch.from_numpy(src[path].T.copy() if transpose else src[path])
      if tuple(p.shape) != tuple(value.shape):
        raise RuntimeError(f"{name} {tuple(p.shape)} != jaxtrain {path} {tuple(value.shape)}"
                           + (" transposed" if transpose else ""))
      p.copy_(value)
  return {name: path + (" (transposed)" if t else "") for name, (path, t) in mapping.items()}


class NanoGPTSide:
  """nanoGPT's GPT and train.py's CPU step in eager mode, torch.set_num_threads(threads)."""

  def __init__(self, threads: int, nanogpt_dir: str, seed: int):
    common.pin_cores(threads)
    import torch

    torch.set_num_threads(threads)
    self.nano = import_model(nanogpt_dir)
    self.seed = seed  # the torch seed and the token batches, as on the reference side

  def peak(self, n: int, repeats: int) -> dict:
    return common.torch_matmul_peak("float32", n, repeats)

  def setup(self, shape: common.Shape, hyper: common.Hyper, jax_params: dict) -> dict:
    import torch

    torch.manual_seed(self.seed)
    said = io.StringIO()  # nanoGPT prints its parameter counts and optimizer groups
    with contextlib.redirect_stdout(said):
      self.model = self.nano.GPT(self.nano.GPTConfig(
          n_layer=shape.n_layers, n_head=shape.n_heads, n_embd=shape.d_model,
          block_size=shape.seq_len, vocab_size=shape.vocab_size, dropout=0.0, bias=False))
    self.hyper = hyper
    # train.py's get_batch: X and Y, contiguous int64 [B, T], Y shifted by one.
    self.batches = [(torch.from_numpy(b[:, :-1].copy()).long(),
                     torch.from_numpy(b[:, 1:].copy()).long())
                    for b in common.token_batches(shape, self.seed)]
    self.i = 0
    with torch.no_grad():
      own_init_loss = self.model(*self.batches[0])[1].item()
      mapped = load_jaxtrain_params(self.model, jax_params, shape.n_layers)
      init_loss = self.model(*self.batches[0])[1].item()
    with contextlib.redirect_stdout(said):
      self.opt = self.model.configure_optimizers(hyper.weight_decay, hyper.lr,
                                                 (hyper.b1, hyper.b2), device_type="cpu")
    return {"param_count": sum(p.numel() for p in self.model.parameters()),  # tied: once
            "own_init_loss": own_init_loss, "init_loss": init_loss,
            "num_threads": torch.get_num_threads(), "params_mapped": mapped,
            "nanogpt_printed": said.getvalue().splitlines()}

  def run(self, n: int) -> dict:
    import torch
    import torch_reference as ref

    times = []
    for _ in range(n):
      X, Y = self.batches[self.i % len(self.batches)]
      t0 = time.perf_counter()
      for group in self.opt.param_groups:  # train.py: lr = get_lr(iter_num), set on every group
        group["lr"] = ref.lr_at(self.i, self.hyper)
      _, loss = self.model(X, Y)
      loss.backward()
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
      self.opt.step()
      self.opt.zero_grad(set_to_none=True)
      times.append(time.perf_counter() - t0)
      self.i += 1
    return {"times_s": times, "loss": loss.item()}

