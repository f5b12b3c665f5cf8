"""FBGEMM's CUDA kernels for the lent GPU machine, in parts small enough to travel.

The GPU machine has no package registry and at most 64 MiB travel with a
command, but fbgemm-gpu's CUDA wheel is 465 MB (2.5 GB unpacked, device code
for sm_80, sm_90a and sm_100a). `pack` makes a slim copy of it for one GPU
architecture and cuts it into hashed parts; `receive`, on the GPU machine,
takes the parts that arrived (over consecutive commands), checks each by its
hash, keeps them in a store outside the checkout, and unpacks the package
once every part is there. A lost machine loses the store: `receive` then says
which parts are missing and the next commands bring them again.

Slimming keeps every library and every byte of host code, so `import
fbgemm_gpu` registers every op as the wheel does. Only device code goes, in
place (offsets and sizes unchanged): in each library's `.nv_fatbin` section
the cubins of other architectures are zeroed, and so are the kept
architecture's cubins of the translation units whose kernels serve only
what embnb and torchrec's training path never launch (SSD offloading,
quantized inference, global weight decay, optimizers other than
KEEP_OPTIMIZERS). Such a cubin is relabelled as another architecture, so a
launch of one of its kernels fails with CUDA's "no kernel image is available"
rather than running anything. The zeroed ranges compress to nothing.

    python scripts/fbgemm_cuda.py pack           # here: download, slim, pack, split into build/fbgemm-cuda
    python3 scripts/fbgemm_cuda.py receive --parts build/fbgemm-cuda --store /tmp/embnb-fbgemm-cuda  # there
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_PARTS = ROOT / "build" / "fbgemm-cuda"
PIN = "fbgemm-gpu==1.6.0"  # the build for the GPU machine's torch 2.11 (+cu130)
ARCH = 90  # H100 and H200 (the wheel's sm_90a cubins)
RELABEL_ARCH = 80  # a dropped cubin's label: an architecture whose cubins are all zeroed too
PART_BYTES = 56 << 20  # a part and the repository fit one command's 64 MiB
ARCHIVE = "fbgemm-cuda.tar.xz"
MANIFEST = "manifest.json"
# exact_sgd is torchrec's default fused optimizer; exact_row_wise_adagrad is
# embnb.steptime's; "dense" is the backward of torchrec's dense (data-parallel)
# kernel; "none" serves optimizer-less TBEs (backward only).
KEEP_OPTIMIZERS = {"sgd", "rowwise_adagrad", "dense", "none"}
FATBIN_MAGIC = 0xBA55ED50
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ELF_CUBIN = 2
_OPTIMIZER = re.compile(r"backward_codegen_(\w+?)_(?:weighted|unweighted)")
_KERNEL = re.compile(rb"\.text\.([\w$.]+)")


def unused_kernel(name: str) -> bool:
    """True if a kernel (demangled base name) serves nothing embnb or torchrec's
    training path launches."""
    if name.startswith(("ssd_", "nbit::")) or "_gwd_" in name or name.endswith("_gwd_kernel"):
        return True
    optimizer = _OPTIMIZER.search(name)
    return bool(optimizer) and optimizer.group(1) not in KEEP_OPTIMIZERS


def base_name(mangled: bytes) -> str:
    """The function name of an Itanium-mangled symbol (namespaces joined by ::), else the symbol."""
    if mangled.startswith(b"_ZN"):
        parts, i = [], 3
        while i < len(mangled) and mangled[i : i + 1].isdigit():
            digits = re.match(rb"\d+", mangled[i:]).group()
            i += len(digits)
            parts.append(mangled[i : i + int(digits)].decode())
            i += int(digits)
        return "::".join(parts)
    plain = re.match(rb"_Z(\d+)", mangled)
    if plain:
        start = len(plain.group())
        return mangled[start : start + int(plain.group(1))].decode()
    return mangled.decode()


def section(image, name: str) -> tuple[int, int] | None:
    """(file offset, size) of an ELF64 section, or None."""
    shoff = struct.unpack_from("<Q", image, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", image, 0x3A)

    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * entsize)

    names = header(names_index)[4]
    for i in range(count):
        h = header(i)
        end = image.find(b"\0", names + h[0])
        if bytes(image[names + h[0] : end]).decode() == name:
            return h[4], h[5]
    return None


def cubins(image):
    """Each cubin of an image's .nv_fatbin: (fatbin offset, entry offset, header size, payload size, arch)."""
    found = section(image, ".nv_fatbin")
    if found is None:
        return
    pos, end = found[0], found[0] + found[1]
    while pos < end:
        magic, _, header_size, fat_size = struct.unpack_from("<IHHQ", image, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fatbins are 8-byte aligned, padding between them
            continue
        entry, fat_end = pos + header_size, pos + header_size + fat_size
        while entry < fat_end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", image, entry)
            if kind != ELF_CUBIN:
                raise SystemExit(f"fbgemm-cuda: entry kind {kind} at {entry:#x} (PTX?): not slimmed safely")
            arch = struct.unpack_from("<I", image, entry + 28)[0]
            yield pos, entry, entry_header, payload, arch
            entry += entry_header + payload
        pos = fat_end


def kernel_names(image, entry: int, entry_header: int, payload: int) -> list[str]:
    data = bytes(image[entry + entry_header : entry + entry_header + payload])
    if data[:4] == ZSTD_MAGIC:  # nvcc's compressed cubin: its exact size is in the entry header
        size = struct.unpack_from("<Q", image, entry + 16)[0]
        data = subprocess.run(["zstd", "-dc"], input=data[:size], capture_output=True, check=True).stdout
    names = {base_name(m) for m in _KERNEL.findall(data)}
    return sorted(n for n in names if not n.endswith("::EmptyKernel"))


def slim_library(path: pathlib.Path, arch: int = ARCH) -> dict[str, int]:
    """Zero, in place, every cubin but `arch`'s, and `arch`'s cubins whose
    kernels are all unused (relabelled RELABEL_ARCH, so that an `arch` device selects none)."""
    counts = {"kept": 0, "other_arch": 0, "unused": 0}
    with path.open("r+b") as f:
        image = mmap.mmap(f.fileno(), 0)
        try:
            for _, entry, entry_header, payload, entry_arch in list(cubins(image)):
                start = entry + entry_header
                if entry_arch == arch:
                    names = kernel_names(image, entry, entry_header, payload)
                    if not names or not all(unused_kernel(n) for n in names):
                        counts["kept"] += payload
                        continue
                    struct.pack_into("<I", image, entry + 28, RELABEL_ARCH)
                    counts["unused"] += payload
                else:
                    counts["other_arch"] += payload
                image[start : start + payload] = bytes(payload)
            image.flush()
        finally:
            image.close()
    return counts


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split(archive: pathlib.Path, parts_dir: pathlib.Path, part_bytes: int, extra: dict) -> dict:
    """Cut `archive` into parts_dir/pNN/<archive>.NN, each folder with the
    manifest (so any one folder can travel alone); return the manifest."""
    if parts_dir.exists():
        shutil.rmtree(parts_dir)
    size = archive.stat().st_size
    parts = []
    with archive.open("rb") as source:
        for index in range((size + part_bytes - 1) // part_bytes):
            folder = parts_dir / f"p{index:02d}"
            folder.mkdir(parents=True)
            part = folder / f"{archive.name}.{index:02d}"
            part.write_bytes(source.read(part_bytes))
            parts.append({"name": part.name, "folder": folder.name, "bytes": part.stat().st_size})
            parts[-1]["sha256"] = sha256(part)
    manifest = {"archive": archive.name, "bytes": size, "sha256": sha256(archive), "parts": parts, **extra}
    for entry in parts:
        (parts_dir / entry["folder"] / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def receive(parts_dir: pathlib.Path, store: pathlib.Path) -> dict:
    """Move the parts found under parts_dir into `store` (each checked by its
    hash; a part already in the store is kept), and once all are there, join
    them, check the whole and unpack it into store/site. Returns a report:
    {"missing": [...], "bad": [...], "site": path or None}."""
    store.mkdir(parents=True, exist_ok=True)
    manifests = sorted(parts_dir.glob(f"*/{MANIFEST}")) + sorted(store.glob(MANIFEST))
    if not manifests:
        raise SystemExit(f"fbgemm-cuda: no {MANIFEST} under {parts_dir} nor in {store}")
    manifest = json.loads(manifests[0].read_text())
    for other in manifests[1:]:
        if json.loads(other.read_text())["sha256"] != manifest["sha256"]:
            raise SystemExit(f"fbgemm-cuda: {other} is another package's manifest; empty {store} first")
    (store / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    site = store / "site"
    if (site / ".complete").exists() and (site / ".complete").read_text() == manifest["sha256"]:
        return {"missing": [], "bad": [], "site": str(site)}
    bad = []
    for entry in manifest["parts"]:
        kept, arrived = store / entry["name"], parts_dir / entry["folder"] / entry["name"]
        if kept.exists() and sha256(kept) == entry["sha256"]:
            continue
        if arrived.exists():
            if sha256(arrived) == entry["sha256"]:
                shutil.copyfile(arrived, kept)
            else:
                bad.append(entry["name"])
    missing = [e["name"] for e in manifest["parts"] if not (store / e["name"]).exists()]
    if missing or bad:
        return {"missing": missing, "bad": bad, "site": None}
    archive = store / manifest["archive"]
    with archive.open("wb") as joined:
        for entry in manifest["parts"]:
            with (store / entry["name"]).open("rb") as part:
                shutil.copyfileobj(part, joined, 1 << 20)
    if sha256(archive) != manifest["sha256"]:
        archive.unlink()
        raise SystemExit("fbgemm-cuda: the joined parts do not match the manifest's sha256")
    if site.exists():
        shutil.rmtree(site)
    with tarfile.open(archive) as tar:
        tar.extractall(site, filter="data")
    archive.unlink()
    (site / ".complete").write_text(manifest["sha256"])
    return {"missing": [], "bad": [], "site": str(site)}


def download(pin: str, dest: pathlib.Path) -> pathlib.Path:
    """The cp312 manylinux x86-64 wheel of `pin` (needs a package registry)."""
    from gpu_kit import cp312_download  # beside this script

    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([*cp312_download(dest), pin], check=True)
    name = pin.split("==")[0].replace("-", "_")
    return next(dest.glob(f"{name}-{pin.split('==')[1]}-cp312-*.whl"))


def pack(
    wheel: pathlib.Path, parts_dir: pathlib.Path, arch: int = ARCH, part_bytes: int = PART_BYTES
) -> dict:
    """Unpack `wheel`, slim each library for `arch`, pack it as tar.xz and split it."""
    if shutil.which("zstd") is None:
        raise SystemExit("fbgemm-cuda: pack needs the zstd command (nvcc's compressed cubins)")
    with tempfile.TemporaryDirectory(prefix="fbgemm-cuda-") as tmp:
        tree = pathlib.Path(tmp) / "site"
        with zipfile.ZipFile(wheel) as zipped:
            zipped.extractall(tree)
        totals = {"kept": 0, "other_arch": 0, "unused": 0}
        for library in sorted(tree.rglob("*.so")):
            for key, value in slim_library(library, arch).items():
                totals[key] += value
        archive = pathlib.Path(tmp) / ARCHIVE
        # xz with threads here; Python's lzma reads it there (the machine may lack the command)
        tar = subprocess.run(
            ["tar", "-C", str(tree), "-cf", "-", "."], capture_output=True, check=True
        ).stdout
        with archive.open("wb") as sink:
            subprocess.run(["xz", "-6", "-T0", "-c"], input=tar, stdout=sink, check=True)
        extra = {"wheel": wheel.name, "wheel_sha256": sha256(wheel), "arch": arch, "cubin_bytes": totals}
        return split(archive, parts_dir, part_bytes, extra)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/fbgemm_cuda.py", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    pack_cmd = sub.add_parser("pack", help="download the CUDA wheel, slim it, split it (needs a registry)")
    pack_cmd.add_argument("--wheel", type=pathlib.Path, help="a downloaded wheel (default: download PIN)")
    pack_cmd.add_argument("--parts", type=pathlib.Path, default=DEFAULT_PARTS)
    receive_cmd = sub.add_parser("receive", help="take the parts that arrived; unpack once all have")
    receive_cmd.add_argument("--parts", type=pathlib.Path, default=DEFAULT_PARTS)
    receive_cmd.add_argument("--store", type=pathlib.Path, required=True, help="outside the checkout")
    args = parser.parse_args(argv)
    if args.command == "pack":
        wheel = args.wheel or download(PIN, ROOT / "build" / "wheels")
        manifest = pack(wheel, args.parts)
        mib = {k: v >> 20 for k, v in manifest["cubin_bytes"].items()}
        size = manifest["bytes"] / 2**20
        print(f"fbgemm-cuda: {len(manifest['parts'])} parts, {size:.1f} MiB in {args.parts}")
        print(
            f"fbgemm-cuda: cubins (MiB): sm_{manifest['arch']} kept {mib['kept']}, unused {mib['unused']}, "
            f"other architectures {mib['other_arch']}"
        )
        return 0
    report = receive(args.parts, args.store)
    print(f"fbgemm-cuda: {json.dumps(report)}")
    return 0 if report["site"] else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
