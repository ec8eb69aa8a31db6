"""Every knob of a run with its default (`defaults`: `default_config`, `load_config`,
`override`) and the one up-front check of every field (`validate`).

May import: system.
"""

from jaxtrain.config.defaults import default_config, load_config, override

__all__ = ["default_config", "load_config", "override"]
