"""Notebook 02's layer over `embnb.columnwise`: `cases` (runs on real ranks, both paths, traffic recorded),
`experiment` (the notebook's run, its numbers per section), `traffic` (the byte count), `torchrec_layouts`
(what torchrec's planner and source do), `pooled`, `reference` (the page's core, checked), `plots`, `widgets`.
"""
