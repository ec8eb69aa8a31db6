# optax's Lion as a user's own levanter optimizer (levanter 9263f81e; written to its API, not run
# here). levanter has a LionConfig built in (optimizer type "lion"); this is what one takes that is
# not: a config registered by name whose build() returns the optax chain.
import dataclasses

import optax
from levanter.optim.config import OptimizerConfig


@OptimizerConfig.register_subclass("my_lion")
@dataclasses.dataclass(frozen=True)
class MyLionConfig(OptimizerConfig):
    beta1: float = 0.9
    beta2: float = 0.99
    max_grad_norm: float | None = 1.0

    def build(self, num_train_steps):
        def _optimizer(learning_rate):
            return optax.chain(
                optax.clip_by_global_norm(self.max_grad_norm) if self.max_grad_norm else optax.identity(),
                optax.scale_by_lion(self.beta1, self.beta2),
                optax.add_decayed_weights(self.weight_decay, self.build_weight_decay_mask()),
                optax.scale(-learning_rate))

        return optax.inject_hyperparams(_optimizer)(learning_rate=self.lr_scheduler(num_train_steps))
