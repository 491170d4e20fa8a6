#!/bin/bash
# opencode 1.18.33 (@ai-sdk/openai-compatible: Chat Completions with tools) against specfill serve (defaults: method full), the 1.5B in bf16, logged by the proxy.
cd /work/main
M=~/.cache/specfill/models
A=/tmp/agentrun
rm -rf $A/cache11 $A/run11.jsonl
(uptime; date; git -C /work/main rev-parse --short HEAD) > $A/agents11.log
.venv/bin/specfill --threads 2 serve --backend cuda --dtype bfloat16 --model $M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
  --served-model-name qwen-coder --api-key sk-local --max-tokens 4096 \
  --prompt-cache-dir $A/cache11 --port 8471 > $A/serve11.log 2>&1 &
SERVER=$!
.venv/bin/python scripts/agent_log_proxy.py --upstream http://127.0.0.1:8471 --port 8472 --log $A/run11.jsonl > $A/proxy11.log 2>&1 &
PROXY=$!
for i in $(seq 120); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8471/health -H 'Authorization: Bearer sk-local' | grep -q 200 && break; sleep 2; done
echo "server up $(date)" >> $A/agents11.log
cd $A/scratch
HOME=$A/homeoc OPENCODE_DISABLE_AUTOUPDATE=1 timeout 1500 $A/node_modules/.bin/opencode run -m specfill/qwen-coder --auto --format json \
  "Which port does the server in /tmp/agentrun/scratch/service.toml listen on? Read /tmp/agentrun/scratch/service.toml, then answer with the port number." \
  > $A/opencode11_result.jsonl 2> $A/opencode11_err.txt
echo "opencode rc $? $(date)" >> $A/agents11.log
kill $PROXY $SERVER; wait
echo "done $(date)" >> $A/agents11.log
