"""rlkit.data: tasks (prompt, answer, verifier), JSONL import, tfds builders (array_record), grain pipelines.

Importing the package registers every task in `TASKS` (the `jsonl` task lives in jsonl.py, the ProcessBench
tasks in processbench.py, the worded and worked skills in skills.py, `mixture` in mixture.py). The tfds and
grain modules are imported on demand (`rlkit.data.tfds_builders`, `rlkit.data.pipeline`): they are slower
to import and only the data-loading path needs them.
"""
from rlkit.data import advice, constrained, jsonl, processbench, questions, tasks  # noqa: F401  (registers the tasks)
from rlkit.data import annotated  # noqa: F401  (registers annotated_responses, experiments/drm)
from rlkit.data import mixture, skills  # noqa: F401  (the pretraining corpus of experiments/base)
from rlkit.data.tasks import TASKS, Task, make_task  # noqa: F401
