"""Linear decay to zero after the warmup (instead of cosine to optim.min_lr_ratio).

  jaxtrain --config=nano --config.extend=examples/extend/linear.py --config.optim.schedule=linear
"""

import jaxtrain as jt


@jt.schedule("linear")
def linear(progress, peak, o):
  return peak * (1 - progress)  # progress: 0 at the warmup's end, 1 at the run's
