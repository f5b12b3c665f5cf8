"""Notebook 02's layer over `embnb.columnwise` (import each from its module):

- `traffic`: what each path sends, recorded from `all_to_all_single`'s inputs,
  and `wire_bytes`, the byte count of what each path puts on the wire;
- `traffic_tables`: the byte count per layout as tables and sentences;
- `torchrec_layouts`: the CW layouts torchrec's planner makes, and where in
  torchrec's source an EmbeddingCollection meets uneven widths;
- `cases`: `CWCase`/`TableSpec` and `run_cw_cases`, which runs cases on real
  ranks through both paths next to the unsharded EmbeddingCollection (and
  torchrec with its permute off); `run_torchrec_size_per_rank`;
- `experiment`: the run of one placement and its results;
- `plots` and `widgets`: the figures and the placement explorer.
"""
