# call c2: bisect c1's capture failure after the uncaptured first micro-batch (graphs.EAGER_FIRST)
CALL=c2; . benchmarks/calls.sh
# (the probe left the tree after c3: git show d5ea352:benchmarks/results/h200-2026-11-29f/scripts/eager_first_probe.py)
P=benchmarks/results/h200-2026-11-29f/scripts/eager_first_probe.py
for v in "" "DROPOUT=0" "GEMM_INTO_GRAD=0" "LAYERS=2" "FULL=1" "EAGER_FIRST=0"; do
  echo "== $v"; env $v CUDA_LAUNCH_BLOCKING=0 timeout 90 python3 $P 2>&1 | grep -v Warning | tail -45
done
echo "call wall $(( $(date +%s) - S )) s"
pack
