#!/bin/bash
# thread-CPU-time A/B of op-sweep rows (1 thread, EMBER_SPEED_CHECK=0, 9 paired eager/ember rounds
# per process): main 902c7a4 (/work/main) vs the sweep6 branch, processes alternating base/new/base/new.
S=/work/wt-sweep6/benchmarks/results/sweep4_one_cputime.py
for row in "$@"; do
  for t in base new base new; do
    tree=/work/main; [ $t = new ] && tree=/work/wt-sweep6
    echo -n "$t "
    (cd $tree && TREE=$tree CPU_TIME=1 OMP_NUM_THREADS=1 EMBER_SPEED_CHECK=0 EMBER_CACHE_DIR=$(mktemp -d) \
      MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 PYTHONPATH=$tree \
      timeout 300 /work/main/.venv/bin/python $S $row 9 2>/dev/null | grep -v "^err")
  done
done
