"""embnb.dist.launch on real gloo process groups."""

import ast
import logging
import os
import subprocess
import sys
import threading
import time

import pytest
import ranks
import torch

from embnb import collectives
from embnb import dist as edist


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its table entry is left


def _spawned_children() -> list[int]:
    """Live rank processes of this process: spawned by it (GPU ranks) or
    forked for it by its fork server (CPU ranks)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver._forkserver_pid
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        spawned = ppid == os.getpid() and b"spawn_main" in cmdline
        if (spawned or (server is not None and ppid == server)) and _alive(int(entry)):
            pids.append(int(entry))
    return pids


def test_results_come_back_in_rank_order():
    results = edist.launch(ranks.identity, 3, {"x": [1, 2]})
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world_size"] == 3 and r["payload"] == {"x": [1, 2]} for r in results)
    assert len({r["pid"] for r in results}) == 3 and os.getpid() not in {r["pid"] for r in results}
    assert not _spawned_children()


def test_tensors_come_back_by_value():
    results = edist.launch(ranks.tensor_result, 2)
    for rank, tensor in enumerate(results):
        assert torch.equal(tensor, torch.arange(rank * 3, rank * 3 + 3))


def _expected_collectives(rank, world_size):
    received = [100 * src + rank for src in range(world_size) for _ in range(rank + 1)]
    return {
        "rank": rank,
        "world_size": world_size,
        "backend": "gloo",
        "device": "cpu",
        "all_reduce": float(sum(range(1, world_size + 1))),
        "all_to_all": received,
    }


def test_all_reduce_and_uneven_all_to_all_on_four_gloo_ranks():
    results = edist.launch(edist.check_collectives, 4, backend="gloo")
    assert results == [_expected_collectives(r, 4) for r in range(4)]


def test_exception_in_rank_2_surfaces_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(edist.RankError) as info:
        edist.launch(ranks.fail_on_rank, 4, 2, timeout_s=120)
    assert info.value.rank == 2
    message = str(info.value)
    assert "rank 2" in message and "Traceback" in message
    assert "deliberate failure on rank 2" in message and "fail_on_rank" in message
    # The healthy ranks were blocked in a barrier: they were stopped, not waited for.
    assert time.monotonic() - start < 60
    assert not _spawned_children()


def test_rank_that_dies_without_a_result_is_named():
    with pytest.raises(edist.RankError, match="exited with code 7") as info:
        edist.launch(ranks.exit_on_rank, 3, 1, timeout_s=120)
    assert info.value.rank == 1
    assert not _spawned_children()


def test_hung_rank_is_killed_within_timeout_and_leaves_nothing(tmp_path):
    timeout_s = 10  # long enough for three ranks to start and write their pids
    start = time.monotonic()
    with pytest.raises(edist.LaunchTimeout, match=r"ranks \[0, 1, 2\] did not finish within timeout_s=10"):
        edist.launch(ranks.hang_on_rank, 3, 1, str(tmp_path), timeout_s=timeout_s)
    assert time.monotonic() - start < timeout_s + 15
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 4  # three ranks and the hung rank's own child
    time.sleep(0.5)
    assert [pid for pid in pids if _alive(pid)] == []
    assert not _spawned_children()


def test_parallel_launches_do_not_collide():
    results, errors = {}, []

    def run(tag):
        try:
            results[tag] = edist.launch(edist.check_collectives, 2, backend="gloo")
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results[0] == results[1] == [_expected_collectives(r, 2) for r in range(2)]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"world_size": 0}, ValueError, "world_size must be an int >= 1, got 0"),
        ({"world_size": 2.0}, TypeError, "got float 2.0"),
        ({"world_size": True}, TypeError, "got bool True"),
        (
            {"world_size": 2, "backend": "mpi"},
            ValueError,
            "backend 'mpi' is not one of 'auto', 'gloo', 'nccl'",
        ),
        ({"world_size": 2, "timeout_s": 0}, ValueError, "timeout_s must be a finite number > 0, got 0"),
        ({"world_size": 2, "device": "gpu"}, ValueError, "device 'gpu' is not one of 'auto', 'cpu', 'cuda'"),
        (
            {"world_size": 2, "device": "cpu", "backend": "gloo"},
            ValueError,
            "give device or backend, not both",
        ),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        edist.launch(ranks.identity, *([kwargs.pop("world_size")]), None, **kwargs)


def test_unimportable_function_is_refused_before_spawning():
    with pytest.raises(ValueError, match="cannot be sent to spawned ranks"):
        edist.launch(lambda rank, world_size: rank, 2)


@pytest.mark.skipif(torch.cuda.device_count() >= 64, reason="needs fewer GPUs than ranks")
def test_nccl_without_enough_gpus_is_refused():
    with pytest.raises(ValueError, match="world_size=64, GPUs visible="):
        edist.launch(ranks.identity, 64, None, backend="nccl")


def test_same_rank_function_runs_under_torchrun():
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "embnb.dist",
        "embnb.dist:check_collectives",
        "--backend",
        "gloo",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = [ast.literal_eval(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert printed == [_expected_collectives(r, 2) for r in range(2)]


END_PROCESS_SCRIPT = """
import atexit, sys
import torch.distributed as dist
from embnb.dist import end_process

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
group = dist.new_group(backend="gloo")  # held by Python to the end, as a shuffle's group
original = dist.destroy_process_group
dist.destroy_process_group = lambda *a: (print("destroyed"), original(*a))
atexit.register(print, "interpreter teardown")
print("unflushed", end=" ")
sys.stderr.write("to stderr ")
end_process(int(sys.argv[2]), destroy=sys.argv[3] == "1")
print("after end_process")
"""


@pytest.mark.parametrize("code, destroy", [(0, True), (3, True), (5, False)])
def test_end_process_destroys_the_groups_flushes_and_skips_the_teardown(tmp_path, code, destroy):
    script = tmp_path / "job.py"
    script.write_text(END_PROCESS_SCRIPT)
    args = [str(tmp_path / "store"), str(code), "1" if destroy else "0"]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr[-3000:]
    assert done.stdout.split() == ["unflushed", *(["destroyed"] if destroy else [])]
    assert done.stderr.startswith("to stderr"), done.stderr[-3000:]


def test_cli_spawns_when_not_under_torchrun():
    cmd = [sys.executable, "-m", "embnb.dist", "embnb.dist:check_collectives", "--world-size", "3"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = [ast.literal_eval(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert printed == [_expected_collectives(r, 3) for r in range(3)]


def test_resolve_device_follows_the_gpus_there_are():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert edist.resolve_device("cpu", 4) == "cpu"
    assert edist.resolve_device("auto", 4) == ("cuda" if gpus else "cpu")
    if not gpus:
        with pytest.raises(ValueError, match="device 'cuda' needs a GPU, but none is visible"):
            edist.resolve_device("cuda", 1)
    with pytest.raises(ValueError, match="device 'gpu' is not one of"):
        edist.resolve_device("gpu", 1)


# (device, world_size, gpus) -> (device, backend, shares_gpus, rank devices)
DEVICE_RULE = [
    (("cpu", 4, 0), ("cpu", "gloo", False, ["cpu"] * 4)),
    (("cpu", 4, 8), ("cpu", "gloo", False, ["cpu"] * 4)),
    (("auto", 4, 0), ("cpu", "gloo", False, ["cpu"] * 4)),
    (("auto", 2, 2), ("cuda", "nccl", False, ["cuda:0", "cuda:1"])),
    (("cuda", 2, 8), ("cuda", "nccl", False, ["cuda:0", "cuda:1"])),
    (("auto", 4, 1), ("cuda", "gloo", True, ["cuda:0"] * 4)),
    (("cuda", 3, 2), ("cuda", "gloo", True, ["cuda:0", "cuda:1", "cuda:0"])),
    (("cuda", 1, 1), ("cuda", "nccl", False, ["cuda:0"])),
]


@pytest.mark.parametrize("asked, expected", DEVICE_RULE, ids=lambda x: str(x))
def test_device_rule_decides_what_runs_where(asked, expected):
    device, world_size, gpus = asked
    plan = edist.device_plan(device, world_size, gpus=gpus)
    ranks = [str(plan.rank_device(r)) for r in range(world_size)]
    assert (plan.device, plan.backend, plan.shares_gpus, ranks) == expected
    assert (plan.world_size, plan.gpus) == (world_size, gpus)
    if plan.shares_gpus:  # the run says so
        assert f"{world_size} ranks share {gpus} GPU(s)" in plan.describe()
        assert "gloo" in plan.describe()


def test_device_rule_refuses_cuda_without_a_gpu_and_bad_values():
    with pytest.raises(ValueError, match="device 'cuda' needs a GPU, but none is visible"):
        edist.device_plan("cuda", 2, gpus=0)
    with pytest.raises(TypeError, match="gpus must be an int >= 0, got bool True"):
        edist.device_plan("cuda", 2, gpus=True)
    with pytest.raises(TypeError, match="world_size must be an int >= 1, got bool True"):
        edist.device_plan("cpu", True)


def assert_collective_helpers(results, devices):
    """What plain Python says all_reduce_, all_gather_flat and exchange give
    on len(results) ranks, each result on its rank's device."""
    world_size = len(results)
    for rank, got in enumerate(results):
        assert got["total"] == [sum(r + 1.0 for r in range(world_size))]
        assert got["gathered"] == [x for r in range(world_size) for x in (r, 10 * r)]
        assert got["received"] == [[src, rank] for src in range(world_size) for _ in range(rank + 1)]
        assert got["devices"] == [devices[rank]] * 3


def test_staged_collectives_give_what_plain_python_says():
    (results,) = edist.launch_each([(ranks.collective_helpers, ())], 3, device="cpu")
    assert_collective_helpers(results, ["cpu"] * 3)


@pytest.mark.cuda
def test_nccl_with_one_rank_runs_its_collectives_on_the_gpu():
    (result,) = edist.launch(edist.check_collectives, 1, backend="nccl")
    assert (result["backend"], result["device"]) == ("nccl", "cuda:0")
    assert result["all_reduce"] == 1.0 and result["all_to_all"] == [0.0]


@pytest.mark.cuda
def test_collective_helpers_on_cuda_tensors_under_nccl():
    world_size = torch.cuda.device_count()  # one rank per GPU
    (results,) = edist.launch_each([(ranks.collective_helpers, ())], world_size, device="cuda")
    assert {r["backend"] for r in results} == {"nccl"}
    assert_collective_helpers(results, [f"cuda:{r}" for r in range(world_size)])


@pytest.mark.cuda
def test_ranks_sharing_a_gpu_compute_on_it_and_stage_collectives_through_host_memory():
    gpus = torch.cuda.device_count()
    world_size = gpus + 1  # more ranks than GPUs: nccl would refuse, so gloo
    devices, results = edist.launch_each(
        [(ranks.rank_devices, ()), (ranks.collective_helpers, ())], world_size, device="cuda"
    )
    want = [f"cuda:{r % gpus}" for r in range(world_size)]
    assert devices == [{"rank_device": d, "collective_device": "cpu"} for d in want]
    assert {r["backend"] for r in results} == {"gloo"}
    assert_collective_helpers(results, want)


def test_launched_ranks_know_their_device():
    (on_cpu,) = edist.launch_each([(ranks.rank_devices, ())], 2, device="cpu")
    assert on_cpu == [{"rank_device": "cpu", "collective_device": "cpu"}] * 2


def test_launch_each_runs_several_experiments_in_one_launch():
    calls = [(ranks.identity, ("a",)), (edist.check_collectives, ()), (ranks.identity, ("b",))]
    first, collectives, last = edist.launch_each(calls, 3, device="cpu")
    assert [r["payload"] for r in first] == ["a"] * 3 and [r["payload"] for r in last] == ["b"] * 3
    # One launch: each rank ran every call in the same process.
    assert [r["pid"] for r in first] == [r["pid"] for r in last]
    assert len({r["pid"] for r in first}) == 3
    assert collectives == [_expected_collectives(r, 3) for r in range(3)]


def test_launch_each_refuses_an_unimportable_call_before_spawning():
    with pytest.raises(ValueError, match="cannot be sent to spawned ranks"):
        edist.launch_each([(ranks.identity, (1,)), (lambda rank, world_size: rank, ())], 2)


def test_the_flat_all_gather_uses_the_name_this_torch_prefers():
    import torch.distributed as dist

    expected = dist.all_gather_single if hasattr(dist, "all_gather_single") else dist.all_gather_into_tensor
    assert collectives._all_gather_into is expected
    (gathered,) = edist.launch_each([(ranks.collective_helpers, ())], 2, device="cpu")
    assert gathered[1]["gathered"] == [0, 0, 1, 10]


class _OnRetry(logging.Handler):
    """Runs `action` when `launch` says it is launching again."""

    def __init__(self, action):
        super().__init__()
        self.action, self.retries = action, []

    def emit(self, record):
        if "launching again" in record.getMessage():
            self.retries.append(record.getMessage())
            self.action()


def _on_retry(monkeypatch, action) -> _OnRetry:
    handler = _OnRetry(action)
    logger = logging.getLogger("embnb.dist")
    logger.addHandler(handler)
    # No earlier test's logging state may hide the warnings counted here: a disabled logger, or a
    # cached "not enabled" from a quieter root (setting `level` alone keeps that cache).
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "level", logging.WARNING)
    logger.setLevel(logging.WARNING)  # clears the loggers' cached levels
    return handler


def test_a_failed_rendezvous_is_tried_again_and_a_lasting_one_is_named(monkeypatch):
    # gloo cannot open its device on an interface that does not exist: every rank
    # fails in init_process_group, before fn runs (as a full-mesh connect under load does)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "embnb_none0")
    handler = _on_retry(monkeypatch, lambda: None)
    try:
        with pytest.raises(edist.RankError, match=r"in the ranks' rendezvous \(before fn ran\)"):
            edist.launch(ranks.identity, 2, None)
        assert len(handler.retries) == edist.RENDEZVOUS_TRIES - 1, handler.retries
        assert not _spawned_children()
        # the same failure once: the second launch finds the interface gone and runs fn
        handler = _on_retry(monkeypatch, lambda: monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False))
        results = edist.launch(ranks.identity, 2, {"x": 1})
        # (a rendezvous that fails under load on its own may add a retry)
        assert [r["rank"] for r in results] == [0, 1] and len(handler.retries) >= 1
    finally:
        for h in list(logging.getLogger("embnb.dist").handlers):
            if isinstance(h, _OnRetry):
                logging.getLogger("embnb.dist").removeHandler(h)


def test_an_error_in_fn_is_not_tried_again(monkeypatch):
    handler = _on_retry(monkeypatch, lambda: None)
    try:
        with pytest.raises(edist.RankError, match="deliberate failure on rank 1") as raised:
            edist.launch(ranks.fail_on_rank, 2, 1)
        assert "rendezvous" not in str(raised.value) and handler.retries == []
    finally:
        logging.getLogger("embnb.dist").removeHandler(handler)


def test_a_started_rank_server_gives_the_ranks_torchrec_already_imported():
    # a fresh process that never imports torchrec: only the server started here can have imported it
    code = (
        "import sys; from embnb.dist import launch, start_rank_server\n"
        "start_rank_server('cpu'); start_rank_server('cpu')  # the second finds it running\n"
        "import ranks; print(launch(ranks.torchrec_loaded, 2), 'torchrec' in sys.modules)"
    )
    paths = [os.path.dirname(ranks.__file__), os.environ.get("PYTHONPATH", "")]  # the kit's packages too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths).rstrip(os.pathsep)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[True,", "True]", "False"], out.stdout
    with pytest.raises(ValueError, match="device 'tpu' is not one of"):
        edist.start_rank_server("tpu")


def test_device_cache_bytes_is_the_cores_l2_lscpu_names():
    from embnb.devices import device_cache_bytes

    listed = subprocess.run(["lscpu", "-B", "-C=LEVEL,ONE-SIZE,TYPE"], capture_output=True, text=True)
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    level2 = [int(size) for level, size, *_ in rows if level == "2"]
    if listed.returncode or not level2:
        pytest.skip(f"lscpu lists no L2 cache here: {listed.stderr.strip()!r}")
    assert device_cache_bytes("cpu") == level2[0]
    if not torch.cuda.is_available():
        assert device_cache_bytes("cuda") is None
    with pytest.raises(ValueError, match="device 'tpu' is not one of 'cpu', 'cuda'"):
        device_cache_bytes("tpu")
