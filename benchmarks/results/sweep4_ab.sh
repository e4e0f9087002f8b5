#!/bin/bash
# before (ea8bc08 export) vs after (branch), same rows, one tree after the other, no torch.compile
export OMP_NUM_THREADS=1
ROWS='^(bilinear_up2|bilinear_up2_align|bilinear_down2|bicubic_up2|nearest_up2|nearest_down2|nearest_up2_cat_fpn|gather_last|adaptive_avgpool_7_from_30|reflect_pad|channel_shuffle|index_put_assign)$'
for tree in /tmp/sweep4/base /work/wt-sweep4; do
  n=$( [ $tree = /work/wt-sweep4 ] && echo after || echo before )
  uptime
  (cd $tree && EMBER_SPEED_CHECK=0 PYTHONPATH=$tree /work/main/.venv/bin/python benchmarks/op_sweep.py --no-torch --rounds 7 --threads 1 --only "$ROWS" --json /tmp/sweep4/ab_$n.jsonl > /tmp/sweep4/ab_$n.txt 2>&1)
done
uptime
(cd /work/wt-sweep4 && PYTHONPATH=/work/wt-sweep4 /work/main/.venv/bin/python benchmarks/op_sweep.py --no-torch --rounds 5 --threads 1 --only '^(bilinear_up2|bilinear_up2_align|gather_last|adaptive_avgpool_7_from_30|reflect_pad|channel_shuffle|index_put_assign)$' --json /tmp/sweep4/ab_after_speedcheck_on.jsonl > /tmp/sweep4/ab_after_speedcheck_on.txt 2>&1)
uptime
