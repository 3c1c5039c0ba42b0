#!/usr/bin/env bash
# Every check that needs a real GPU, in one go, for a session that has the GPU machine.
#
#   mkdir -p .gpu && cp ../shared/gpu/capture_fixtures.py .gpu/ && echo /.gpu/ >> .git/info/exclude
#   the device lacks msgspec and plotly: download their wheels into .whl/ (the device notes say
#   how) and install them first with pip --target /tmp/site, PYTHONPATH=/tmp/site:$PWD
#   then, on the device: bash benchmarks/gpu_checks.sh "$OUT"  (carry: [".gpu", ".whl"], ~5 min)
#
# Writes each check's output to $OUT/<name>.txt and a one-line verdict per check to
# $OUT/summary.txt; one failing check does not stop the others. What each proves:
#   overhead      per-step cost of mgprof.profile on a CUDA step (target < 1 %)
#   sampler       NVML sampler CPU cost per second
#   autowrap      auto-wrap's per-call route cost against an explicit DDP on CUDA (NCCL, world 1)
#   analyze       a CUDA `mgprof analyze` of an unmodified plain script, auto-wrapped under DDP
#   analyze-dp    the DataParallel tutorial under --strategy dp (auto-wrap leaves its own DP
#                 alone when the machine has 2+ GPUs; with one GPU it must say DP does not apply)
#   compare       single vs DP vs DDP rows on CUDA, with the DP row
#   sweep         a DataLoader script swept without mgprof.batch_size(): observed == requested
#   bandwidth     `mgprof doctor --bandwidth` over NCCL (needs 2+ GPUs)
#   memory        `mgprof analyze --memory` on CUDA: allocator snapshots in memory/ (keep the
#                 small one in tests/data/gpu/ for the snapshot summary's tests) and the
#                 Memory profile section; memory-oom: the same script out of CUDA memory on
#                 purpose (HOG_CUDA_GIB): exit code 1, run.json oom, an .oom.json snapshot
#   stop          SIGTERM to a running CUDA `mgprof analyze`: exit 143, run.json `interrupted`,
#                 no process of the run alive and none left on the GPU (benchmarks/stop_check.py)
#   diff          `mgprof diff` of CUDA runs: a run against itself passes --fail-on 5% (exit 0),
#                 a 32x wider model fails it (exit 1) with GEMM kernels in the attribution
#   timeline      `mgprof timeline` of the CUDA analyze run: valid Chrome JSON, device streams as
#                 their own threads, the clock method and offsets it printed
#   noise-scale   the gradient-norm cost per CUDA DDP step (target < 1 %; 3-16 % on CPU) and a
#                 CUDA `mgprof analyze --noise-scale` with B_simple in its report
#   precision     `mgprof compare --precision fp32,bf16,fp16` of the CNN tutorial on CUDA: the
#                 bf16/fp16 rows' tensor-core share above the fp32 row's, fp16 with mgprof's
#                 GradScaler, losses "ok"; precision-amp: the AMP tutorial's own autocast and
#                 GradScaler as the labelled baseline row; with 2+ GPUs also the dp and ddp rows
#                 (DataParallel carries autocast into its replica threads)
#   fsdp          a script's own FSDP2 (fully_shard) on CUDA over NCCL: run.json grad_sync how
#                 "fsdp", training.fsdp with its units and mesh; fsdp1: the same for an FSDP1
#                 script (FullyShardedDataParallel needs an accelerator: CPU cannot test it);
#                 fsdp-trace: `mgprof trace` of that run's rank-0 trace, its per-unit/phase table
#                 read from NCCL all-gather/reduce-scatter kernels; fsdp-compare (2+ GPUs: NCCL
#                 needs a GPU per rank): `--strategies ddp,fsdp,fsdp-noreshard` on an unmodified
#                 script, CUDA memory per rank and the model state FSDP shards
#   fixtures      ../shared/gpu/capture_fixtures.py: NVML facts and small CUDA traces
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-gpu-out}}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

if ! python3 -c "import mgprof" 2>/dev/null; then
  python3 -m pip install --quiet --no-deps -e . >"$OUT/install.txt" 2>&1 \
    || python3 -m pip install --quiet --no-deps --no-build-isolation -e . >>"$OUT/install.txt" 2>&1
fi
python3 -c "import msgspec" 2>/dev/null || echo "msgspec missing: carry its wheel" >>"$SUMMARY"

check() {  # check NAME TIMEOUT_S COMMAND...
  local name="$1" limit="$2"
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" >>"$SUMMARY"
}

GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
echo "gpus visible: $GPUS" >>"$SUMMARY"

check overhead 120 python3 benchmarks/bench_overhead.py --device cuda --rounds 5 --steps 30
check sampler 60 python3 benchmarks/bench_sampler.py --seconds 3
check autowrap 120 python3 benchmarks/bench_autowrap.py --device cuda --rounds 7 --steps 40
check analyze 180 python3 -m mgprof analyze tests/scripts/plain_loop.py --gpus "$GPUS" \
  --out "$OUT/runs" --quiet --format json
check analyze-dp 180 python3 -m mgprof analyze tests/scripts/dp_tutorial.py --gpus "$GPUS" \
  --strategy dp --out "$OUT/runs" --quiet
check compare 300 python3 -m mgprof compare tests/scripts/dp_tutorial.py --gpus "$GPUS" \
  --steps 6 --out "$OUT/runs" --quiet
check sweep 240 python3 -m mgprof sweep tests/scripts/cnn_loader.py --gpus 1 \
  --batch-sizes 16,64 --steps 3 --out "$OUT/runs" --quiet --format json
check memory 180 env HOG_RANK=0 python3 -m mgprof analyze tests/scripts/memory_hog.py --gpus 1 --memory \
  --out "$OUT/memory" --quiet
check memory-oom 180 env HOG_RANK=0 HOG_OOM=1 HOG_CUDA_GIB=100000 python3 -m mgprof analyze \
  tests/scripts/memory_hog.py --gpus 1 --memory --out "$OUT/memory-oom" --quiet
check stop 180 python3 benchmarks/stop_check.py --gpus 1 --after 20
check noise-scale-cost 180 python3 benchmarks/bench_noise_scale.py --device cuda
check noise-scale 180 python3 -m mgprof analyze tests/scripts/diff_target.py --gpus "$GPUS" \
  --noise-scale --out "$OUT/runs" --quiet -- --steps 30
# shellcheck disable=SC2016
check timeline 120 bash -c 'r=$(ls -d "$0"/runs/*plain_loop* | head -1) && python3 -m mgprof timeline "$r" &&
  python3 -c "import gzip, json, sys; d = json.load(gzip.open(sys.argv[1])); ev = d[\"traceEvents\"];
bad = [e for e in ev if e.get(\"ph\") == \"X\" and not (isinstance(e.get(\"ts\"), (int, float)) and \"pid\" in e and \"tid\" in e)];
names = sorted({e[\"args\"][\"name\"] for e in ev if e.get(\"name\") == \"thread_name\"});
print(len(ev), \"events;\", len(bad), \"bad;\", names); sys.exit(1 if bad else 0)" "$r/timeline.json.gz"' "$OUT"
# shellcheck disable=SC2016
check diff 240 bash -c 'set -x; o="$0"; s=tests/scripts/diff_target.py
  python3 -m mgprof analyze $s --gpus 1 --quiet --out "$o/diff-base" || exit 3
  python3 -m mgprof analyze $s --gpus 1 --quiet --out "$o/diff-big" -- --hidden 8192 || exit 3
  python3 -m mgprof diff "$o"/diff-base/* "$o"/diff-base/* --fail-on 5% || exit 4
  python3 -m mgprof diff "$o"/diff-base/* "$o"/diff-big/* --fail-on 5%; test $? -eq 1 || exit 5
  python3 -m mgprof diff "$o"/diff-base/* "$o"/diff-big/* --json' "$OUT"
if [ "$GPUS" -ge 2 ]; then PREC_STRATEGIES=single,dp,ddp; else PREC_STRATEGIES=single; fi
check precision 300 python3 -m mgprof compare tests/scripts/cnn_loader.py --gpus "$GPUS" \
  --strategies "$PREC_STRATEGIES" --precision fp32,bf16,fp16 --steps 10 --nosync-steps 0 \
  --out "$OUT/runs" --quiet --format md
check precision-amp 180 python3 -m mgprof compare tests/scripts/amp_tutorial.py --gpus 1 \
  --strategies single --precision fp32,bf16 --steps 10 --out "$OUT/runs" --quiet --format md
# shellcheck disable=SC2016
FSDP_CHECK='import glob, json, sys; r = json.load(open(sorted(glob.glob(sys.argv[1] + "/*/run.json"))[-1]));
s = r["analysis"]["job"]["grad_sync"]; f = r["ranks"][0]["training"]["fsdp"]; print(s, f);
sys.exit(0 if f["units"] >= 2 and (s["how"] == "fsdp" or r["world_size"] == 1) else 1)'
check fsdp 180 bash -c 'python3 -m mgprof analyze tests/scripts/fsdp2_blocks.py --gpus "$1" --quiet \
  --out "$0/fsdp" -- --dim 1024 && python3 -c "$2" "$0/fsdp"' "$OUT" "$GPUS" "$FSDP_CHECK"
check fsdp1 180 bash -c 'python3 -m mgprof analyze tests/scripts/fsdp1_wrap.py --gpus "$1" --quiet \
  --out "$0/fsdp1" && python3 -c "$2" "$0/fsdp1"' "$OUT" "$GPUS" "$FSDP_CHECK"
check fsdp-trace 120 bash -c 'python3 -m mgprof trace "$(ls "$0"/fsdp/*/traces/* | head -1)"' "$OUT"
if [ "$GPUS" -ge 2 ]; then
  check fsdp-compare 420 python3 -m mgprof compare tests/scripts/plain_blocks.py --gpus 2 \
    --strategies ddp,fsdp,fsdp-noreshard --rounds 1 --steps 6 --out "$OUT/fsdp-compare" \
    -- --steps 200
else
  echo "fsdp-compare: skipped (FSDP rows need 2+ GPUs under NCCL; $GPUS visible)" >>"$SUMMARY"
fi
if [ "$GPUS" -ge 2 ]; then
  check bandwidth 180 python3 -m mgprof doctor --bandwidth --gpus "$GPUS" --sizes 1M,64M --json
else
  echo "bandwidth: skipped (NCCL needs a GPU per rank; $GPUS visible)" >>"$SUMMARY"
fi
if [ -f .gpu/capture_fixtures.py ]; then
  check fixtures 300 python3 .gpu/capture_fixtures.py "$OUT/fixtures"
else
  echo "fixtures: skipped (copy ../shared/gpu/capture_fixtures.py to .gpu/ and carry it)" >>"$SUMMARY"
fi
# keep what comes back small: traces of the runs are the bulk
find "$OUT/runs" "$OUT"/diff-* "$OUT"/fsdp* -name '*.pt.trace.json.gz' -size +2M -delete 2>/dev/null || true
cat "$SUMMARY"
