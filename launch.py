"""rlkit entry point: `python launch.py --config=configs/x.py[:preset] [--config.a.b=value ...] --workdir=DIR`.

The same as the `rlkit` command of the installed package; everything is in `rlkit/cli.py` (`--help` says
where the keys and presets are documented).
"""
from absl import app

from rlkit.cli import main, parse_flags

if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
