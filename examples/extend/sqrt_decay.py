"""A new schedule: after the warmup, the learning rate falls as 1 - sqrt(progress), fast at first
and gently at the end (the "1-sqrt" cooldown of Hägele et al., 2024), instead of a straight line.

  jaxtrain --config=nano --config.extend=examples/extend/sqrt_decay.py \
      --config.optim.schedule=sqrt_decay
"""

import jax.numpy as jnp

import jaxtrain as jt


@jt.schedule("sqrt_decay")
def sqrt_decay(progress, peak, o):
  return peak * (1 - jnp.sqrt(progress))  # progress: 0 at the warmup's end, 1 at the run's
