"""Every knob of a run with its default, a config as a run gets it, and the one up-front check of
every field; the user's own code that `extend` names, loaded (docs/layout.md says what each module
holds).

May import: system.
"""

from jaxtrain.config.defaults import default_config
from jaxtrain.config.loading import load_config, override

__all__ = ["default_config", "load_config", "override"]
