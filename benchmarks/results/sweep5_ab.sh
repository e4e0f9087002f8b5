#!/bin/bash
# sweep5 rows before/after: the op sweep on main (1e3e1ef, archived at $BASE) and on the sweep5
# branch ($NEW), one process after the other, alternating twice; 1 thread, EMBER_SPEED_CHECK=0.
BASE=${BASE:-/tmp/sweep5/base}; NEW=${NEW:-/work/wt-sweep5}; OUT=${OUT:-/work/wt-sweep5/benchmarks/results}
ROWS='^(gather_last|reflect_pad|adaptive_avgpool_7_from_30|bicubic_up2|bicubic_down2|channel_shuffle|index_put_assign|cat4_channels_relu|cat16_channels_relu|pad_h_relu|stack8_dim1|index_select_rows|embedding_bert|argmax_gather)$'
for r in 1 2; do
  for t in base new; do
    tree=$BASE; [ $t = new ] && tree=$NEW
    (cd $tree && OMP_NUM_THREADS=1 EMBER_SPEED_CHECK=0 MALLOC_MMAP_THRESHOLD_=4294967296 \
      MALLOC_TRIM_THRESHOLD_=68719476736 PYTHONPATH=$tree /work/main/.venv/bin/python \
      benchmarks/op_sweep.py --no-torch --rounds 7 --threads 1 --only "$ROWS" \
      --json $OUT/op_sweep_2026-12-06_sweep5_rows_${t}_run$r.jsonl > /tmp/sweep5/ab_${t}_$r.txt 2>&1)
  done
done
