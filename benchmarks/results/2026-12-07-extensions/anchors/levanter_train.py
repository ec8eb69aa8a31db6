# levanter reads its config with draccus when its entry point starts: a user's registration must be
# imported first, so a user's components come with an entry point of their own (one for all three).
import levanter
import levanter_lion  # noqa: F401
import levanter_sqrt_decay  # noqa: F401
import levanter_window  # noqa: F401
from levanter.main import train_lm

if __name__ == "__main__":
    levanter.config.main(train_lm.main)()
