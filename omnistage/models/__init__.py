"""Model families: one package per family (`omnistage/models/<family>/`).

A family's `__init__.py` builds its `PipelineSpec`s and calls
`omnistage.config.register_pipeline` for each name a checkpoint of the family carries
(model_type, architecture or diffusers class name). The registry imports every package
here on its first lookup, so adding a family is adding a folder. Keep `__init__.py`
cheap to import (no torch or diffusers at module level): `omnistage config show` and
every resolution import all families.
"""
