# call c2: generation through the decode graphs at long caches: Llama-3.2-1B at the recipes' cache, Llama-3.1-8B at a
# 128k cache from a 60-token and a 4,000-token prompt (stock, whole-cache graph, graphs per key length)
CALL=c2; . benchmarks/calls.sh
MODES=stock,liger timeout 120 python3 -m benchmarks diag decode /tmp/o/c2-decode-1b.json 2>&1 | grep '^{'
MODEL=Llama-3.1-8B BLOCK=131072 MODES=stock,liger-whole-cache,liger timeout 240 python3 -m benchmarks diag decode \
  /tmp/o/c2-decode-8b-128k.json 2>&1 | grep '^{\|Error'
MODEL=Llama-3.1-8B BLOCK=131072 PROMPT=4000 MODES=stock,liger timeout 200 python3 -m benchmarks diag decode \
  /tmp/o/c2-decode-8b-128k-p4000.json 2>&1 | grep '^{\|Error'
echo "call wall $(( $(date +%s) - S )) s"
pack
