"""The ids stored in per-row and per-token label arrays: row sources (`TrainBatch.row_source`) and segment
kinds (`Rollout.segment_ids`). Plain Python (no JAX), so host-side code such as the reward worker process can
read them without importing an array library. `rlkit.core.types` re-exports them.
"""
from __future__ import annotations

from rlkit.core.registry import IdRegistry

# What each response token is (`segment_ids`). A multi-turn rollout interleaves the policy's own text and tool
# calls (sampled: trained) with observations, later user turns and summaries inserted by the environment or the
# collector (attended, never trained); `pad` marks the columns after a row's end. Methods may add kinds
# (`SEGMENT_KINDS.add`), e.g. for per-segment rewards (`RewardOutput.segment_rewards`, [N, S] by kind).
SEGMENT_KINDS = IdRegistry("segment kind", ("pad", "prompt", "policy", "tool_call", "observation", "summary"))

# Where a row of a TrainBatch came from. Augmenters add rows from elsewhere; losses and metrics may treat
# them differently (e.g. no importance ratio for a teacher's demonstration). Methods may add sources.
ROW_SOURCES = IdRegistry("row source", ("policy", "teacher", "peer", "padding"))
ROW_SOURCE = ROW_SOURCES          # ROW_SOURCE["teacher"] -> its id
