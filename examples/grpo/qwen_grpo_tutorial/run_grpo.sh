#!/bin/bash
# GRPO on one node with MindRLHF's flags: bash run_grpo.sh [workers] [extra flags...]
# Paths below are placeholders: set them (or export the variables) before running.
set -euo pipefail
WORKERS=${1:-8}
shift || true
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
MODEL_DIR=${MODEL_DIR:-/path/to/Qwen2.5-7B-Instruct}
DATA=${DATA:-/path/to/gsm8k_train.mindrecord}
CKPT_TRAIN=${CKPT_TRAIN:-/path/to/ckpt_train}
CKPT_INFER=${CKPT_INFER:-/path/to/ckpt_infer}
CKPT_FULL=${CKPT_FULL:-/path/to/qwen2_5_7b.ckpt}
SAVE=${SAVE:-./save_ckpt}
export PYTHONPATH="$ROOT:${PYTHONPATH:-}"

msrun --worker_num="$WORKERS" --local_worker_num="$WORKERS" --master_addr=127.0.0.1 --master_port=9190 \
    --join=True --log_dir=./grpo_log \
    "$ROOT/examples/grpo/qwen_grpo_tutorial/grpo_one_stage.py" \
    --config "$ROOT/examples/grpo/qwen_grpo_tutorial/grpo_config.yaml" \
    --sft_path_infer "$ROOT/model_configs/qwen_grpo/predict_qwen2_5_7b_instruct.yaml" \
    --sft_path_train "$ROOT/model_configs/qwen_grpo/finetune_qwen2_5_7b.yaml" \
    --vocab_path "$MODEL_DIR/vocab.json" --merges_file_path "$MODEL_DIR/merges.txt" \
    --mind_dataset_dir "$DATA" --save_data_file "$SAVE/grpo.mindrecord" --save_ckpt_dir "$SAVE" \
    --use_parallel True --load_sft_checkpoint_infer "$CKPT_INFER" --load_sft_checkpoint_train "$CKPT_TRAIN" \
    --load_ref_checkpoint "$CKPT_FULL" --enable_compile_cache False "$@"
