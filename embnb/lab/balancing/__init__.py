"""Notebook 04's layer over `embnb.balancing` (import each from its module):

- `reference`: Karmarkar-Karp for equal-count parts in plain Python, the
  version the notebook shows and the tests check `partition` against;
- `comparison`: the balancers over many batches, as tables and results;
- `experiment`: the notebook's runs (training, gathers, exchanges) and its
  results JSON; `overlap`: what overlapping the shuffle cost the step;
- `measured`, `cost_fit`, `link`: the step measured rank by rank, the
  per-rank cost fit beside the FLOP model, the link model's measured latency;
- `plots` and `widgets`: the figures and the balance explorer.
"""
