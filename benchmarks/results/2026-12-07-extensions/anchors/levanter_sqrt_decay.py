# A 1 - sqrt decay as a user's own levanter schedule (levanter 9263f81e; written to its API, not run
# here): an LrSchedule registered by name, built from the schedule's context.
import dataclasses

import jax.numpy as jnp
from levanter.optim.config import LrSchedule, LrScheduleContext


@LrSchedule.register_subclass("sqrt_decay")
@dataclasses.dataclass(frozen=True)
class SqrtDecay(LrSchedule):
    def build(self, ctx: LrScheduleContext):
        return lambda step: ctx.min_lr + (ctx.learning_rate - ctx.min_lr) * (
            1 - jnp.sqrt(jnp.clip(step / ctx.decay_steps, 0, 1)))
