"""Every host-side agent module that registers something, imported so the registries are complete: the
calculator tools and task reward (tools.py, tool_task.py), the key-and-door testbed (keydoor.py), and the code
task with its sandboxed reward (code_task.py, code_reward.py). rlkit.train.multi_turn imports it, and
rlkit.train.rl_config imports that, so config validation sees them."""
from rlkit.agents import code_reward, code_task, keydoor, tool_task, tools  # noqa: F401
