"""Each source's own validation loss in a weighted mixture (`data.mixture`): val/<source>/loss
and val/<source>/bpb, beside the mixed val_loss, in the same evaluation record."""

import jax
import numpy as np

from jaxtrain.data.mixture import EvalSet


def evaluate(programs, state, sets: list[EvalSet], throttle) -> dict:
  """{"val/<name>/loss": mean loss over the set's batches, "val/<name>/bpb": in bits per byte}.
  `sets` hold batches already placed on the devices; `throttle(results)` bounds the queue."""
  record = {}
  for s in sets:
    losses = []
    for batch in s.batches:
      losses.append(programs.eval_step(state, batch)["loss"])
      throttle(losses)
    loss = float(np.mean(jax.device_get(losses)))
    record[f"val/{s.name}/loss"] = loss
    record[f"val/{s.name}/bpb"] = loss * s.bpb
  return record


def line(step: int, record: dict) -> str:
  """`eval step N by source: books 1.2345 (1.7810 bits/byte) | notes ...`"""
  names = [k.split("/")[1] for k in record if k.startswith("val/") and k.endswith("/loss")]
  parts = [f"{n} {record[f'val/{n}/loss']:.4f} ({record[f'val/{n}/bpb']:.4f} bits/byte)"
           for n in names]
  return f"eval step {step} by source: " + " | ".join(parts)
