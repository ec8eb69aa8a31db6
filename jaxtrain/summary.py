"""What a run says about itself before its first step: the data, the model, its compute and
memory."""

import jax
import ml_collections

from jaxtrain import data, estimate, fmt
from jaxtrain import model as model_lib
from jaxtrain.console import Console
from jaxtrain.errors import ConfigError
from jaxtrain.programs import Programs


def vocab_size(want: int, tok) -> int:
  """`model.vocab_size`, where 0 takes the tokenizer's."""
  if want == 0:
    return tok.vocab_size
  if want < tok.vocab_size:
    raise ConfigError("model.vocab_size", f"{want} is smaller than the {tok.name} tokenizer's "
                      f"{tok.vocab_size} tokens", "pass --config.model.vocab_size=0 (automatic)")
  return want


def describe(out: Console, cfg: ml_collections.ConfigDict, corpus: data.Corpus,
             programs: Programs) -> None:
  tok, mc = corpus.tokenizer, programs.model_cfg
  out.print(f"data: {data.describe(cfg.data.path)}: {corpus.n_files} file(s), "
            f"{fmt.count(corpus.n_docs)} documents, {fmt.count(corpus.n_bytes)}B -> "
            f"{fmt.count(len(corpus.tokens))} {tok.name} tokens "
            f"(train {fmt.count(len(corpus.train))}, val {fmt.count(len(corpus.val))})")
  for note in corpus.notes:
    out.print(f"data: {note}")
  k, B, T = cfg.train.grad_accum, cfg.train.batch_size, cfg.model.seq_len
  n_params = sum(x.size for x in jax.tree.leaves(programs.abstract.params))
  out.print(f"model: {fmt.count(n_params)} params, "
            f"{fmt.count(model_lib.flops_per_token(mc))} train FLOPs/token, vocab "
            f"{mc.vocab_size}, {B * k * T} tokens/step ({B} x {T} x {k} micro-batches)")
  out.print(f"compute: {mc.dtype} (params and optimizer float32), attention {mc.attention} "
            f"({programs.attention_why})"
            + (f"; XLA options {programs.compiler_options}" if programs.compiler_options else "")
            + ("; one gradient all-reduce" if programs.one_allreduce else ""))
  line, warning = estimate.memory_report(mc, B, k, list(programs.mesh.devices.flat),
                                         programs.mesh.shape["fsdp"], n_params)
  out.print(line)
  if warning:
    out.print(f"WARNING: {warning}")


def speed_line(speed, flops_dtype: str, steps_left: int) -> str:
  """The first speed reading, with the peak its MFU is measured against."""
  devices = jax.devices()
  peak, source = estimate.peak_flops(devices[0], flops_dtype)
  return (f"speed: {fmt.count(speed.tokens_per_sec)} tokens/s, "
          f"{fmt.count(speed.flops_per_sec)}FLOP/s = {speed.mfu or 0:.1%} MFU (of "
          f"{fmt.count(peak)}FLOP/s x {estimate.peak_units(devices)}, {source}); "
          f"ETA for the remaining {steps_left} steps: {fmt.duration(speed.eta_s)}")


def peak_flops(dtype: str) -> float:
  """The FLOP/s of every device of the run together, for MFU."""
  peak, _ = estimate.peak_flops(jax.devices()[0], dtype)
  return peak * estimate.peak_units(jax.devices())
