#!/bin/bash
# Claude Code 2.1.332 and Codex CLI 0.171.0 (run 9's tasks) against specfill serve (defaults: method full) after the reasoning pass-back (gpt-oss thinking) and reasoning_tokens change, the 1.5B in bf16, logged by the proxy.
cd /work/main
M=~/.cache/specfill/models
A=/tmp/agentrun
rm -rf $A/cache15 $A/home15 $A/run15.jsonl
(uptime; date; git -C /work/main rev-parse --short HEAD) > $A/agents15.log
.venv/bin/specfill --threads 2 serve --backend cuda --dtype bfloat16 --model $M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
  --served-model-name qwen-coder --served-model-pattern 'claude-*' --api-key sk-local --max-tokens 4096 \
  --prompt-cache-dir $A/cache15 --port 8471 > $A/serve15.log 2>&1 &
SERVER=$!
.venv/bin/python scripts/agent_log_proxy.py --upstream http://127.0.0.1:8471 --port 8472 --log $A/run15.jsonl > $A/proxy15.log 2>&1 &
PROXY=$!
for i in $(seq 120); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8471/health -H 'Authorization: Bearer sk-local' | grep -q 200 && break; sleep 2; done
echo "server up $(date)" >> $A/agents15.log
cd $A/scratch
HOME=$A/home15 ANTHROPIC_BASE_URL=http://127.0.0.1:8472 ANTHROPIC_AUTH_TOKEN=sk-local ANTHROPIC_MODEL=qwen-coder \
  CLAUDE_CODE_MAX_OUTPUT_TOKENS=4096 API_TIMEOUT_MS=1800000 CLAUDE_STREAM_IDLE_TIMEOUT_MS=1800000 \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 \
  timeout 1200 $A/node_modules/.bin/claude -p "Which port does the server in /tmp/agentrun/scratch/service.toml listen on? Read /tmp/agentrun/scratch/service.toml with the Read tool, then answer with the port number." \
  --model qwen-coder --allowedTools Read --output-format json > $A/claude15_result.json 2> $A/claude15_err.txt
echo "claude rc $? $(date)" >> $A/agents15.log
CODEX_HOME=$A/codexhome SPECFILL_API_KEY=sk-local timeout 900 $A/node_modules/.bin/codex exec --skip-git-repo-check \
  "Run the command \`cat service.toml\` with the exec_command tool, then tell me the port the server listens on." > $A/codex15_transcript.txt 2>&1
echo "codex rc $? $(date)" >> $A/agents15.log
kill $PROXY $SERVER; wait
echo "done $(date)" >> $A/agents15.log
