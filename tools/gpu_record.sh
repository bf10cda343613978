#!/usr/bin/env bash
# The recorded GPU run in one device call: checks, stage timings, sweeps and the indexer
# (python -m dsv4lab record), the GPU-marked tests, and the experiments named on the command line
# (each `experiments/<name>/run.py OUT.json`). Everything lands in $OUT/run/ and one $OUT/run.tgz.
# Needs: torch + triton with a CUDA GPU; sglang's two kernel files on PYTHONPATH (see README).
#   bash tools/gpu_record.sh [record parts...] -- [experiment names...]
set -uo pipefail
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
OUT=${OUT:-/tmp/out}; R=$OUT/run; mkdir -p $R/h200 $R/exp
parts=(); exps=(); seen=0
for a in "$@"; do if [ "$a" = "--" ]; then seen=1; elif [ $seen = 0 ]; then parts+=("$a"); else exps+=("$a"); fi; done
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $R/summary.txt; }
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" | tee $R/summary.txt
(command -v compute-sanitizer && command -v ncu && uname -r) >> $R/summary.txt 2>&1
if [ ${#parts[@]} -gt 0 ]; then
  stamp "record ${parts[*]}"
  timeout 420 python3 -m dsv4lab record --out $R/h200 --only ${parts[@]} > $R/h200/record.log 2>&1; stamp "record rc=$?"
fi
for e in "${exps[@]}"; do
  case $e in
    # only the modules holding GPU-marked tests: the GPU image lacks the notebook/browser test deps
    pytest-gpu) timeout 240 python3 -m pytest -m gpu $(grep -l "pytest.mark.gpu" tests/test_*.py) -q \
                  -p no:cacheprovider > $R/exp/pytest_gpu.log 2>&1 ;;
    *.sh) timeout 300 bash experiments/${e%%/*}/run.sh $R/exp/${e%%/*} > $R/exp/${e%%/*}.log 2>&1 ;;
    *) timeout 300 python3 experiments/$e/run.py $R/exp/$e.json > $R/exp/$e.log 2>&1 ;;
  esac
  stamp "$e rc=$?"
done
tail -n 3 $R/exp/*.log 2>/dev/null | tail -n 40
tar czf $OUT/run.tgz -C $OUT run && stamp "packed $(du -h $OUT/run.tgz | cut -f1)"
cat $R/summary.txt
