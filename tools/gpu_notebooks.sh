# Run every notebook on a CUDA machine that has no Jupyter stack (e.g. the lab's device image):
# wheels of sglang and of nbval/nbclient/ipykernel/ipywidgets and their deps in .whl/ and .whl/nb/
# (pip download --only-binary=:all: ...). Each notebook runs in cuda mode (live timings, live
# widgets) under nbval-lax: it fails on any cell error, not on numbers differing from the stored run.
# Arguments: notebooks to run (default: all).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl .whl/nb/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH MPLBACKEND=Agg
python -c "import nbval, nbclient, ipykernel, ipywidgets; print('jupyter stack ok')"
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/nb
for nb in ${@:-notebooks/0*.ipynb}; do        # default: every notebook
  n=$(basename $nb .ipynb); t0=$(date +%s)
  timeout 150 python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env --nbval-cell-timeout=140 $nb > $OUT/nb/$n.log 2>&1
  echo "$n rc=$? $(( $(date +%s) - t0 ))s $(tail -1 $OUT/nb/$n.log)" | tee -a $OUT/nb/summary.txt
done
