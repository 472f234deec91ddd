# The arguments of every training recipe (sourced by them, not run):
#
#   bash <model>/training/<PRECISION>/<recipe>.sh [WORKSPACE [DATA_DIR [FLAGS ...]]]
#
# Sets WORKSPACE (default ./), DATA_DIR (default /imagenet) and PYTHON, and shifts WORKSPACE and DATA_DIR
# off "$@", so that the recipe can put the remaining main.py FLAGS last, where they win over the preset.
# PYTHON is the environment's PYTHON when set, else the repository's .venv/bin/python when it exists
# (the one `make` creates), else python3. Expects REPO, the repository root.

WORKSPACE=${1:-./}
DATA_DIR=${2:-/imagenet}
# A flag in their place would be taken for a folder and the run would start on the wrong data.
if [[ "${WORKSPACE}" == -* || "${DATA_DIR}" == -* ]]; then
    echo "error: give WORKSPACE and DATA_DIR before any main.py flag: $0 WORKSPACE DATA_DIR [FLAGS ...]" >&2
    exit 2
fi
shift $(( $# < 2 ? $# : 2 ))

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "${REPO}/.venv/bin/python" ]]; then
        PYTHON="${REPO}/.venv/bin/python"
    else
        PYTHON=python3
    fi
fi
