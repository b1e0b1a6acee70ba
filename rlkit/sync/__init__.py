"""rlkit.sync: trainer -> sampler weight transfer (dense, sparse delta) across meshes, shardings and dtypes.

See `rlkit.sync.backends` for the protocol (prepare / receive / commit, resync) and `methods/systems.md` §2.
"""
from rlkit.sync.backends import (SYNC_BACKENDS, DenseLeaf, Payload, SyncBackend, SyncConfig, SyncState,
                                 UnchangedLeaf, commit, export_of, export_params, placed_by_arguments, prepare,
                                 receive, resync, sync_config, sync_defaults, sync_params)
from rlkit.sync.codec import GapCode, checksum, coded_index_bytes, gap_decode, gap_encode
from rlkit.sync.sparse_delta import SparseLeaf
