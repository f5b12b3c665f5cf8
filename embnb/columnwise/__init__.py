"""Technique 2: column-wise sharding of sequence embeddings and its permute indices.

Layers, each importable alone, from the maths up:

- `placement`: pure torch maths of a placement: arrival (rank) order,
  `cw_permute_indices`, shard widths and their checks, stitching;
- `lookup`: embnb's own CW lookup over a process group (any shard widths);
- `torchrec_adapter`: torchrec's ShardedEmbeddingCollection: compute kernel,
  what torchrec's column_wise() can take, plans, the sharded module;
- `traffic`: what each path sends, recorded from `all_to_all_single`'s inputs;
- `cases`: `CWCase`/`TableSpec` and `run_cw_cases`, which runs cases on real
  ranks through both paths next to the unsharded EmbeddingCollection (and
  torchrec with its permute off); `run_torchrec_size_per_rank`;
- `experiment`: notebook 02's run of one placement and its results dict;
- `plots` and `widgets`: notebook 02's figures and its placement explorer.
"""

from embnb.columnwise import cases, experiment, lookup, placement, plots, torchrec_adapter, traffic, widgets
from embnb.columnwise.cases import (
    PATHS,
    CWCase,
    CWRun,
    RankOutputs,
    TableSpec,
    TorchrecOutcome,
    make_batches,
    make_embedding_collection,
    reference_cw_forward,
    run_case_on_rank,
    run_cw_cases,
    run_torchrec_size_per_rank,
    to_kjt,
    unsharded_outputs,
)
from embnb.columnwise.experiment import (
    PlacementExperiment,
    permute_derivation,
    run_placement_experiment,
    shard_table,
    torchrec_version,
)
from embnb.columnwise.lookup import cw_sequence_lookup, local_shards
from embnb.columnwise.placement import (
    check_permute_answer,
    check_shard_ranks,
    check_widths,
    column_offsets,
    concat_in_rank_order,
    cw_permute_indices,
    equal_widths,
    rank_order,
    rank_ordered_shard_outputs,
    stitch_cw,
)
from embnb.columnwise.plots import column_order_figure, lookup_error_figure, traffic_figure
from embnb.columnwise.torchrec_adapter import (
    COMPUTE_KERNELS,
    TORCHREC_CW_ALIGNMENT,
    check_torchrec_placements,
    compute_kernel_for,
    cw_sharding_plan,
    fbgemm_cuda_problem,
    shard_cw,
    torchrec_num_shards,
    torchrec_permute_indices,
)
from embnb.columnwise.traffic import Traffic, recorded_all_to_all
from embnb.columnwise.widgets import PlacementExplorer, parse_ints

# Each layer lists its public names; the package offers them all.
__all__ = [
    *placement.__all__,
    *lookup.__all__,
    *torchrec_adapter.__all__,
    *cases.__all__,
    *traffic.__all__,
    *experiment.__all__,
    *plots.__all__,
    *widgets.__all__,
]
