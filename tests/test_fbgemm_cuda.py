"""scripts/fbgemm_cuda.py on synthetic inputs (the real wheel is never
downloaded here): device code slimmed in place in an ELF built by the test,
and an archive split into hashed parts, received over several commands,
checked, resumed and unpacked."""

from __future__ import annotations

import io
import json
import pathlib
import random
import shutil
import struct
import subprocess
import sys
import tarfile

import pytest

from tests.test_gpu_kit import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import fbgemm_cuda  # noqa: E402


def _mangled(name: str) -> bytes:
    return f"_Z{len(name)}{name}Pf".encode()


def _cubin(*kernels: str) -> bytes:
    """Bytes that read like a cubin: an ELF magic and one .text.<symbol> section name per kernel."""
    return b"\x7fELF" + b"".join(b"\0.text." + _mangled(k) for k in kernels) + b"\0" * 11


def _fatbin(entries: list[tuple[int, bytes]]) -> bytes:
    """A fatbin of (arch, payload) ELF entries: 16-byte header, 64-byte entry headers."""
    body = b""
    for arch, payload in entries:
        header = struct.pack("<HHIQ", 2, 0x101, 64, len(payload)) + bytes(12)
        header += struct.pack("<I", arch) + bytes(64 - 32)
        body += header + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _elf(sections: dict[str, bytes]) -> tuple[bytes, dict[str, int]]:
    """A minimal ELF64 holding `sections` (and .shstrtab); returns it and each section's file offset."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    data, offsets, pos = b"", {}, 64
    for name, content in [*sections.items(), (".shstrtab", names)]:
        offsets[name] = pos + len(data)
        data += content + bytes(-len(content) % 8)
    shoff = 64 + len(data)
    headers = bytes(64)  # section 0 is null
    for name, content in [*sections.items(), (".shstrtab", names)]:
        headers += struct.pack(
            "<IIQQQQIIQQ",
            names.index(name.encode() + b"\0"),
            1,
            0,
            0,
            offsets[name],
            len(content),
            0,
            0,
            8,
            0,
        )
    count = len(sections) + 2
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    head = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, count, count - 1)
    return head + data + headers, offsets


USED = "split_embedding_codegen_forward_unweighted_kernel"
UNUSED = [
    "ssd_embedding_codegen_forward_unweighted_kernel",
    "split_embedding_backward_codegen_adam_weighted_kernel",
]


def test_slimming_zeroes_other_architectures_and_unused_kernels_in_place(tmp_path):
    mixed = _cubin(USED, UNUSED[0])  # one used kernel keeps its translation unit
    unused = _cubin(*UNUSED)
    fat = _fatbin([(80, _cubin(USED)), (90, mixed), (100, _cubin(USED))]) + _fatbin(
        [(80, unused), (90, unused)]
    )
    image, offsets = _elf({".text": b"host code" * 7, ".nv_fatbin": fat})
    library = tmp_path / "lib.so"
    library.write_bytes(image)

    counts = fbgemm_cuda.slim_library(library, arch=90)

    slim = library.read_bytes()
    assert len(slim) == len(image)
    start = offsets[".nv_fatbin"]
    # the expected section, written out entry by entry
    first = 16 + 64 + len(_cubin(USED))
    entries = [  # (offset of the payload in the section, its length, kept?, arch label after slimming)
        (16 + 64, len(_cubin(USED)), False, 80),
        (first + 64, len(mixed), True, 90),
        (first + 64 + len(mixed) + 64, len(_cubin(USED)), False, 100),
    ]
    second = len(_fatbin([(80, _cubin(USED)), (90, mixed), (100, _cubin(USED))]))
    entries += [
        (second + 16 + 64, len(unused), False, 80),
        (second + 16 + 64 + len(unused) + 64, len(unused), False, fbgemm_cuda.RELABEL_ARCH),
    ]
    for offset, size, kept, arch in entries:
        payload = slim[start + offset : start + offset + size]
        assert payload == (fat[offset : offset + size] if kept else bytes(size))
        assert struct.unpack_from("<I", slim, start + offset - 64 + 28)[0] == arch
    assert slim[: offsets[".nv_fatbin"]] == image[: offsets[".nv_fatbin"]]  # host code untouched
    assert counts == {
        "kept": len(mixed),
        "other_arch": 2 * len(_cubin(USED)) + len(unused),
        "unused": len(unused),
    }


@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd command")
def test_a_compressed_cubin_is_read_for_its_kernels(tmp_path):
    packed = subprocess.run(["zstd", "-c"], input=_cubin(*UNUSED), capture_output=True, check=True).stdout
    padded = packed + bytes(-len(packed) % 8)
    fat = bytearray(_fatbin([(90, padded)]))
    struct.pack_into("<Q", fat, 16 + 16, len(packed))  # the exact compressed size, as nvcc writes it
    image, offsets = _elf({".nv_fatbin": bytes(fat)})
    library = tmp_path / "lib.so"
    library.write_bytes(image)
    assert fbgemm_cuda.slim_library(library, arch=90)["unused"] == len(padded)
    payload = offsets[".nv_fatbin"] + 16 + 64
    assert library.read_bytes()[payload : payload + len(padded)] == bytes(len(padded))


def test_a_library_without_device_code_is_left_alone(tmp_path):
    image, _ = _elf({".text": b"only host code"})
    library = tmp_path / "lib.so"
    library.write_bytes(image)
    assert fbgemm_cuda.slim_library(library) == {"kept": 0, "other_arch": 0, "unused": 0}
    assert library.read_bytes() == image


@pytest.mark.parametrize(
    "kernel, unused",
    [
        ("split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1", False),
        ("split_embedding_backward_codegen_sgd_unweighted_vbe_kernel_warp_per_row_1", False),
        ("split_embedding_backward_codegen_dense_unweighted_kernel_cta_per_row_1", False),
        (
            "split_embedding_backward_codegen_rowwise_adagrad_with_counter_unweighted_kernel_cta_per_row_1",
            True,
        ),
        ("split_embedding_backward_codegen_lars_sgd_weighted_kernel_warp_per_row_1", True),
        ("split_embedding_codegen_forward_unweighted_gwd_kernel", True),
        ("nbit::INT4_split_embedding_codegen_forward_unweighted_kernel_small_L", True),
        ("split_embedding_codegen_grad_indice_weights_kernel", False),
    ],
)
def test_which_kernels_count_as_unused(kernel, unused):
    assert fbgemm_cuda.unused_kernel(kernel) is unused


def _archive(tmp_path) -> tuple[pathlib.Path, dict[str, bytes]]:
    generator = random.Random(0)  # incompressible: the archive needs several parts
    files = {f"fbgemm_gpu/file{i}.bin": generator.randbytes(3000 + i) for i in range(4)}
    archive = tmp_path / "package.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return archive, files


def test_parts_arrive_over_several_commands_are_checked_and_unpack_once_all_are_there(tmp_path):
    archive, files = _archive(tmp_path)
    parts = tmp_path / "parts"
    manifest = fbgemm_cuda.split(archive, parts, part_bytes=4000, extra={"arch": 90})
    names = [p["name"] for p in manifest["parts"]]
    assert len(names) == -(-archive.stat().st_size // 4000) >= 3
    assert b"".join((parts / p["folder"] / p["name"]).read_bytes() for p in manifest["parts"]) == (
        archive.read_bytes()
    )
    store = tmp_path / "store"

    def arrive(indices):  # one command's carry: only these part folders are there
        there = tmp_path / "there"
        shutil.rmtree(there, ignore_errors=True)
        for i in indices:
            shutil.copytree(parts / f"p{i:02d}", there / f"p{i:02d}")
        return fbgemm_cuda.receive(there, store)

    assert arrive([0]) == {"missing": names[1:], "bad": [], "site": None}
    # a part damaged in transit is named and not kept
    folder = parts / "p01"
    good = (folder / names[1]).read_bytes()
    (folder / names[1]).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    assert arrive([1]) == {"missing": names[1:], "bad": [names[1]], "site": None}
    (folder / names[1]).write_bytes(good)
    report = arrive(range(1, len(names)))
    assert report["missing"] == report["bad"] == [] and report["site"] == str(store / "site")
    for name, content in files.items():
        assert (store / "site" / name).read_bytes() == content
    # the next command finds it unpacked without any part; a lost machine (a new store) needs them all again
    assert arrive([])["site"] == str(store / "site")
    store = tmp_path / "fresh-store"
    assert arrive([0])["missing"] == names[1:]


def test_parts_of_another_package_are_refused(tmp_path):
    archive, _ = _archive(tmp_path)
    first = fbgemm_cuda.split(archive, tmp_path / "a", part_bytes=4000, extra={})
    store = tmp_path / "store"
    fbgemm_cuda.receive(tmp_path / "a", store)
    archive.write_bytes(archive.read_bytes() + b"x")
    second = fbgemm_cuda.split(archive, tmp_path / "b", part_bytes=4000, extra={})
    assert first["sha256"] != second["sha256"]
    with pytest.raises(SystemExit, match="another package's manifest"):
        fbgemm_cuda.receive(tmp_path / "b", store)
    assert json.loads((store / fbgemm_cuda.MANIFEST).read_text())["sha256"] == first["sha256"]
