"""configs/diffusion.py's presets for the generative-stage tests, loaded from the file."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def diffusion_config(preset="test"):
  spec = importlib.util.spec_from_file_location("diffusion_config", os.path.join(REPO, "configs", "diffusion.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(preset)
  c.progress = False
  return c
