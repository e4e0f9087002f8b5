#!/bin/bash
# thread-CPU-time A/B (1 thread, EMBER_SPEED_CHECK=0, 11 paired rounds) of the rows sweep5
# changed: main 1e3e1ef ($BASE) vs the sweep5 branch ($NEW), processes alternating.
BASE=${BASE:-/tmp/sweep5/base}; NEW=${NEW:-/work/wt-sweep5}
S=/work/wt-sweep5/benchmarks/results/sweep4_one_cputime.py
for row in "gather_last infer" "gather_last train" "reflect_pad infer" "reflect_pad train"; do
  for t in base new base new; do
    tree=$BASE; [ $t = new ] && tree=$NEW
    echo -n "$t "
    (cd $tree && TREE=$tree CPU_TIME=1 OMP_NUM_THREADS=1 EMBER_SPEED_CHECK=0 EMBER_CACHE_DIR=$(mktemp -d) \
      MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 PYTHONPATH=$tree \
      /work/main/.venv/bin/python $S $row 11 2>/dev/null | grep -v "^err")
  done
done
