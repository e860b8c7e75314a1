#!/usr/bin/env bash
# Launch a Python entry point on several processes with msrun, with MindFormers' argument order.
#
# Single node:  bash scripts/msrun_launcher.sh "run_mindformer.py --config X.yaml" \
#                   [WORKER_NUM=8] [MASTER_PORT=8118] [LOG_DIR=output/msrun_log] [JOIN=False] [CLUSTER_TIME_OUT=7200]
# Multi node:   bash scripts/msrun_launcher.sh "run_mindformer.py --config X.yaml" \
#                   WORKER_NUM LOCAL_WORKER MASTER_ADDR MASTER_PORT NODE_RANK LOG_DIR JOIN CLUSTER_TIME_OUT
# Environment (single node): MAX_RESTARTS=N restarts a failed run_mindformer.py job from its latest
# checkpoint up to N times; HEARTBEAT_TIMEOUT=S ends a job whose ranks finish no step for S seconds
# (unset: the job's runner_config.max_restarts, default 0, and runner_config.heartbeat_timeout, 600). The job runs under the supervisor (python -m mindformers_core.training.supervisor):
# a dead or stalled rank is named within seconds and the exit code is the job's (130 on Ctrl-C).
set -euo pipefail

usage() {
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
fail() { echo "msrun_launcher.sh: $*" >&2; exit 2; }
is_int() { [[ "$1" =~ ^[0-9]+$ ]]; }

[ $# -ge 1 ] || usage
# The command string is split as the shell splits a command line (MindFormers evals it), so quoted
# arguments stay one argument: "run_mindformer.py --predict_data 'I love Beijing, because'".
eval "COMMAND=($1)" 2>/dev/null || fail "cannot split the command string (unbalanced quotes?): $1"
[ ${#COMMAND[@]} -ge 1 ] || fail "the first argument must be the script and its arguments, e.g. \"run_mindformer.py --config configs/llama_tiny.yaml\""
SCRIPT="${COMMAND[0]}"
[ -f "$SCRIPT" ] || fail "script '$SCRIPT' not found (first word of \"$1\")"
shift

if [ $# -le 5 ]; then
  WORKER_NUM=${1:-8}; LOCAL_WORKER=$WORKER_NUM; MASTER_ADDR=127.0.0.1; MASTER_PORT=${2:-8118}
  NODE_RANK=0; LOG_DIR=${3:-output/msrun_log}; JOIN=${4:-False}; CLUSTER_TIME_OUT=${5:-7200}
elif [ $# -eq 8 ]; then
  WORKER_NUM=$1; LOCAL_WORKER=$2; MASTER_ADDR=$3; MASTER_PORT=$4; NODE_RANK=$5
  LOG_DIR=$6; JOIN=$7; CLUSTER_TIME_OUT=$8
else
  fail "got $# arguments after the command; give at most 5 (single node) or exactly 8 (multi node)"
fi

is_int "$WORKER_NUM" && [ "$WORKER_NUM" -ge 1 ] || fail "WORKER_NUM='$WORKER_NUM' must be a positive integer"
is_int "$LOCAL_WORKER" && [ "$LOCAL_WORKER" -ge 1 ] && [ "$LOCAL_WORKER" -le "$WORKER_NUM" ] \
  || fail "LOCAL_WORKER='$LOCAL_WORKER' must be an integer in [1, WORKER_NUM=$WORKER_NUM]"
is_int "$MASTER_PORT" && [ "$MASTER_PORT" -ge 1024 ] && [ "$MASTER_PORT" -le 65535 ] \
  || fail "MASTER_PORT='$MASTER_PORT' must be a port in [1024, 65535]"
is_int "$NODE_RANK" || fail "NODE_RANK='$NODE_RANK' must be a non-negative integer"
[[ "$JOIN" == "True" || "$JOIN" == "False" ]] || fail "JOIN='$JOIN' must be True or False"
[[ "$CLUSTER_TIME_OUT" =~ ^-?[0-9]+$ ]] || fail "CLUSTER_TIME_OUT='$CLUSTER_TIME_OUT' must be an integer (seconds)"

# msrun starts workers with `python`: make it this environment's interpreter
HERE="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$HERE/.venv/bin/python" ] && export PATH="$HERE/.venv/bin:$PATH"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"      # as MindFormers' launcher: the repository importable

MAX_RESTARTS_GIVEN=${MAX_RESTARTS:-0}
if [ "$WORKER_NUM" = 1 ] && [ "$LOCAL_WORKER" = 1 ] && [ "$MAX_RESTARTS_GIVEN" = 0 ]; then
  # One worker: plain python, no msrun (MindFormers' launcher stops here and asks for python instead)
  echo "1 worker: running it with python, without msrun"
  PY=python
  [ -x "$HERE/.venv/bin/python" ] && PY="$HERE/.venv/bin/python"
  exec "$PY" "${COMMAND[@]}"
fi
command -v msrun >/dev/null || fail "msrun not found: run 'make test' or 'make demo' once to create .venv"

# unset: the supervisor takes the job's runner_config.max_restarts / heartbeat_timeout
SUPERVISOR_FLAGS=()
if [ -n "${MAX_RESTARTS:-}" ]; then
  is_int "$MAX_RESTARTS" || fail "MAX_RESTARTS='$MAX_RESTARTS' must be a non-negative integer"
  SUPERVISOR_FLAGS+=(--max_restarts "$MAX_RESTARTS")
fi
if [ -n "${HEARTBEAT_TIMEOUT:-}" ]; then
  [[ "$HEARTBEAT_TIMEOUT" =~ ^[0-9]+([.][0-9]+)?$ ]] && [ "$HEARTBEAT_TIMEOUT" != 0 ] \
    || fail "HEARTBEAT_TIMEOUT='$HEARTBEAT_TIMEOUT' must be a number of seconds > 0"
  SUPERVISOR_FLAGS+=(--heartbeat_timeout "$HEARTBEAT_TIMEOUT")
fi

mkdir -p "$LOG_DIR"
echo "msrun: $WORKER_NUM worker(s), $LOCAL_WORKER on this node (rank $NODE_RANK), master $MASTER_ADDR:$MASTER_PORT, logs in $LOG_DIR"
if [ "$LOCAL_WORKER" != "$WORKER_NUM" ]; then   # multi node: msrun itself (no supervisor across nodes)
  [ "${MAX_RESTARTS:-0}" = 0 ] || fail "MAX_RESTARTS=$MAX_RESTARTS: restarts are supervised on one node only"
  exec msrun --worker_num="$WORKER_NUM" --local_worker_num="$LOCAL_WORKER" --master_addr="$MASTER_ADDR" \
    --master_port="$MASTER_PORT" --node_rank="$NODE_RANK" --log_dir="$LOG_DIR" --join="$JOIN" \
    --cluster_time_out="$CLUSTER_TIME_OUT" "${COMMAND[@]}"
fi
PYTHON=python
[ -x "$HERE/.venv/bin/python" ] && PYTHON="$HERE/.venv/bin/python"
SUPERVISOR=("$PYTHON" -m mindformers_core.training.supervisor --workers "$WORKER_NUM" --master_addr "$MASTER_ADDR"
  --master_port "$MASTER_PORT" --log_dir "$LOG_DIR" --cluster_time_out "$CLUSTER_TIME_OUT"
  "${SUPERVISOR_FLAGS[@]}" -- "${COMMAND[@]}")
if [ "$JOIN" = "True" ]; then
  exec "${SUPERVISOR[@]}"
fi
rm -f "$LOG_DIR/exit_status"
nohup bash -c '"$@" > "$0/supervisor.log" 2>&1; echo $? > "$0/exit_status"' "$LOG_DIR" "${SUPERVISOR[@]}" \
  > /dev/null 2>&1 &
echo "running in the background (JOIN=False): follow it with 'tail -f $LOG_DIR/supervisor.log $LOG_DIR/worker_0.log';"
echo "its exit status (0 = success) will be in $LOG_DIR/exit_status when it ends"
