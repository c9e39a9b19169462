#!/usr/bin/env bash
# The serving figures on one GPU (docs/benchmarks.md, "On one NVIDIA H200, with both readers"), on a host with CUDA's torch in
# `python3` and no package index, from the repository root, after tools/gpu_carry.sh ran where pip works:
#
#   bash tools/gpu_bench.sh [STEP...]    # each step's log in gpu-logs/, its time and figures on stdout
#
# With $OUT set (a GPU host's folder that comes back), gpu-logs/ is packed into $OUT/gpu-logs.tar after
# every step, so what ran comes back even if the call is stopped at its limit.
#
# With no steps, all but `compile`, in this order, meant as one call of a GPU host's 10 minutes (not yet
# timed whole: on one H200 the steps but the profiles and fronts took 418 s). The steps, in the order that
# matters most if time runs short:
#   setup    the carried wheels into /tmp/site; gemma3-270m and all-mpnet-base-v2 with random weights of
#            their shapes in the model cache (a forward's time does not depend on the values): once a host
#   env      the device, driver and versions
#   api      `openbook bench api --workers 1,2,4 --clients 32,256 --reader mpnet`
#   profile  py-spy's GIL samples of the api at 256 clients, and their report
#   job16    `openbook bench job` at 16 per class (trec), reader mpnet: the job's time against 60 s
#   job150   the same on clinc150 (10 per intent, 150 intents) against 3 minutes
#   fronts   `openbook bench api --workers 1 --fronts 4,8 --clients 256`
#   profile-fronts  the same with 8 fronts under py-spy --subprocesses: each process's GIL samples apart
#   store    `python -m research bench store --sizes 100000,1000000`
#   mixed    `python -m research bench mixed --tasks 2,10 --batch-size 1024`
#   compile  `openbook bench api --workers 1` with OPENBOOK_COMPILE=1 (the compile time at load)
# The hot swap and the replicas' comparison run once, in `api`. DRY=1 runs each step on the CPU with a
# stand-in or tiny settings: the plumbing, not the figures.
set -u
ROOT=$(pwd)
LOGS=$ROOT/gpu-logs
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
DRY=${DRY:-0}
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$ROOT/shared:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OPENBOOK_MODEL_CACHE=${OPENBOOK_MODEL_CACHE:-/tmp/openbook-models}
export OPENBOOK_DATA=$ROOT/.gpu/data
DEVICE=cuda
[ "$DRY" = 1 ] && DEVICE=cpu
export OPENBOOK_DEVICE=$DEVICE

openbook() { "$PY" -m services.cli "$@"; }
lab() { "$PY" -m research "$@"; }

# run NAME SECONDS COMMAND...: the command's output in $LOGS/NAME.log, its exit status and time on stdout
run() {
  local name=$1 limit=$2 started rc
  shift 2
  started=$(date +%s)
  echo "== $name (at most ${limit} s): $*" | tee "$LOGS/$name.log"
  timeout -k 10 "$limit" bash -c '"$@"' "$name" "$@" >>"$LOGS/$name.log" 2>&1
  rc=$?
  echo "rc=$rc after $(($(date +%s) - started)) s" | tee -a "$LOGS/$name.log"
  [ -n "${OUT:-}" ] && tar -C "$LOGS" -cf "$OUT/gpu-logs.tar" .
  grep -E "^(latency|throughput|freshness|workers|reader|hot swap|replicas|api workers|store of|add one|backbone|  *[0-9]+ tasks?|job|budget|gate|the served|openbook|compil|setup|torch|transformers|NVIDIA|GPU)" "$LOGS/$name.log" | head -40
}

setup() {
  if [ "$DRY" != 1 ] && [ ! -f /tmp/site/.done ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
      touch /tmp/site/.done || return 1
  fi
  local gemma=$OPENBOOK_MODEL_CACHE/gemma3-270m mpnet=$OPENBOOK_MODEL_CACHE/all-mpnet-base-v2/all-mpnet-base-v2
  if [ ! -f "$gemma/model.safetensors" ]; then
    mkdir -p /tmp/gpu-skeleton && tar -C /tmp/gpu-skeleton -xJf .gpu/gemma3-270m.tar.xz &&
      openbook prepare --backbone /tmp/gpu-skeleton/gemma3-270m --random-weights "$gemma" || return 1
  fi
  if [ ! -f "$mpnet/model.safetensors" ]; then
    mkdir -p "$OPENBOOK_MODEL_CACHE" &&
      tar -C "$OPENBOOK_MODEL_CACHE" -xzf .gpu/all-mpnet-base-v2.tar.gz &&
      "$PY" -c "
import sys, torch
from transformers import AutoConfig, AutoModel
torch.manual_seed(0)
AutoModel.from_config(AutoConfig.from_pretrained(sys.argv[1])).save_pretrained(sys.argv[1])
" "$mpnet" || return 1
  fi
  echo "setup: done"
}

env_report() {
  nvidia-smi -L 2>&1 || true
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  nproc
  "$PY" -c "
import torch, transformers, fastapi, sentence_transformers, faiss
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.version.cuda)
print('transformers', transformers.__version__, 'sentence-transformers', sentence_transformers.__version__,
      'fastapi', fastapi.__version__, 'faiss', faiss.__version__)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).multi_processor_count, 'SMs')
"
}

api_args() {  # the api bench's model: the default backbone, or a stand-in of it on a dry run
  if [ "$DRY" = 1 ]; then echo "--stand-in --requests 3"; else echo "--requests 20"; fi
}

clients() {  # the given client counts, or a few on a dry run
  if [ "$DRY" = 1 ]; then echo 4; else echo "$1"; fi
}

profile() {
  local spy=/tmp/site/bin/py-spy
  [ -x "$spy" ] || spy=py-spy
  # the api in the bench's own process (one worker), so the samples are the served path's
  # --nonblocking: sampled without pausing it, so the run keeps its pace (a paused one served a third)
  "$spy" record --nonblocking --gil --rate 200 --format raw --output "$LOGS/profile.txt" -- \
    "$PY" -m services.cli bench api $(api_args) --clients "$(clients 256)" --workers 1 --no-hot-swap &&
    lab profile-report "$LOGS/profile.txt" >"$LOGS/profile-report.txt" && gzip -f "$LOGS/profile.txt"
}

profile_fronts() {
  local spy=/tmp/site/bin/py-spy
  [ -x "$spy" ] || spy=py-spy
  "$spy" record --nonblocking --subprocesses --gil --rate 100 --format raw --output "$LOGS/profile-fronts.txt" -- \
    "$PY" -m services.cli bench api $(api_args) --clients "$(clients 256)" --workers 1 --fronts 8 --no-hot-swap &&
    lab profile-report "$LOGS/profile-fronts.txt" >"$LOGS/profile-fronts-report.txt" &&
    gzip -f "$LOGS/profile-fronts.txt"
}

job() {  # job TASK SHOTS BUDGET: one automatic training job through the service, reader mpnet
  local limit=$(($3 + 120))
  [ "$DRY" = 1 ] && limit=20
  openbook bench job --task "$1" --shots "$2" --seed 13 --reader mpnet --budget "$3" --timeout $limit \
    --out "$LOGS/jobs"
}

export ROOT LOGS PY DRY DEVICE
[ $# -gt 0 ] || set -- setup env api profile job16 job150 fronts profile-fronts store mixed
export -f openbook lab setup env_report api_args clients profile profile_fronts job

for step in "$@"; do
  case $step in
    setup) run setup 300 setup ;;
    env) run env 60 env_report ;;
    api) run api 420 openbook bench api $(api_args) --clients "$(clients 32,256)" --workers 1,2,4 --reader mpnet ;;
    profile) run profile 240 profile ;;
    fronts)
      run fronts 300 openbook bench api $(api_args) --clients "$(clients 256)" --workers 1 --fronts 4,8 --no-hot-swap
      ;;
    profile-fronts) run profile-fronts 300 profile_fronts ;;
    job16) run job16 240 job trec 16 60 ;;
    job150) run job150 360 job clinc150 10 180 ;;
    store)
      sizes=100000,1000000
      [ "$DRY" = 1 ] && sizes=1000,10000
      run store 150 lab bench store --device "$DEVICE" --sizes $sizes
      ;;
    mixed)
      batch=1024
      [ "$DRY" = 1 ] && batch=32
      run mixed 150 lab bench mixed --device "$DEVICE" --tasks 2,10 --batch-size $batch --repeats 5
      ;;
    compile) OPENBOOK_COMPILE=1 run compile 300 openbook bench api $(api_args) --clients "$(clients 256)" --workers 1 ;;
    *) echo "unknown step: $step" >&2 && exit 2 ;;
  esac
done
