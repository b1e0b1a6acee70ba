"""`launch.py` in the test process: the same flag parser and `main` (rlkit/cli.py), without a new Python
process (whose imports cost seconds per command). For commands that stop before training: config errors and
`--validate_only`. A command that raises anything but SystemExit fails the calling test with its traceback."""
import contextlib
import io
import sys

from absl import flags


def launch_in_process(*args: str) -> tuple[int, str, str]:
  """(exit code, stdout, stderr) of `python launch.py *args`."""
  from rlkit import cli
  argv = ["launch.py", *args]
  out, err = io.StringIO(), io.StringIO()
  saved, sys.argv = sys.argv, argv        # main reads the command line (the task-rename rule, the config path)
  code = 0
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      cli.main(cli.parse_flags(argv))
  except SystemExit as stop:
    code = stop.code if isinstance(stop.code, int) else 1
  finally:
    sys.argv = saved
    flags.FLAGS.unparse_flags()
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:   # each parse defines its override flags
      delattr(flags.FLAGS, name)
  return code, out.getvalue(), err.getvalue()
