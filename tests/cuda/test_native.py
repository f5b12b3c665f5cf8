"""embnb/cuda: the native bucketize kernels against the pure-torch reference
and FBGEMM, the loader (cache, fallback without a compiler), and the CUDA
sources compiling with nvcc for sm_90 and linking into the extension (CI
has nvcc but no GPU; the CUDA parity tests run only where a GPU is).
The first test builds the extension (about a minute on a fresh clone); the
CUDA compiles run in the background meanwhile.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.*)
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb.cuda import loader
from embnb.rowwise.routing import bucketize

REPO = pathlib.Path(__file__).resolve().parents[2]
CUDA_DIR = REPO / "embnb" / "cuda"
MODES = ["continuous", "roundrobin", "hash_roundrobin", "feistel_roundrobin"]
DTYPES = [torch.int32, torch.int64]
LIMITS = {torch.int32: 2**31 - 1, torch.int64: 2**63 - 1}
HAS_GPU = torch.cuda.is_available()

some = settings(max_examples=120, deadline=None)


# ---- background compile checks (started first, checked last) -------------


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module", autouse=True)
def compile_jobs(tmp_path_factory):
    """nvcc on the .cu and the C++ compiler on the CUDA binding, in the
    background while the CPU extension builds and the parity tests run."""
    out = tmp_path_factory.mktemp("cuda-objects")
    jobs = {"dir": out}
    from torch.utils.cpp_extension import include_paths

    for source in loader.CUDA_SOURCES:  # every one the loader builds where a GPU is
        stem = pathlib.Path(source).stem
        if source.endswith(".cu"):
            if shutil.which("nvcc"):
                jobs[f"nvcc {source}"] = _start(
                    [
                        "nvcc",
                        "-arch=sm_90",
                        "-O3",
                        "-std=c++20",
                        "-Xcompiler",
                        "-fPIC,-Wall",
                        "-c",
                        str(CUDA_DIR / source),
                        "-o",
                        str(out / f"{stem}_cu.o"),
                    ]
                )
        else:
            jobs[f"binding {source}"] = _start(
                [
                    os.environ.get("CXX", "c++"),
                    "-std=c++20",
                    "-fPIC",
                    "-Wall",
                    "-c",
                    *[f"-I{p}" for p in include_paths()],
                    str(CUDA_DIR / source),
                    "-o",
                    str(out / f"{stem}.o"),
                ]
            )
    yield jobs
    for name, job in jobs.items():
        if name != "dir" and job.poll() is None:
            job.kill()


@pytest.fixture(scope="module")
def native():
    """The extension, built on first use: a build failure fails the suite."""
    return loader.load()


# ---- independent expectations ----------------------------------------------


def reference(*args, **kwargs):
    return bucketize(*args, native=False, **kwargs)


def assert_same(got, want):
    for name in ("lengths", "indices", "unbucketize_permute", "weights"):
        a, b = getattr(got, name), getattr(want, name)
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.device == b.device, (name, a, b)
        assert torch.equal(a, b), (name, a.tolist(), b.tolist())


@st.composite
def cases(draw, modes=st.sampled_from(MODES), max_world=300):
    """A KJT with per-feature modes, covering empty rows and features, one
    rank, keys past the last block, keys >= 2**52, tables of one row to
    2**62 rows (feistel_roundrobin, dense roundrobin tables) and int32/int64 data."""
    world = draw(st.one_of(st.integers(1, 9), st.sampled_from([1, 64, 100]), st.integers(1, max_world)))
    num_features = draw(st.integers(1, 4))
    batch = draw(st.integers(0, 5))
    feature_modes = [draw(modes) for _ in range(num_features)]
    blocks = [draw(st.one_of(st.integers(1, 30), st.integers(1, 2**62))) for _ in range(num_features)]
    index_dtype = draw(st.sampled_from(DTYPES))
    lengths_dtype = draw(st.sampled_from(DTYPES))
    hi = LIMITS[index_dtype]
    tables = [draw(st.one_of(st.integers(1, 50), st.integers(1, min(hi, 2**62)))) for _ in blocks]
    # a roundrobin feature routes unbounded keys (0) or a dense table's ids (local rows sent)
    tables = [t * draw(st.booleans()) if m == "roundrobin" else t for m, t in zip(feature_modes, tables)]
    empty_feature = draw(st.integers(-1, num_features - 1))  # -1: none
    lengths, indices = [], []
    for seg in range(num_features * batch):
        f = seg // batch
        length = 0 if f == empty_feature else draw(st.integers(0, 7))
        lengths.append(length)
        if feature_modes[f] == "continuous":
            keys = st.one_of(
                st.integers(0, 2 * min(blocks[f], 40) * world),
                st.integers(0, hi),
                st.integers(min(2**52 - 3, hi), hi),
            )
        elif feature_modes[f] == "feistel_roundrobin" or (feature_modes[f] == "roundrobin" and tables[f]):
            keys = st.one_of(st.integers(0, tables[f] - 1), st.sampled_from([0, tables[f] - 1]))
        else:
            keys = st.one_of(st.integers(-hi - 1, hi), st.sampled_from([0, 1, -1, hi, -hi - 1]))
        indices += [draw(keys) for _ in range(length)]
    return dict(
        lengths=torch.tensor(lengths, dtype=lengths_dtype),
        indices=torch.tensor(indices, dtype=index_dtype),
        world=world,
        modes=feature_modes,
        blocks=blocks,
        num_features=num_features,
        tables=tables,
        seed=draw(st.integers(0, 2**20)),
    )


def run_both(case, device="cpu", weights=None):
    args = (
        case["lengths"].to(device),
        case["indices"].to(device),
        case["world"],
        case["modes"],
        case["blocks"],
    )
    kwargs = dict(weights=weights, num_embeddings=case.get("tables"), seed=case.get("seed", 0))
    return (bucketize(*args, native=True, **kwargs), reference(*args, **kwargs))


# ---- CPU parity -------------------------------------------------------------


def test_extension_builds_and_registers_the_op(native):
    assert native.library.exists()
    assert native.library.parent.parent == loader.cache_root()
    assert native.library.parent.name.startswith(f"{loader.NAME}-")
    assert hasattr(torch.ops.embnb, "bucketize")


def test_the_cpu_kernel_is_built_to_run_on_torchs_threads(native):
    """bucketize_cpu splits its work with at::parallel_for, which is a plain
    loop unless the library is compiled with OpenMP: then it calls OpenMP's
    runtime (torch's own, found through libtorch_cpu), at torch's thread count."""
    symbols = subprocess.run(
        ["nm", "-D", "--undefined-only", str(native.library)], capture_output=True, text=True, check=True
    ).stdout
    assert "GOMP_parallel" in symbols


@some
@given(case=cases())
def test_native_matches_reference(native, case):
    got, want = run_both(case)
    assert_same(got, want)


@some
@given(case=cases(), weight_shape=st.sampled_from([(), (3,)]))
def test_native_moves_weights_like_reference(native, case, weight_shape):
    n = case["indices"].numel()
    weights = torch.randn((n, *weight_shape), dtype=torch.float64)
    got, want = run_both(case, weights=weights)
    assert_same(got, want)


@settings(max_examples=200, deadline=None)
@given(case=cases(modes=st.just("continuous")), with_weights=st.booleans())
def test_native_continuous_matches_fbgemm(native, case, with_weights):
    lengths, indices = case["lengths"], case["indices"]
    weights = torch.rand(len(indices)) if with_weights else None
    # FBGEMM computes block_size * W in the dtype of the indices and routes
    # wrongly when that overflows; the reference (and embnb) do not.
    blocks = [min(b, LIMITS[indices.dtype] // case["world"]) for b in case["blocks"]]
    got = bucketize(lengths, indices, case["world"], "continuous", blocks, weights=weights, native=True)
    block_sizes = torch.tensor(blocks, dtype=indices.dtype)
    want = torch.ops.fbgemm.block_bucketize_sparse_features(
        lengths,
        indices,
        bucketize_pos=False,
        sequence=True,
        block_sizes=block_sizes,
        my_size=case["world"],
        weights=weights,
    )
    assert torch.equal(got.lengths, want[0]) and got.lengths.dtype == want[0].dtype
    assert torch.equal(got.indices, want[1]) and got.indices.dtype == want[1].dtype
    assert torch.equal(got.unbucketize_permute, want[4])
    if with_weights:
        assert torch.equal(got.weights, want[2])


def big_case(seed, world, modes, index_dtype=torch.int64):
    """~200k keys with heavy-tailed rows: many empty rows and one row of
    60k keys, so rows span the CPU kernel's per-thread chunks."""
    gen = torch.Generator().manual_seed(seed)
    num_features, batch = len(modes), 500
    lengths = torch.randint(0, 100, (num_features * batch,), generator=gen)
    lengths[torch.rand(lengths.shape, generator=gen) < 0.3] = 0
    lengths[7] = 60_000
    n = int(lengths.sum())
    indices = torch.randint(0, 10**9, (n,), generator=gen)
    raw = torch.randint(-(2**62), 2**62, (n,), generator=gen)
    feature = torch.repeat_interleave(torch.arange(num_features * batch) // batch, lengths)
    unbounded = torch.tensor([m == "hash_roundrobin" for m in modes])[feature]
    indices[unbounded] = raw[unbounded]
    return dict(
        lengths=lengths.int(),
        indices=indices.to(index_dtype),
        world=world,
        modes=modes,
        blocks=[10**9 // world + 1] * num_features,
        tables=[10**9] * num_features,  # feistel and roundrobin (dense) features' ids are below it
        seed=seed,
    )


@pytest.mark.parametrize("threads", [2, 5])
@pytest.mark.parametrize(
    "world, modes",
    [
        (8, ["continuous"] * 3),
        (64, ["hash_roundrobin", "continuous", "feistel_roundrobin"]),
        (300, ["roundrobin", "feistel_roundrobin", "continuous"]),  # W > 256
    ],
)
def test_native_matches_reference_across_thread_chunks(native, threads, world, modes):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)  # more chunks than cores: more carries
    try:
        for index_dtype in DTYPES:
            case = big_case(threads + world, world, modes)
            if index_dtype == torch.int32:
                case["indices"] = (case["indices"] % 2**31).int()
            got, want = run_both(case)
            assert_same(got, want)
    finally:
        torch.set_num_threads(old)


def test_native_big_continuous_matches_fbgemm(native):
    case = big_case(1, 8, ["continuous"] * 3)
    lengths, indices = case["lengths"], case["indices"]
    got = bucketize(lengths, indices, 8, "continuous", case["blocks"], native=True)
    want = torch.ops.fbgemm.block_bucketize_sparse_features(
        lengths, indices, False, True, torch.tensor(case["blocks"]), 8
    )
    assert torch.equal(got.lengths, want[0])
    assert torch.equal(got.indices, want[1])
    assert torch.equal(got.unbucketize_permute, want[4])


# ---- the op's own checks -----------------------------------------------------

L = torch.tensor([1, 2, 0, 1])
KEYS = torch.tensor([3, 4, 5, 6])
ROUND_KEYS = torch.tensor([11, -5, 2**40, 7])  # feistel_roundrobin's, any int64 bits


@pytest.mark.parametrize(
    "args, error, words",
    [
        ((L, KEYS, 2, [0, 4], [4, 4]), ValueError, ["dist_types[1]", "4", "3 feistel_roundrobin"]),
        ((L, KEYS, 2, [1, 3], [0, 8]), ValueError, ["feature 1 is feistel_roundrobin", "feistel_keys"]),
        (
            (L, KEYS, 2, [1, 3], [0, 0], None, ROUND_KEYS),
            ValueError,
            ["block_sizes[1] is 0", "num_embeddings"],
        ),
        ((L, KEYS, 2, [1, 3], [0, 8], None, torch.ones(9).long()), ValueError, ["feistel_keys", "1 to 8"]),
        (
            (L, KEYS, 2, [1, 3], [0, 6], None, ROUND_KEYS),
            ValueError,
            ["[0, 6)", "key 6", "position 3", "feature 1"],
        ),
        ((L, torch.tensor([3, 4, -7, 5]), 2, [1, 3], [0, 6], None, ROUND_KEYS), None, []),
        ((L, KEYS, 2, [3, 1], [8, 6], None, ROUND_KEYS), ValueError, ["roundrobin", "[0, 6)", "feature 1"]),
        ((L, KEYS, 2, [0, 1], [4, -1]), ValueError, ["block_sizes[1] is -1", "roundrobin", "0 for"]),
        (
            (L, KEYS.int(), 2, [1, 3], [0, 2**31 + 1], None, ROUND_KEYS),
            ValueError,
            ["int32 indices", "2**31"],
        ),
        ((L, KEYS, 2, [0, 1], [4]), ValueError, ["len(block_sizes) is 1", "2"]),
        ((L, KEYS, 2, [], []), ValueError, ["dist_types", "none"]),
        ((L, KEYS, 0, [1, 1], [0, 0]), ValueError, ["world_size", "0"]),
        ((L, KEYS, 2, [1, 1, 1], [0] * 3), ValueError, ["len(lengths) is 4", "3"]),
        ((L, KEYS, 2, [0, 0], [4, -1]), ValueError, ["block_sizes[1]", "-1"]),
        ((L.float(), KEYS, 2, [1, 1], [0, 0]), ValueError, ["lengths", "Float"]),
        ((L, KEYS.short(), 2, [1, 1], [0, 0]), ValueError, ["indices", "Short"]),
        ((L.view(2, 2), KEYS, 2, [1, 1], [0, 0]), ValueError, ["lengths", "1-D"]),
        ((torch.tensor([1, 2, 0, 2]), KEYS, 2, [1, 1], [0, 0]), ValueError, ["sum to 5", "4 keys"]),
        ((torch.tensor([1, -2, 4, 1]), KEYS, 2, [1, 1], [0, 0]), ValueError, ["-2", "position 1"]),
        (
            (L, torch.tensor([3, 4, -7, 6]), 2, [0, 1], [4, 0]),
            ValueError,
            ["key -7", "position 2", "feature 0"],
        ),
        ((L, torch.tensor([3, 4, -7, 6]), 2, [1, 0], [0, 4]), None, []),
    ],
)
def test_op_rejects_bad_input(native, args, error, words):
    if error is None:  # a negative key of a round-robin feature is fine
        torch.ops.embnb.bucketize(*args)
        return
    with pytest.raises(error) as info:
        torch.ops.embnb.bucketize(*args)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_op_rejects_weights_of_the_wrong_length(native):
    with pytest.raises(ValueError, match="4 rows"):
        torch.ops.embnb.bucketize(L, KEYS, 2, [1, 1], [0, 0], torch.ones(3))


@pytest.mark.parametrize("switch", ["native", 1, "auto"])
def test_bucketize_takes_only_a_bool_or_none_for_native(switch):
    with pytest.raises(TypeError, match=f"native must be True .* got {type(switch).__name__} {switch!r}"):
        bucketize(L, KEYS, 2, "roundrobin", native=switch)


# ---- loader: cache key, reuse, fallback -------------------------------------


def test_build_dir_changes_only_with_the_sources(tmp_path, monkeypatch):
    copy = tmp_path / "cuda"
    shutil.copytree(CUDA_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(loader, "HERE", copy)
    monkeypatch.setenv("EMBNB_EXT_DIR", str(tmp_path / "cache"))
    first = loader.build_dir(False)
    assert first.parent == tmp_path / "cache"
    assert loader.build_dir(False) == first
    assert loader.build_dir(True) != first  # CUDA sources join the hash
    header = copy / "bucketize_common.h"
    header.write_text(header.read_text() + "\n// changed\n")
    assert loader.build_dir(False) != first


def test_cuda_builds_are_kept_apart_per_gpu_architecture(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBNB_EXT_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    a100 = loader.build_dir(True)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    assert loader.build_dir(True) != a100
    assert loader.build_dir(False) == loader.build_dir(False)  # a CPU build has no architecture
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    assert loader.build_dir(True) == a100


@pytest.mark.skipif(HAS_GPU, reason="checks the machine without a visible GPU")
def test_no_cuda_build_without_a_gpu_to_build_for(monkeypatch):
    # torch cannot choose an architecture then, and a failed CUDA build
    # would take the CPU kernels (same library) down with it.
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert not loader.with_cuda()


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_second_process_loads_the_cached_build_without_compiling(native):
    if loader.build_dir(native.cuda) != native.library.parent:
        pytest.skip("a source in embnb/cuda changed since this run loaded it")
    done = _run_python("""
        from embnb.cuda import loader
        print(loader.load().library)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(native.library)
    assert "compiling" not in done.stderr


FALLBACK_SCRIPT = """
    import json, warnings
    import torch
    from embnb.cuda import loader
    from embnb.rowwise.routing import bucketize
    lengths = torch.tensor([2, 0, 3, 1])
    indices = torch.tensor([5, -1, 2**40, 7, 0, 11])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = bucketize(lengths, indices, 3, "hash_roundrobin", num_features=2)
        second = bucketize(lengths, indices, 3, "roundrobin", num_features=2)
    try:
        bucketize(lengths, indices, 3, "roundrobin", native=True)
        native_error = None
    except loader.NativeUnavailable as error:
        native_error = str(error)
    try:
        loader.use(True)
        use_true_error = None
    except loader.NativeUnavailable as error:
        use_true_error = str(error)
    print(json.dumps(dict(
        results=[[t.tolist() for t in out[:3]] for out in (first, second)],
        warnings=[str(w.message) for w in caught
                  if str(w.message).startswith("embnb:")],
        native_error=native_error,
        use_true_error=use_true_error,
        use_none=loader.use(None),
        use_false=loader.use(False),
        failure=loader.failure(),
    )))
"""


def test_fallback_without_compiler_warns_once_and_gives_same_answer(tmp_path):
    done = _run_python(FALLBACK_SCRIPT, CXX="/nonexistent/c++", EMBNB_EXT_DIR=str(tmp_path / "empty-cache"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "runs its pure-torch and Python versions instead" in report["warnings"][0]
    assert "/nonexistent/c++" in report["warnings"][0]  # says why
    assert report["native_error"] and "failed" in report["native_error"]
    # the switch: True needs the library and says why it cannot have it; None and False fall back
    assert report["use_true_error"] == report["failure"] and "/nonexistent/c++" in report["failure"]
    assert report["use_none"] is False and report["use_false"] is False
    lengths = torch.tensor([2, 0, 3, 1])
    indices = torch.tensor([5, -1, 2**40, 7, 0, 11])
    for got, mode in zip(report["results"], ["hash_roundrobin", "roundrobin"]):
        want = reference(lengths, indices, 3, mode, num_features=2)
        assert got == [t.tolist() for t in want[:3]]


# ---- CUDA -----------------------------------------------------------------

needs_gpu = pytest.mark.cuda  # tests/conftest.py: skipped without a GPU, failed under EMBNB_REQUIRE_GPU=1


@needs_gpu
def test_cuda_kernels_were_built(native):
    assert native.cuda, "torch has CUDA but the extension has no CUDA kernels"


@needs_gpu
@some
@given(case=cases(), with_weights=st.booleans())
def test_cuda_matches_reference(native, case, with_weights):
    n = case["indices"].numel()
    weights = torch.randn(n, device="cuda") if with_weights else None
    got, want = run_both(case, device="cuda", weights=weights)
    assert_same(got, want)


@needs_gpu
@pytest.mark.parametrize(
    "world, modes",
    [
        (8, ["continuous"] * 3),
        (64, ["hash_roundrobin", "continuous", "roundrobin"]),
        (300, ["roundrobin", "hash_roundrobin", "continuous"]),
    ],
)
def test_cuda_big_matches_reference(native, world, modes):
    for index_dtype in DTYPES:
        case = big_case(world, world, modes)
        if index_dtype == torch.int32:
            case["indices"] = (case["indices"] % 2**31).int()
        got, want = run_both(case, device="cuda")
        assert_same(got, want)


@needs_gpu
@pytest.mark.parametrize("num_keys, world", [(10**6, 4096), (10**7, 512), (10**8, 8)])
def test_cuda_matches_the_cpu_kernel_and_the_reference_at_scale(native, num_keys, world):
    """Every dist_type at up to 1e8 keys and W up to 4096 (the GPU kit runs
    this): the CUDA kernel, the CPU kernel and the pure-torch reference agree
    bit for bit."""
    from embnb.lab.rowwise.kernel_timing import make_inputs
    from embnb.rowwise.routing import DIST_CODES, DistType, feistel_round_keys

    rows = 10**8
    lengths, indices = make_inputs(num_keys, "cpu", rows=rows)
    num_features = 8
    for mode in DistType:
        feistel = mode is DistType.FEISTEL_ROUNDROBIN
        # a continuous feature's entry: the table's rows split into W blocks; the round-robin routings
        # of a dense table (feistel, roundrobin): its rows
        blocks = [-(-rows // world) if mode is DistType.CONTINUOUS else rows] * num_features
        keys = feistel_round_keys(0) if feistel else None
        codes = [DIST_CODES[mode]] * num_features
        cpu = torch.ops.embnb.bucketize(lengths, indices, world, codes, blocks, None, keys)
        cuda = torch.ops.embnb.bucketize(lengths.cuda(), indices.cuda(), world, codes, blocks, None, keys)
        reference = bucketize(lengths, indices, world, mode, blocks, num_embeddings=blocks, native=False)
        for name, on_gpu, on_cpu, want in zip(("lengths", "indices", "permute"), cuda, cpu, reference):
            assert torch.equal(on_gpu.cpu(), on_cpu), (mode, name, "CUDA vs CPU kernel")
            assert torch.equal(on_cpu, want), (mode, name, "CPU kernel vs reference")
        del cpu, cuda, reference
        torch.cuda.empty_cache()


def test_the_ops_errors_capture_no_cpp_backtrace(native):
    """embnb's checks throw standard exceptions, not c10's (embnb/cuda/checks.h: c10 errors made by
    the extension segfaulted on the lent GPU machines), so they carry no C++ backtrace: with C++
    stack traces shown, torch's own error carries one and embnb's carry none; a bad value and a
    wrong dtype are ValueErrors."""
    script = textwrap.dedent(
        """
        import torch
        from embnb.cuda import loader
        loader.load()
        calls = {
            "torch": lambda: torch.ones(2).view(3),
            "bucketize": lambda: torch.ops.embnb.bucketize(
                torch.tensor([1, -2]), torch.tensor([3]), 2, [1], [0]),
            "karmarkar_karp": lambda: torch.ops.embnb.karmarkar_karp(torch.ones(3), 2),
        }
        for name, call in calls.items():
            try:
                call()
            except Exception as error:
                print(name, type(error).__name__, "Exception raised from" in str(error))
        """
    )
    env = {**os.environ, "TORCH_SHOW_CPP_STACKTRACES": "1", "TORCH_DISABLE_ADDR2LINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "torch RuntimeError True",
        "bucketize ValueError False",
        "karmarkar_karp ValueError False",
    ], done.stdout


@needs_gpu
def test_cuda_feistel_slots_equal_the_cpu_kernel_and_the_torch_version(native):
    """The feistel_roundrobin renumbering on CUDA ids (the routed sharder's, on a GPU): bit for bit
    the CPU kernel's and TableLayout's torch version, small and large tables; a bad id is refused by
    name and an empty batch gives no slots."""
    from embnb.rowwise import TableLayout

    generator = torch.Generator().manual_seed(3)
    for n, world_size, seed in ((1, 1, 0), (7, 3, 5), (1001, 8, 0), (2**20 + 7, 8, 11), (10**9, 64, 2)):
        layout = TableLayout(n, world_size, "feistel_roundrobin", seed)
        ids = torch.randint(0, n, (100_000,), generator=generator)
        on_gpu = layout.slots(ids.cuda(), native=True)
        assert on_gpu.device.type == "cuda"
        assert torch.equal(on_gpu.cpu(), layout.slots(ids, native=True)), (n, world_size)
        assert torch.equal(on_gpu.cpu(), layout.slots(ids, native=False)), (n, world_size)
    keys = torch.zeros(4, dtype=torch.int64)
    assert torch.ops.embnb.feistel_slots(torch.zeros(0, dtype=torch.int64).cuda(), 5, 2, 2, keys).numel() == 0


def errors_in_a_child(calls: str) -> list[str]:
    """Run `calls` (a dict literal of name: lambda, each expected to raise) in a child process
    with the library loaded and CUDA initialized; return "name ErrorType: message" per call. The
    child prints each name before its call, so a call that kills the process (the GPU kit's fourth
    run: the CUDA feistel op's bad-id error ended pytest with SIGSEGV) fails the test naming the
    call and the signal, and the other tests of this file still run."""
    script = textwrap.dedent(
        """
        import torch
        from embnb.cuda import loader
        loader.load()
        torch.zeros(1, device="cuda")  # the CUDA context, before any call
        L = torch.tensor([1, 2, 0, 1])
        KEYS = torch.tensor([3, 4, 5, 6])
        for name, call in (CALLS).items():
            print("calling", name, flush=True)
            try:
                call()
                print(name, "no error", flush=True)
            except Exception as error:
                print(name, f"{type(error).__name__}: {error}".splitlines()[0], flush=True)
        """
    ).replace("CALLS", calls)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    reached = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("calling ")]
    assert done.returncode == 0, (
        f"the child died with code {done.returncode} in call {reached[-1] if reached else None!r}:\n"
        f"{done.stdout[-2000:]}{done.stderr[-3000:]}"
    )
    return [line for line in done.stdout.splitlines() if not line.startswith("calling ")]


@needs_gpu
def test_cuda_ops_refuse_bad_data_by_value(native):
    """Bad data in CUDA tensors is refused with a ValueError naming the value, and the process
    lives: an embnb CPU op's error first (after CUDA started), then each CUDA op's."""
    results = errors_in_a_child(
        """{
        "cpu bucketize, bad length": lambda: torch.ops.embnb.bucketize(
            torch.tensor([1, -2, 4, 1]), KEYS, 2, [1, 1], [0, 0]),
        "feistel, bad id": lambda: torch.ops.embnb.feistel_slots(
            torch.tensor([0, 5, 1]).cuda(), 5, 2, 2, torch.zeros(4, dtype=torch.int64)),
        "bucketize, bad length": lambda: torch.ops.embnb.bucketize(
            torch.tensor([1, -2, 4, 1]).cuda(), KEYS.cuda(), 2, [1, 1], [0, 0]),
        "bucketize, lengths too long": lambda: torch.ops.embnb.bucketize(
            torch.tensor([1, 2, 0, 2]).cuda(), KEYS.cuda(), 2, [1, 1], [0, 0]),
        "bucketize, bad key": lambda: torch.ops.embnb.bucketize(
            L.cuda(), torch.tensor([3, 4, -7, 6]).cuda(), 2, [0, 1], [4, 0]),
        }"""
    )
    expected = [
        ("cpu bucketize, bad length", "-2 at position 1"),
        ("feistel, bad id", "id 5 is outside [0, 5)"),
        ("bucketize, bad length", "-2 at position 1"),
        ("bucketize, lengths too long", "sum to 5"),
        ("bucketize, bad key", "key -7 at position 2 (feature 0"),
    ]
    assert len(results) == len(expected), results
    for line, (name, words) in zip(results, expected):
        assert line.startswith(f"{name} ValueError: ") and words in line, (line, words)


# ---- the CUDA sources compile (CI has nvcc but no GPU) ----------------------


def _finished(compile_jobs, name: str) -> str:
    job = compile_jobs[name]
    output = job.communicate(timeout=600)[0]
    assert job.returncode == 0, f"{' '.join(job.args)} failed:\n{output}"
    return output


NO_NVCC = (
    "nvcc is not on PATH: `make test` compiles the CUDA sources (CI has the CUDA toolkit, "
    "13.0, with nvcc in /usr/local/bin); install the toolkit or put its bin/ on PATH"
)


def _all_finished(compile_jobs, kind: str) -> list[str]:
    """Every compile job of `kind` ("nvcc" or "binding") finished without error; their names."""
    names = [name for name in compile_jobs if name.startswith(f"{kind} ")]
    for name in names:
        _finished(compile_jobs, name)
    return names


def test_cuda_kernels_compile_with_nvcc(compile_jobs):
    if not _all_finished(compile_jobs, "nvcc"):
        pytest.fail(NO_NVCC)


def test_cuda_bindings_compile(compile_jobs):
    assert _all_finished(compile_jobs, "binding")


LOAD_AND_DUMP = """
    import sys, torch
    torch.ops.load_library(sys.argv[1])
    print(torch._C._dispatch_dump("embnb::bucketize"))
    print(torch._C._dispatch_dump("embnb::feistel_slots"))
"""


def test_cuda_extension_links_and_registers_both_kernels(native, compile_jobs):
    """The CPU objects of the built extension plus every CUDA object link into one library with no
    undefined symbol (static cudart, CPU torch, torch's OpenMP runtime), and loading it registers
    embnb::bucketize and embnb::feistel_slots for CPU and CUDA."""
    if not _all_finished(compile_jobs, "nvcc"):
        pytest.fail(NO_NVCC)
    _all_finished(compile_jobs, "binding")
    out = compile_jobs["dir"]
    cpu_objects = sorted(native.library.parent.glob("*.o"))
    assert cpu_objects, f"no object files next to {native.library}"
    cuda_objects = sorted(out.glob("*.o"))
    assert len(cuda_objects) == len(loader.CUDA_SOURCES), cuda_objects
    torch_lib = pathlib.Path(torch.__file__).parent / "lib"
    library = out / "embnb_cuda_check.so"
    link = subprocess.run(
        [
            "nvcc",
            "-shared",
            "-o",
            str(library),
            *map(str, cpu_objects),
            *map(str, cuda_objects),
            f"-L{torch_lib}",
            "-lc10",
            "-ltorch_cpu",
            "-ltorch",
            "-l:libgomp.so.1",  # libtorch_cpu's OpenMP runtime (the CPU kernel is built with -fopenmp)
            "-Xlinker",
            "--no-undefined",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert link.returncode == 0, link.stdout + link.stderr
    # A fresh process: this one already holds the ops' schemas.
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LOAD_AND_DUMP), str(library)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for op, cpu, cuda in (
        ("bucketize", "bucketize_cpu.cpp", "bucketize_cuda.cpp"),
        ("feistel_slots", "feistel.cpp", "feistel_cuda.cpp"),
    ):
        dump = done.stdout.split(f"name: embnb::{op}")[1].split("name: embnb::")[0]
        registered = {line.split(":")[0]: line for line in dump.splitlines()}
        assert cpu in registered.get("CPU", ""), done.stdout
        assert cuda in registered.get("CUDA", ""), done.stdout


BUILD_THROUGH_THE_LOADER = """
    import json, torch
    from embnb.cuda import loader
    native = loader.load()
    print(json.dumps({"cuda": native.cuda, "library": str(native.library),
                      "dispatch": torch._C._dispatch_dump("embnb::bucketize")}))
"""


def cuda_home() -> str:
    """$CUDA_HOME, else the toolkit nvcc runs from: nvcc on PATH may be a
    wrapper script, where torch's guess (its parent folder) has no headers."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    if shutil.which("nvcc") is None:
        pytest.fail(NO_NVCC)
    dry = subprocess.run(["nvcc", "--dryrun", "-c", "-x", "cu", os.devnull], capture_output=True, text=True)
    (top,) = [line.split("=", 1)[1] for line in dry.stderr.splitlines() if line.startswith("#$ TOP=")]
    return str(pathlib.Path(top).resolve())


# The pinned stack's torch is a CPU build; the min stack's (a CUDA wheel, as
# on the GPU machine) takes the loader's CUDA build path: `make test STACK=min`.
@pytest.mark.skipif(
    torch.version.cuda is None and os.environ.get("STACK") != "min",
    reason="torch here is a CPU build: `make test STACK=min` (a CUDA torch) runs this",
)
def test_the_loader_builds_cuda_kernels_for_sm_90_without_a_gpu(tmp_path):
    """The loader's own cpp_extension path, as on a GPU machine, with the
    architecture given instead of read off a GPU: CUDA kernels for sm_90
    in the library, and the bucketize op registered for CPU and CUDA."""
    assert torch.version.cuda is not None, f"the min stack's torch {torch.__version__} has no CUDA"
    home = cuda_home()
    done = _run_python(
        BUILD_THROUGH_THE_LOADER,
        EMBNB_EXT_DIR=str(tmp_path),
        TORCH_CUDA_ARCH_LIST="9.0",
        CUDA_HOME=home,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    library = pathlib.Path(built["library"])
    assert built["cuda"] is True and library.is_relative_to(tmp_path)
    registered = {line.split(":")[0]: line for line in built["dispatch"].splitlines()}
    assert "bucketize_cpu.cpp" in registered.get("CPU", ""), built["dispatch"]
    assert "bucketize_cuda.cpp" in registered.get("CUDA", ""), built["dispatch"]
    # what nvcc was told to build: code for sm_90 (torch's build file beside the library)
    assert "code=sm_90" in (library.parent / "build.ninja").read_text()


def test_use_reads_the_native_switch_one_way():
    assert loader.use(False) is False  # never, whatever is built
    assert loader.use(None) is loader.available()  # where the ops load
    if loader.available():
        assert loader.use(True) is True
