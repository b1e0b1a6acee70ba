"""configs/embodied.py's presets for the embodied tests, loaded from the file and validated."""
import importlib.util
import os

from rlkit.train.config_checks import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def embodied_config(preset="test", **bc):
  """configs/embodied.py's preset with `bc` fields replaced (validated)."""
  spec = importlib.util.spec_from_file_location("embodied_config", os.path.join(REPO, "configs", "embodied.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(preset)
  c.bc.update(bc)
  validate(c)
  return c
