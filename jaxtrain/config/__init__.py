"""Every knob of a run with its default (`defaults`: `default_config`, the field list; locked, so
a name it lacks fails where it is written), a config as a run gets it (`loading`: `load_config`,
`override`, a saved run's config, dotted names, which changes a resume may cross), the field names
as a schema (`schema`: unknown names, nearest real names, a config file's load error in one line),
the one up-front check of every field (`validate`) and the comma-separated list fields' parsers
(`lists`: `mixture_sources`, `eval_task_files`, `lora_targets`).

May import: system.
"""

from jaxtrain.config.defaults import default_config
from jaxtrain.config.loading import load_config, override

__all__ = ["default_config", "load_config", "override"]
