"""Run in a fresh process: N virtual CPU devices, the same steps on several meshes.

Prints JSON: for each (data, fsdp) mesh, the largest difference of the final state from the
same steps on a single device, how the params ended up sharded, and how many all-reduces the
compiled train step has, and how many cross-device ops the init program has.
"""

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", int(sys.argv[1]) if len(sys.argv) > 1 else 4)

import numpy as np  # noqa: E402

from jaxtrain.core import programs  # noqa: E402
from jaxtrain.testing import random_batch, tiny_config  # noqa: E402


def train(data: int, fsdp: int, devices, n_steps: int = 4):
  cfg = tiny_config(**{"mesh.data": data, "mesh.fsdp": fsdp, "train.batch_size": 8,
                       "model.d_model": 64, "train.grad_accum": 2})
  p = programs.build(cfg, 256, devices)
  state = p.init()
  for i in range(n_steps * cfg.train.grad_accum):
    state, _ = p.train_step(state, p.place(random_batch(cfg, seed=i)))
  specs = sorted({str(x.sharding.spec) for x in jax.tree.leaves(state.params)})
  all_reduces = p.compile_train().as_text().count(" all-reduce(")
  init_hlo = p.lower_init().compile().as_text()
  init_collectives = sum(init_hlo.count(f" {op}(") for op in (
      "all-to-all", "collective-permute", "all-gather", "all-reduce", "reduce-scatter"))
  return jax.device_get(state.arrays()), specs, all_reduces, init_collectives


def main() -> None:
  devices = jax.devices()
  reference, _, _, _ = train(1, 1, devices[:1])
  report = {"devices": len(devices)}
  for data, fsdp in [(len(devices), 1), (1, len(devices)), (2, len(devices) // 2)]:
    arrays, specs, all_reduces, init_collectives = train(data, fsdp, devices)
    diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(arrays)))
    report[f"data={data},fsdp={fsdp}"] = {"max_abs_diff": diff, "param_specs": specs,
                                          "all_reduces": all_reduces,
                                          "init_collectives": init_collectives}
  print(json.dumps(report))


if __name__ == "__main__":
  main()
