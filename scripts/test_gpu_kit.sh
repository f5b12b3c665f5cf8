#!/usr/bin/env bash
# The GPU kit's CPU test: build a stand-in for the GPU machine (Python 3.12,
# torch 2.11 and only what scripts/gpu_machine.txt lists), gather the kit
# with it, then run tests/test_gpu_kit.py, which runs the kit's command in it.
set -euo pipefail
cd "$(dirname "$0")/.."
sim=build/gpu-machine-venv
pyenv_root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
python=${PYTHON312:-}
for candidate in python3.12 "$pyenv_root"/versions/3.12*/bin/python3.12; do
  [[ -n $python ]] && break
  if "$candidate" --version >/dev/null 2>&1; then python=$candidate; fi
done
[[ -n $python ]] || { echo "test-gpu-kit: no Python 3.12 found (set PYTHON312=/path/to/python3.12)" >&2; exit 2; }
stamp="$sim/.embnb-stamp"
want=$(sha256sum scripts/gpu_machine.txt | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "test-gpu-kit: building $sim (a GPU machine's Python stack, on CPU)"
  rm -rf "$sim"
  "$python" -m venv "$sim"
  "$sim/bin/python" -m pip install -q --disable-pip-version-check -r scripts/gpu_machine.txt
  echo "$want" > "$stamp"
fi
"$sim/bin/python" scripts/gpu_kit.py gather --kit build/gpu-kit
# As in make test (scripts/run_tests.sh): OpenMP threads sleep while they wait.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
EMBNB_GPU_MACHINE_PYTHON="$sim/bin/python" "${VENV:-.venv}/bin/python" -m pytest -q -p no:cacheprovider tests/test_gpu_kit.py
