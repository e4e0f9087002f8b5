#!/bin/bash
# usage: ab.sh OUT — per row: base, branch, base, branch (thread CPU time, 1 thread, EMBER_SPEED_CHECK=0)
OUT=$1
ROWS=${ROWS:-"global_avgpool:infer squeeze_excite:infer embedding_bag_mean:infer adaptive_avgpool_7_from_30:train softmax_vocab_32000:train adaptive_maxpool_1:train sum_dim1_of_3d:train"}
for rm in $ROWS; do
  r=${rm%%:*}; m=${rm##*:}
  for rep in 1 2; do
  for TREE in /work/wt-sweep7-base /work/wt-sweep7; do
    echo -n "$(basename $TREE) " >> $OUT
    (cd $TREE && TREE=$TREE CPU_TIME=1 OMP_NUM_THREADS=1 EMBER_SPEED_CHECK=0 MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 PYTHONPATH=$TREE timeout 300 /work/main/.venv/bin/python /work/wt-sweep7/benchmarks/results/sweep4_one_cputime.py $r $m ${N:-9} 2>&1 | grep -v "^err" | tail -1) >> $OUT
  done; done
done
echo "load: $(uptime)" >> $OUT
