#!/bin/bash
# Qwen Code 0.24.4 (OpenAI chat completions with tools) against specfill serve (defaults: method full), the 1.5B in bf16, logged by the proxy.
cd /work/main
M=~/.cache/specfill/models
A=/tmp/agentrun
rm -rf $A/cache10 $A/homeq10; mkdir -p $A/homeq10
(uptime; date; git -C /work/main rev-parse --short HEAD) > $A/agents10.log
.venv/bin/specfill --threads 2 serve --backend cuda --dtype bfloat16 --model $M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
  --served-model-name qwen-coder --api-key sk-local --max-tokens 4096 \
  --prompt-cache-dir $A/cache10 --port 8471 > $A/serve10.log 2>&1 &
SERVER=$!
.venv/bin/python scripts/agent_log_proxy.py --upstream http://127.0.0.1:8471 --port 8472 --log $A/run10.jsonl > $A/proxy10.log 2>&1 &
PROXY=$!
for i in $(seq 120); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8471/health -H 'Authorization: Bearer sk-local' | grep -q 200 && break; sleep 2; done
echo "server up $(date)" >> $A/agents10.log
cd $A/scratch
HOME=$A/homeq10 timeout 1500 $A/node_modules/.bin/qwen --auth-type openai --openai-api-key sk-local \
  --openai-base-url http://127.0.0.1:8472/v1 -m qwen-coder --approval-mode yolo -o json \
  "Which port does the server in /tmp/agentrun/scratch/service.toml listen on? Read /tmp/agentrun/scratch/service.toml, then answer with the port number." \
  > $A/qwen10_result.json 2> $A/qwen10_err.txt
echo "qwen rc $? $(date)" >> $A/agents10.log
kill $PROXY $SERVER; wait
echo "done $(date)" >> $A/agents10.log
