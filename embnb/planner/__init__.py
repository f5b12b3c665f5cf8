"""Technique 3: a dynamic-programming sharding proposer inside torchrec's planner."""

from embnb.planner.core import *  # noqa: F401,F403
from embnb.planner.core import __all__  # noqa: F401
