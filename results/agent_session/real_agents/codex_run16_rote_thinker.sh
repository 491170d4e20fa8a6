#!/bin/bash
cd "$(dirname "$0")/../../.."  # the repository root (run 16 ran from /work/main)
A=/tmp/agentrun; T=/tmp/codexthink
rm -f $T/run.jsonl
.venv/bin/specfill --threads 2 serve --backend cuda --dtype float32 --model $T/model --served-model-name qwen-coder \
  --api-key sk-local --max-tokens 64 --port 8481 > $T/serve.log 2>&1 &
SERVER=$!
.venv/bin/python scripts/agent_log_proxy.py --upstream http://127.0.0.1:8481 --port 8482 --log $T/run.jsonl > $T/proxy.log 2>&1 &
PROXY=$!
for i in $(seq 60); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8481/health -H 'Authorization: Bearer sk-local' | grep -q 200 && break; sleep 1; done
mkdir -p $T/codexhome && sed 's/8472/8482/' $A/codexhome/config.toml > $T/codexhome/config.toml
cd $A/scratch
CODEX_HOME=$T/codexhome SPECFILL_API_KEY=sk-local timeout 90 $A/node_modules/.bin/codex exec --skip-git-repo-check \
  "Run the command \`cat service.toml\` with the exec_command tool, then tell me the port." > $T/codex.txt 2>&1
echo "codex rc $?"
kill $PROXY $SERVER; wait
