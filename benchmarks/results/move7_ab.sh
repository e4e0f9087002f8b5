#!/bin/bash
# A/B of op_sweep rows: main tree vs this tree, alternating processes, thread CPU time (1 thread).
# usage: move7_ab.sh REGEX ROUNDS_PER_PROC PROCS [MODE]
export EMBER_SPEED_CHECK=0 OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736
for k in $(seq "$3"); do
  for tree in /work/main /work/wt-move7; do
    echo "== $tree"
    TREE=$tree PYTHONPATH=$tree /work/main/.venv/bin/python /work/wt-move7/benchmarks/results/move7_rows.py "$2" "$1" ${4:-} 2>&1 | grep -v Warn
  done
done
