"""Every knob of a run with its default (`defaults`: `default_config`, `load_config`,
`override`; locked, so a name it lacks fails where it is written), the field names as a schema
(`schema`: unknown names, nearest real names, a config file's load error in one line) and the one
up-front check of every field (`validate`).

May import: system.
"""

from jaxtrain.config.defaults import default_config, load_config, override

__all__ = ["default_config", "load_config", "override"]
