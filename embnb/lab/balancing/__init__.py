"""Notebook 04's layer over `embnb.balancing` (import each from its module):
`reference` (the KK the page shows), `comparison` (the balancers over many
batches), `experiment` (the real runs and the results JSON), `measured`,
`cost_fit` and `memory_cap` (the step measured rank by rank, why it can pass
the FLOP bound, the activation-bytes cap), `gpu_runs` (the committed GPU
runs), `plots` and `widgets`.
"""
