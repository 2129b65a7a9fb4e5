# Not runnable as it is: it needs the trial's dataset and scripts (/tmp/trial-perf) and a checkout of bbc35a4 in its own venv.
# A/B: the trial's image dataset, 2 producers by hand over tcp, default environment (no OMP_NUM_THREADS):
# old = the trial's snapshot (bbc35a4, venv trial-perf), new = /work/main (system python), alternating; plus DataLoader W=2.
cd /tmp/trial-perf; export PYTHONPATH=/tmp/trial-perf; unset OMP_NUM_THREADS
for r in 1 2 3; do for tree in old new dl; do
  [ $tree = old ] && PY=/work/venvs/trial-perf/bin/python || PY=$(command -v python)
  port=$((47460 + r)); pids=()
  if [ $tree = dl ]; then
    timeout 100 $PY bench.py --ds images --sys dl --W 2 --epochs 2 --label dl --out /tmp/verify-tt/ab.jsonl > /tmp/verify-tt/logs/$tree-$r.log 2>&1
  else
    for k in 1 2; do
      timeout 100 $PY -m ferry.producer --connect tcp://127.0.0.1:$port --dataset mydata:images_bench --dataset-arg limit=960 > /tmp/verify-tt/logs/$tree-$r-$k.log 2>&1 &
      pids+=($!)
    done
    timeout 100 $PY bench.py --ds images --sys remote --port $port --epochs 2 --label $tree --out /tmp/verify-tt/ab.jsonl > /tmp/verify-tt/logs/$tree-$r.log 2>&1
    kill -TERM ${pids[@]}; wait ${pids[@]}
  fi
  echo "$tree r=$r $(grep -o '"sps": [0-9.]*' /tmp/verify-tt/logs/$tree-$r.log | tr '\n' ' ')"
done; done
