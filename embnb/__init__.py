"""embnb: sharded embedding techniques, run for real on torchrec."""

import logging as _logging

__version__ = "0.1.0"

# torchrec calls torch.fx's is_fx_tracing, which logs a deprecation once per
# process (notebook kernel and every rank alike): in a notebook it shows as a
# red box that says nothing about the run. Importing embnb quiets that logger.
_logging.getLogger("torch.fx._symbolic_trace").setLevel(_logging.ERROR)
