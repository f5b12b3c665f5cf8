"""Notebook 02's layer over `embnb.columnwise`: `cases` (runs on real ranks, both paths, traffic recorded),
`experiment` (the notebook's run, its numbers per section), `traffic` (the byte count), `torchrec_layouts`
(what torchrec's planner and source do), `pooled`, `reference` (the page's core, checked), `plots`, `widgets`.
"""


def start_rank_server(device: str) -> None:
    """Start the server `embnb.dist` forks CPU ranks from now, in the background, so that it imports torch
    and torchrec (seconds) while the notebook imports them too, not at the first launch. Call it after
    `embnb.lab.logs.quiet_torch_fx` (the server keeps the environment it starts with); not for "cuda"
    (ranks on GPUs are spawned fresh)."""
    import multiprocessing
    import multiprocessing.forkserver

    from embnb.dist import FORKSERVER_PRELOAD

    if device != "cuda" and "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
        multiprocessing.forkserver.ensure_running()
