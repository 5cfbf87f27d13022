# call 4 (the session's last ~290 s of device time, served 2 x H100 in call 3): Llama-3.1-8B full fine-tuning zero1 on
# 2 x H100, issue 46's 35% MFU target (measured on 2 x H200 only so far), 150 iterations, the first 40 untimed.
CALL=s4; . benchmarks/calls.sh
rec 8b-full Llama-3.1-8B full 2 liger-dp-zero1 150 40 195
logs /tmp/o/s4-run-*.txt
pack; echo "t=$(( $(date +%s) - S ))s"
