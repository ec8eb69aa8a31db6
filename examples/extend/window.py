"""A sliding window: each token attends to the last `size` positions only (its own included).

  jaxtrain --config=nano --config.extend=examples/extend/window.py \
      --config.model.attention_variant=window --config.ext.window.size=64
"""

import jaxtrain as jt


@jt.attention("window", size=64)
def window(q, k, v, at, *, size):
  return at(q, k, v, mask=at.distance < size)  # at.distance: query position - key position
