"""rlkit.parallel: the ("data", "fsdp", "tensor") mesh, multi-host start-up, partition rules, sharding."""
from rlkit.parallel.mesh import (AXES, BATCH_AXES, detect_cluster, make_mesh, maybe_initialize_distributed,
                                 mesh_axis_size, mesh_from_config, set_cpu_devices)
from rlkit.parallel.rules import (DEFAULT_RULES, REPLICATE_REST, constrain_batch, data_sharding,
                                  param_shardings, partition_specs, path_str, shard_batch, shard_params,
                                  sharded_init)
