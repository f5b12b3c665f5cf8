"""Run one function on several ranks, each with a real process group (`launch`, `launch_each`);
under torchrun (or any caller that already initialized a process group) the same per-rank functions
run in the calling process and their results are all-gathered. `end_process()` ends a rank's process
without the interpreter's teardown, which can abort a job that used gloo (its docstring says why).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from embnb._checks import check_int, check_number
from embnb.devices import BACKENDS, DevicePlan, device_plan, pick_backend, resolve_device, visible_gpus

__all__ = [
    "launch",
    "launch_each",
    "end_process",
    "run_each",
    "start_rank_server",
    "RankError",
    "LaunchTimeout",
    "DevicePlan",
    "device_plan",
    "pick_backend",
    "resolve_device",
    "rank_device",
    "collective_device",
    "check_collectives",
]


class RankError(RuntimeError):
    """A rank raised or died; `rank` says which, the message carries its traceback."""

    def __init__(self, rank: int, detail: str):
        super().__init__(f"rank {rank} failed:\n{detail}")
        self.rank = rank
        self.detail = detail


class LaunchTimeout(TimeoutError):
    """Some ranks did not finish within the timeout; all ranks were killed."""


_log = logging.getLogger(__name__)
_RANK_DEVICE_ENV = "EMBNB_RANK_DEVICE"  # set by `launch` in each rank


def rank_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device a rank computes on: what `launch` chose for it (its own
    GPU, a shared GPU, or the CPU); elsewhere (torchrun) its GPU under nccl,
    else the CPU."""
    if os.environ.get(_RANK_DEVICE_ENV):
        return torch.device(os.environ[_RANK_DEVICE_ENV])
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a tensor must be for the group's collectives: the rank's GPU
    under nccl, host memory under gloo (also when the rank computes on a
    shared GPU: gloo's CUDA support does not cover every collective)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "auto",
    device: str | None = None,
    timeout_s: float = 300.0,
) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` ranks; results in rank order.

    `device` ("auto", "cpu", "cuda") picks the backend by `device_plan`;
    otherwise `backend` ("auto", "gloo", "nccl") does.

    `fn` and `args` must be picklable and `fn` importable (a module-level
    function, not one defined in a notebook cell): spawned processes import it.
    Return values are pickled by value; CUDA tensors come back on the CPU.
    Raises `RankError` naming a rank that raised or died, `LaunchTimeout` past
    `timeout_s`; every spawned process is gone when `launch` returns or raises.
    """
    if dist.is_available() and dist.is_initialized():
        return _run_in_existing_group(fn, world_size, args)
    check_int("world_size", world_size, low=1)
    check_number("timeout_s", timeout_s, low=0, low_open=True)
    if device is not None:
        if backend != "auto":
            raise ValueError(f"give device or backend, not both (device={device!r}, backend={backend!r})")
        plan = device_plan(device, world_size)
    else:  # a backend names the device: nccl ranks on their own GPU, gloo ranks on the CPU
        backend = pick_backend(backend, world_size)
        plan = DevicePlan("cuda" if backend == "nccl" else "cpu", backend, world_size, visible_gpus())
    _check_importable(fn)

    deadline = time.monotonic() + timeout_s
    for attempt in range(1, RENDEZVOUS_TRIES + 1):
        try:
            return _launch_once(fn, args, plan, world_size, timeout_s, deadline)
        except _RendezvousFailed as failed:
            if attempt == RENDEZVOUS_TRIES:
                raise RankError(failed.rank, failed.detail) from None
            _log.warning(
                "launch: the ranks' rendezvous failed (try %d of %d); launching again",
                attempt,
                RENDEZVOUS_TRIES,
            )


# Under heavy load gloo's full-mesh connect can fail ("Connection closed by
# peer") before any rank has run fn; such a launch is tried again, at most
# this many times in all, within the same timeout.
RENDEZVOUS_TRIES = 3


class _RendezvousFailed(Exception):
    def __init__(self, rank: int, detail: str):
        super().__init__(detail)
        self.rank, self.detail = rank, detail


def _launch_once(fn, args, plan: DevicePlan, world_size: int, timeout_s: float, deadline: float) -> list[Any]:
    # The parent hosts the rendezvous store on a port the OS picks (port 0),
    # so concurrent launches never race for a port.
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    ctx = _rank_context(plan)
    results_queue = ctx.Queue()
    threads = max(1, (os.cpu_count() or 1) // world_size)
    environ = dict(os.environ)  # this launch's, also where the ranks fork from an older server
    setup = _RankSetup(world_size, plan, store.port, timeout_s, threads, os.getpid(), environ, fn, args)
    procs = [
        ctx.Process(
            target=_rank_main, args=(rank, setup, results_queue), name=f"embnb-rank{rank}", daemon=True
        )
        for rank in range(world_size)
    ]
    try:
        for proc in procs:
            proc.start()
        return _collect(procs, results_queue, world_size, timeout_s, deadline)
    finally:
        _kill_all(procs)
        results_queue.close()
        results_queue.join_thread()
        del store


def run_each(rank: int, world_size: int, calls: Sequence[tuple[Callable[..., Any], tuple]]) -> list[Any]:
    """Per rank: `[fn(rank, world_size, *args) for fn, args in calls]`."""
    return [fn(rank, world_size, *args) for fn, args in calls]


def launch_each(
    calls: Sequence[tuple[Callable[..., Any], tuple]], world_size: int, **launch_options: Any
) -> list[list[Any]]:
    """Several experiments in one launch (spawning ranks costs seconds).

    `calls` is `[(fn, args), ...]`; each runs as `fn(rank, world_size,
    *args)` on every rank, one after another, in the same process group.
    Returns `results[i][rank]` for call i. `launch_options` go to `launch`.
    """
    calls = [(fn, tuple(args)) for fn, args in calls]
    for fn, _ in calls:
        _check_importable(fn)
    per_rank = launch(run_each, world_size, calls, **launch_options)
    return [[per_rank[rank][i] for rank in range(len(per_rank))] for i in range(len(calls))]


def _run_in_existing_group(fn: Callable[..., Any], world_size: int | None, args: tuple) -> list[Any]:
    rank, size = dist.get_rank(), dist.get_world_size()
    if world_size is not None and world_size != size:
        raise ValueError(f"world_size={world_size} but the existing process group has {size} ranks")
    result = _to_cpu(fn(rank, size, *args))
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, result)
    return gathered


def _check_importable(fn: Callable[..., Any]) -> None:
    module = getattr(fn, "__module__", None)
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if module == "__main__" and main_file is None:
        raise ValueError(
            f"fn {getattr(fn, '__qualname__', fn)!r} is defined in an interactive session "
            "(notebook or REPL); spawned ranks cannot import it. Define it in a module "
            "(e.g. embnb/ or a .py file next to the notebook) and import it."
        )
    try:
        pickle.dumps(fn)
    except Exception as exc:  # lambdas, closures, bound methods of unpicklable objects
        raise ValueError(
            f"fn {fn!r} cannot be sent to spawned ranks ({exc}); use a module-level function"
        ) from exc


# CPU ranks fork from a server process that imported torch (and torchrec,
# where the launcher has it) once: a launch then starts in a fraction of a
# second, not seconds of imports per rank. Only modules the launcher already
# imported are preloaded, so the server prints nothing the launcher did not.
# Ranks on GPUs are spawned fresh: CUDA cannot run in a process forked from
# one where it was initialised, and an import may initialise it.
GROUP_TIMEOUT_MARGIN_S = 60
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "embnb.dist", "torchrec"]


def start_rank_server(device: str = "auto") -> None:
    """Start the server that CPU ranks fork from now, in the background: it
    imports torch and torchrec (seconds) while the caller does its own work,
    rather than at the first `launch`. Nothing to do where ranks run on GPUs
    (they are spawned fresh) or where a server runs already. The server keeps
    the environment it starts with: set logging first."""
    import multiprocessing.forkserver

    if resolve_device(device) == "cuda" or "forkserver" not in mp.get_all_start_methods():
        return
    mp.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    multiprocessing.forkserver.ensure_running()


def _rank_context(plan: DevicePlan) -> Any:
    if plan.device == "cuda" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # read when the server starts, at the first launch
    ctx.set_forkserver_preload([name for name in FORKSERVER_PRELOAD if name in sys.modules])
    return ctx


@dataclass(frozen=True)
class _RankSetup:
    """What every rank of one launch gets: the group, its rendezvous port and
    deadline, its threads, the launching process (a rank exits with it), the
    launch's environment, and the function with its arguments."""

    world_size: int
    plan: DevicePlan
    port: int
    timeout_s: float
    threads: int
    launcher: int
    environ: dict[str, str]
    fn: Callable[..., Any]
    args: tuple


def _rank_main(rank: int, setup: _RankSetup, results_queue) -> None:
    world_size, plan, port = setup.world_size, setup.plan, setup.port
    # Own process group, so killing it also takes any processes this rank started.
    os.setpgrp()
    _exit_with_parent(setup.launcher)
    os.environ.clear()
    os.environ.update(setup.environ)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    device = plan.rank_device(rank)
    os.environ[_RANK_DEVICE_ENV] = str(device)
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if plan.backend == "gloo":
            torch.set_num_threads(setup.threads)  # ranks share the cores
        # The ranks' own timeouts outlast the launch's: its deadline, not a
        # collective's timeout in a healthy rank, ends a launch that hangs.
        backstop = timedelta(seconds=setup.timeout_s + GROUP_TIMEOUT_MARGIN_S)
        store = dist.TCPStore("127.0.0.1", port, world_size, False, backstop)
        dist.init_process_group(plan.backend, store=store, rank=rank, world_size=world_size, timeout=backstop)
    except BaseException:
        payload = ("error", rank, _RENDEZVOUS + traceback.format_exc())
    else:
        try:
            payload = ("ok", rank, pickle.dumps(_to_cpu(setup.fn(rank, world_size, *setup.args))))
        except BaseException:
            payload = ("error", rank, traceback.format_exc())
    results_queue.put(payload)
    results_queue.close()
    results_queue.join_thread()  # flush before exiting, so the parent gets it
    # A rank whose peers failed skips destroying the groups: it could block in a
    # collective's or the store's teardown, and the parent has the result already.
    end_process(0, destroy=payload[0] == "ok")


def end_process(code: int = 0, destroy: bool = True) -> NoReturn:
    """End this process with exit status `code`: destroy the process groups (with
    `destroy`, where one is initialized), flush stdout and stderr, and exit without
    the interpreter's teardown. Call it last: files the caller left open are not
    flushed.

    Why not a plain return: a gloo group's worker threads release a finished
    collective's tensors after Python's `wait()` has returned, and they stay alive
    after `destroy_process_group` while Python still holds the group (a model, a
    shuffle). A release that needs the GIL while the interpreter shuts down kills
    the thread inside C++ and aborts the process ("terminate called without an
    active exception", SIGABRT; pytorch#190489, open). The README's 2-rank job
    died so after its last step in 4 of 39 runs on a loaded 2-core machine.
    """
    if destroy and dist.is_initialized():
        dist.destroy_process_group()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or replaced stream
            stream.flush()
    os._exit(code)


def _exit_with_parent(launcher: int) -> None:
    # A killed launcher (a restarted notebook kernel) must not leave ranks
    # blocked in a collective forever. A forked rank's parent is the fork
    # server, which exits with the launcher: watch both.
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent and _running(launcher):
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="embnb-parent-watch").start()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:  # exited and reaped
        return False


def _collect(procs, results_queue, world_size: int, timeout_s: float, deadline: float) -> list[Any]:
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}  # rank -> traceback or exit note, in arrival order
    while len(results) < world_size:
        _read(results_queue, results, failures, wait_s=0.1)
        _note_silent_deaths(procs, results_queue, results, failures)
        if failures:
            # Once a rank fails its peers soon fail too ("connection reset by
            # peer"): wait briefly so the report can name the root cause.
            _read(results_queue, results, failures, wait_s=1.0)
            _note_silent_deaths(procs, results_queue, results, failures)
            rank = _root_cause(failures)
            others = [r for r in failures if r != rank]
            note = f"\n(ranks {others} failed as well, probably as a consequence)" if others else ""
            if all(text.startswith(_RENDEZVOUS) for text in failures.values()):
                raise _RendezvousFailed(rank, failures[rank] + note)
            raise RankError(rank, failures[rank] + note)
        if time.monotonic() > deadline:
            missing = [r for r in range(world_size) if r not in results]
            raise LaunchTimeout(
                f"ranks {missing} did not finish within timeout_s={timeout_s:g}; all ranks were killed"
            )
    return [results[rank] for rank in range(world_size)]


def _read(results_queue, results: dict[int, Any], failures: dict[int, str], wait_s: float) -> None:
    """Take every message that arrives within `wait_s` seconds."""
    end = time.monotonic() + wait_s
    while True:
        try:
            status, rank, body = results_queue.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            return
        if status == "ok":
            results[rank] = pickle.loads(body)
        else:
            failures[rank] = body


_RENDEZVOUS = "in the ranks' rendezvous (before fn ran):\n"
_DIED = "process exited with code {} without a result (killed, crashed in native code, or os._exit)"


def _note_silent_deaths(procs, results_queue, results, failures) -> None:
    dead = [
        r for r, p in enumerate(procs) if p.exitcode is not None and r not in results and r not in failures
    ]
    if dead:
        _read(results_queue, results, failures, wait_s=0.5)  # a last message may be in the pipe
    for rank in dead:
        if rank not in results and rank not in failures:
            failures[rank] = _DIED.format(procs[rank].exitcode)


def _root_cause(failures: dict[int, str]) -> int:
    # A rank that died without a word caused the others' connection errors.
    silent = [r for r, text in failures.items() if text.startswith("process exited with code")]
    return silent[0] if silent else next(iter(failures))


def _kill_all(procs) -> None:
    for proc in procs:
        if proc.pid is None:
            continue
        if proc.exitcode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        proc.join(timeout=10)


def _to_cpu(value: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, value)


def check_collectives(rank: int, world_size: int) -> dict[str, Any]:
    """A smoke test of the process group: all_reduce and an uneven all_to_all.

    Rank r sends (d + 1) values to rank d, each `100 * r + d`; so rank r
    receives r + 1 values from every source s, each `100 * s + r`. The
    tensors live where the group's collectives need them.
    """
    device = collective_device()
    total = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(total)
    in_splits = [d + 1 for d in range(world_size)]
    out_splits = [rank + 1] * world_size
    send = torch.cat([torch.full((d + 1,), 100 * rank + d, device=device) for d in range(world_size)])
    recv = torch.empty(sum(out_splits), dtype=send.dtype, device=device)
    dist.all_to_all_single(recv, send, out_splits, in_splits)
    return {
        "rank": rank,
        "world_size": world_size,
        "backend": dist.get_backend(),
        "device": str(rank_device()),
        "all_reduce": total.item(),
        "all_to_all": recv.tolist(),
    }


def _main(argv: list[str]) -> None:
    """`python -m embnb.dist MODULE:FN [--world-size N]`, or the same under torchrun."""
    import argparse
    import importlib

    parser = argparse.ArgumentParser(prog="python -m embnb.dist", description=_main.__doc__)
    parser.add_argument("target", help="module:function taking (rank, world_size)")
    parser.add_argument("--world-size", type=int, default=2, help="ranks to spawn when not under torchrun")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    opts = parser.parse_args(argv)
    module_name, _, fn_name = opts.target.partition(":")
    fn = getattr(importlib.import_module(module_name), fn_name)
    if "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ:
        world_size = int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            pick_backend(opts.backend, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        )
        if dist.get_backend() == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        results = launch(fn, world_size)
        if dist.get_rank() == 0:
            for item in results:
                print(item, flush=True)
        end_process()
    else:
        for item in launch(fn, opts.world_size, backend=opts.backend):
            print(item, flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
