#!/bin/bash
# A/B: main vs sweep3 processes alternating, each eager vs ember paired in one process
export MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 OMP_NUM_THREADS=1 EMBER_SPEED_CHECK=${EMBER_SPEED_CHECK-0}
for row in "$@"; do
  set -- $row
  for rep in 1 2; do
    for tree in /work/main /work/wt-sweep3; do
      r=$(cd $tree && PYTHONPATH=$tree /work/main/.venv/bin/python /tmp/s3/one.py $row 9 2>/dev/null | tail -1)
      echo "$(basename $tree) $rep $r"
    done
  done
  uptime
done
