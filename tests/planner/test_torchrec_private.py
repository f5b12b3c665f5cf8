"""embnb._torchrec_private on the installed torchrec (1.8.0 under `make test`,
1.6.1 under `make test STACK=min`): every private name it uses still exists
with the parameters it passes, and no other module of embnb or its tests
reaches into those names itself."""

import copy
import inspect
import io
import re
import tokenize
from pathlib import Path

import pytest
import torch
import torchrec
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator.estimator import EmbeddingPerfEstimator
from torchrec.distributed.planner.estimator.types import HardwarePerfConfig
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, ShardingOption
from torchrec.distributed.types import BoundsCheckMode, CacheParams, KeyValueParams
from torchrec.modules.embedding_configs import DataType

from embnb import _torchrec_private as private
from embnb import planner

ROOT = Path(__file__).resolve().parents[2]


def test_embnbs_enumerator_finds_every_piece_it_needs_on_this_torchrec():
    assert torchrec.__version__ in ("1.6.1", "1.8.0", "1.9.2")  # the stacks CI runs
    assert private.enumerator_missing() == []
    taken = set(inspect.signature(ShardingOption.__init__).parameters) - {"self"}
    assert taken <= set(private.OPTION_FIELDS)
    major, minor = map(int, torchrec.__version__.split(".")[:2])
    assert private.STASH_WEIGHTS == ((major, minor) >= (1, 9))


def test_a_piece_this_torchrec_lacks_is_named():
    needs = {
        (EmbeddingEnumerator, "_gone_from_torchrec"): ("self",),
        (EmbeddingEnumerator, "_get_num_buckets"): ("self", "table", "module"),
    }
    assert private.enumerator_missing(needs) == [
        "EmbeddingEnumerator._gone_from_torchrec (gone)",
        "EmbeddingEnumerator._get_num_buckets('self', 'table', 'module') "
        "(it takes ('self', 'parameter', 'module'))",
    ]


@pytest.mark.parametrize("where", list(private.PRIVATE_FUNCTIONS), ids=lambda w: w[1])
def test_each_private_function_takes_the_parameters_passed(where):
    owner, name = where
    parameters = list(inspect.signature(getattr(owner, name)).parameters.values())
    used = private.PRIVATE_FUNCTIONS[where]
    assert tuple(p.name for p in parameters[: len(used)]) == used
    assert all(p.default is not inspect.Parameter.empty for p in parameters[len(used) :])


def _built() -> dict[type, object]:
    topology = planner.make_topology(2, "cuda", hbm_cap_gb=1)
    return {
        EmbeddingEnumerator: EmbeddingEnumerator(topology=topology, batch_size=8),
        EmbeddingPerfEstimator: EmbeddingPerfEstimator(topology=topology),
        HardwarePerfConfig: HardwarePerfConfig(),
        EmbeddingShardingPlanner: EmbeddingShardingPlanner(topology=topology),
    }


def test_each_private_attribute_is_set_when_its_object_is_built():
    built = _built()
    missing = [
        (kind.__name__, name)
        for kind, names in private.PRIVATE_ATTRIBUTES.items()
        for name in names
        if (not hasattr(built[kind], name) if kind in built else not _assigned(kind, name))
    ]
    assert missing == []


def _assigned(kind: type, name: str) -> bool:
    """Whether torchrec's source of `kind` or a base assigns `self.<name>`
    (sharded modules and their input distributions need a process group to build)."""
    pattern = re.compile(rf"self\.{name}\s*(:[^=]*?)?=[^=]")  # an annotation may span lines
    return any(
        pattern.search(inspect.getsource(base))
        for base in kind.__mro__
        if base.__module__.startswith("torchrec.")
    )


def test_the_sharder_data_gate_follows_the_version():
    major, minor = map(int, torchrec.__version__.split(".")[:2])
    assert private.SHARDER_DATA == ((major, minor) >= (1, 7))
    enumerator = _built()[EmbeddingEnumerator]
    by_name = private.set_sharders(enumerator, [EmbeddingBagCollectionSharder()])
    assert list(by_name) == ["torchrec.modules.embedding_modules.EmbeddingBagCollection"]
    assert enumerator.sharder_map is by_name  # torchrec's public view of what was set
    handed = private.estimator_sharders(enumerator)
    assert (handed is by_name) != private.SHARDER_DATA and set(handed) == set(by_name)


def test_param_constraints_names_each_field_as_torchrec_reads_it():
    cache = CacheParams(load_factor=0.25)
    key_value = KeyValueParams(ssd_storage_directory="/tmp/kv")
    constraints = {
        "t": ParameterConstraints(
            pooling_factors=[3.0, 5.0],
            min_partition=16,
            cache_params=cache,
            enforce_hbm=True,
            stochastic_rounding=False,
            bounds_check_mode=BoundsCheckMode.WARNING,
            feature_names=["f1", "f2"],
            output_dtype=DataType.FP16,
            device_group="cuda",
            key_value_params=key_value,
        )
    }
    got = private.param_constraints(constraints, "t")
    assert got.input_lengths == [3.0, 5.0] and got.col_wise_shard_dim == 16
    assert got.cache_params == cache and got.cache_params is not cache  # torchrec copies it
    assert (got.enforce_hbm, got.stochastic_rounding) == (True, False)
    assert got.bounds_check_mode is BoundsCheckMode.WARNING and got.feature_names == ["f1", "f2"]
    assert got.output_dtype is DataType.FP16 and got.device_group == "cuda"
    assert got.key_value_params == key_value
    unconstrained = private.param_constraints(constraints, "other")
    assert unconstrained.col_wise_shard_dim is None and unconstrained.device_group is None


def test_the_attributes_torchrecs_option_copy_shares_are_the_module_and_tensor():
    tensor, module = torch.empty(4, 2), torch.nn.Linear(1, 1)
    option = ShardingOption(
        name="t",
        tensor=tensor,
        module=("m", module),
        input_lengths=[1.0],
        batch_size=8,
        sharding_type="table_wise",
        partition_by="device",
        compute_kernel="fused",
        shards=[],
    )
    copied = copy.deepcopy(option)
    for name in private.OPTION_SHARED_ATTRIBUTES:
        assert getattr(copied, name) is getattr(option, name)
    assert copied.tensor is tensor and copied.module[1] is module


def _private_names() -> set[str]:
    functions = {name for _, name in private.PRIVATE_FUNCTIONS}
    return functions | {name for names in private.PRIVATE_ATTRIBUTES.values() for name in names}


def _reaches(path: Path, names: set[str], on_self: bool) -> list[str]:
    """The private names in `names` that code in `path` reads as `x.name`
    (`self.name` too where `on_self`); docstrings and comments do not count."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)]
    return [
        name.string
        for owner, dot, name in zip(tokens, tokens[1:], tokens[2:])
        if dot.string == "." and name.string in names and (on_self or owner.string != "self")
    ]


def test_no_other_module_reaches_into_torchrecs_private_names():
    """`x._name` for a name the module wraps, outside it. `self._name` counts
    only in modules that subclass torchrec's enumerator or estimator."""
    names = _private_names()
    subclassing = {ROOT / "embnb/planner/enumerator.py", ROOT / "embnb/planner/estimates.py"}
    hits = []
    for path in sorted([*(ROOT / "embnb").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        if path.name not in ("_torchrec_private.py", Path(__file__).name):
            hits += [
                f"{path.relative_to(ROOT)}: {name}" for name in _reaches(path, names, path in subclassing)
            ]
    assert hits == []
