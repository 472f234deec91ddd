# The arguments of every training recipe and inference script (sourced by them, not run):
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

# inference_sweep MODEL PRECISION PLATFORM "BATCH ..." [FLAGS ...]: the inference scripts' sweep, one
# benchmark_inference run of launch.py per batch size on 8 processes, each writing raport_<batch>.json to
# WORKSPACE; FLAGS come last, so they win (a -b among them sets the batch of every run).
inference_sweep() {
    local model=$1 precision=$2 platform=$3 batches=$4 batch
    shift 4
    for batch in ${batches}; do
        "${PYTHON}" "${REPO}/multiproc.py" --nproc_per_node 8 --log_dir "${WORKSPACE}" \
            "${REPO}/launch.py" --model "${model}" --precision "${precision}" --mode benchmark_inference \
            --platform "${platform}" "${DATA_DIR}" -b "${batch}" --workspace "${WORKSPACE}" \
            --raport-file "raport_${batch}.json" "$@"
    done
}
