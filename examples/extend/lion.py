"""optax's Lion: the sign of an interpolated momentum, decoupled weight decay on matrices only.
Lion's steps are larger than AdamW's: a learning rate 3-10x smaller is its usual start.

  jaxtrain --config=nano --config.extend=examples/extend/lion.py --config.optim.name=lion \
      --config.optim.lr=1e-3
"""

import optax

import jaxtrain as jt


@jt.optimizer("lion", b1=0.9, b2=0.99)
def lion(lr, o, *, b1, b2):
  return optax.lion(lr, b1=b1, b2=b2, weight_decay=o.weight_decay, mask=jt.decay_mask)
