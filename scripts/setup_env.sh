#!/usr/bin/env bash
# Creates or updates $VENV with one end of the supported stack range.
# Idempotent: a stamp holds the hash of everything that decides the install,
# so a second call is a no-op.
# Usage: [STACK=pinned|min|top] scripts/setup_env.sh [cpu|cuda|auto]
#   (fbgemm build: default auto, or $EMBNB_FBGEMM)
set -euo pipefail
cd "$(dirname "$0")/.."

# The supported range. fbgemm's .so loads only against its own torch minor
# (1.6 with 2.11, 1.8 with 2.13, 1.9 with 2.14); torchrec follows fbgemm.
# pinned is the default (the local CPU torch wheel installs in seconds); top is
# what `pip install torchrec` users get today (PyPI's torch 2.14.1 is a CUDA
# build that runs on CPU: a ~5 GB venv); min is the GPU machines' stack.
PINNED_TORCH_PIN="torch==2.13.0"
PINNED_FBGEMM_CPU_PIN="fbgemm-gpu-cpu==1.8.0"
PINNED_FBGEMM_CUDA_PIN="fbgemm-gpu==1.8.0"
PINNED_TORCHREC_PIN="torchrec==1.8.0"
MIN_TORCH_PIN="torch==2.11.0"
MIN_FBGEMM_CPU_PIN="fbgemm-gpu-cpu==1.6.0"
MIN_FBGEMM_CUDA_PIN="fbgemm-gpu==1.6.0"
MIN_TORCHREC_PIN="torchrec==1.6.1"
TOP_TORCH_PIN="torch==2.14.1"
TOP_FBGEMM_CPU_PIN="fbgemm-gpu-cpu==1.9.0"
TOP_FBGEMM_CUDA_PIN="fbgemm-gpu==1.9.0"
TOP_TORCHREC_PIN="torchrec==1.9.2"

STACK=${STACK:-pinned}
case $STACK in
  pinned) prefix=PINNED ;;
  min) prefix=MIN ;;
  top) prefix=TOP ;;
  *) echo "setup: STACK='$STACK' is not one of pinned, min, top" >&2; exit 2 ;;
esac
TORCH_PIN=${prefix}_TORCH_PIN; TORCH_PIN=${!TORCH_PIN}
FBGEMM_CPU_PIN=${prefix}_FBGEMM_CPU_PIN; FBGEMM_CPU_PIN=${!FBGEMM_CPU_PIN}
FBGEMM_CUDA_PIN=${prefix}_FBGEMM_CUDA_PIN; FBGEMM_CUDA_PIN=${!FBGEMM_CUDA_PIN}
TORCHREC_PIN=${prefix}_TORCHREC_PIN; TORCHREC_PIN=${!TORCHREC_PIN}

# A python that runs: pyenv's shim for a version that is not selected exists
# but fails, so try the versions pyenv holds as well.
find_python() {
  local candidate
  for candidate in "$@"; do
    if "$candidate" --version >/dev/null 2>&1; then echo "$candidate"; return; fi
  done
}
if [[ $STACK == min ]]; then
  default_venv=.venv-min
  pyenv_root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  default_python=$(find_python python3.12 "$pyenv_root"/versions/3.12*/bin/python3.12)
elif [[ $STACK == top ]]; then
  default_venv=.venv-top
  default_python=python3
else
  default_venv=.venv
  default_python=python3
fi
PYTHON=${PYTHON:-$default_python}
VENV=${VENV:-$default_venv}
if [[ -z $PYTHON ]] || ! "$PYTHON" --version >/dev/null 2>&1; then
  echo "setup: no working Python for the $STACK stack (${PYTHON:-python3.12 not found}); set PYTHON=/path/to/python" >&2
  exit 2
fi
variant=${1:-${EMBNB_FBGEMM:-auto}}
if [[ $variant == auto ]]; then
  # A CUDA GPU is usable when nvidia-smi lists at least one.
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    variant=cuda
  else
    variant=cpu
  fi
fi
case $variant in
  cpu) fbgemm_pin=$FBGEMM_CPU_PIN ;;
  cuda) fbgemm_pin=$FBGEMM_CUDA_PIN ;;
  *) echo "setup: EMBNB_FBGEMM='$variant' is not one of auto, cpu, cuda" >&2; exit 2 ;;
esac

stamp="$VENV/.embnb-stamp"
want=$( { echo "$variant $STACK"; "$PYTHON" --version 2>&1; cat "$0" requirements.txt pyproject.toml; } | sha256sum | cut -d' ' -f1)
# The native extension, once per host and source change: plan() never builds
# it. Without it (no compiler, say) embnb runs its Python versions, so a failed
# build is a message here, not a failed setup.
build_native() {
  "$VENV/bin/python" -m embnb.cuda build ||
    echo "setup: embnb runs its Python versions until \`$VENV/bin/python -m embnb.cuda build\` succeeds" >&2
}
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  build_native
  exit 0
fi

echo "setup: building $VENV ($STACK stack, $variant fbgemm); takes a few minutes the first time"
rm -f "$stamp"
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
# torch first, so nothing later can pull another torch build.
"${pip[@]}" "$TORCH_PIN"
"${pip[@]}" "$fbgemm_pin" -r requirements.txt "$TORCH_PIN"
# The other fbgemm build may linger from an earlier variant; both own fbgemm_gpu/.
other=$([[ $variant == cpu ]] && echo fbgemm-gpu || echo fbgemm-gpu-cpu)
if "$VENV/bin/python" -m pip show -q "$other" >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip uninstall -q -y "$other"
  "${pip[@]}" --force-reinstall --no-deps "$fbgemm_pin"
fi
"${pip[@]}" --no-deps "$TORCHREC_PIN"
"${pip[@]}" --no-deps -e .
# The notebooks' "python3" kernel must be this environment's python.
"$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (embnb)" >/dev/null

if ! "$VENV/bin/python" - <<'PY'
import torch, fbgemm_gpu, torchrec  # noqa: F401  fbgemm_gpu registers torch.ops.fbgemm
assert hasattr(torch.ops.fbgemm, "block_bucketize_sparse_features"), "fbgemm op missing"
print(f"setup: torch {torch.__version__}, torchrec {torchrec.__version__}, fbgemm ops loaded")
PY
then
  cat >&2 <<MSG
setup: the stack does not load (see the error above). What to do:
  - a CUDA machine whose fbgemm-gpu does not load: EMBNB_FBGEMM=cpu make setup
  - a half-finished or stale install: rm -rf $VENV && make setup
  - torch, fbgemm and torchrec must stay at $TORCH_PIN, $fbgemm_pin, $TORCHREC_PIN
MSG
  exit 1
fi
echo "$want" > "$stamp"
build_native
