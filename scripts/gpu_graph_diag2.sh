for v in keepgrads keep keepgrads+keep detret+x mgc; do
  echo "=== $v"; timeout 120 python3 scripts/gpu_graph_diag2.py $v 2>&1 | grep -v "Warning\|warn" | grep -v "^  File\|^    " | tail -12
done
