#!/usr/bin/env bash
# Records the shipped CPU traces (workloads/recorded/*.abt.gz) from programs nobody here wrote,
# each with `allocbench cpu --record`, then gzip-compresses them:
#   - pyperformance-xml_etree: pyperformance 1.11.0's xml_etree benchmark (CPython's ElementTree),
#     one value in process (--debug-single-value), from a venv under ~/.cache/allocbench, with
#     PYTHONMALLOC=malloc: every object is a malloc call (what a Python run that way asks of it);
#   - redis-server: Debian's redis-server (which links jemalloc: the recorder passes its calls on
#     to it) under redis-benchmark (20,000 requests of 5 commands, 50 clients, 256-byte values on
#     100,000 random keys); only the server is recorded;
#   - tokenizers-bpe: scripts/programs/tokenize_loop.py, the Hugging Face `tokenizers` library
#     (Rust, multi-threaded) training a BPE tokenizer and encoding 300 documents in batches;
#   - http-serving: scripts/programs/http_serving.py, CPython's ThreadingHTTPServer answering 3,000
#     JSON requests from 8 client threads.
# Needs: redis-server and redis-tools (Debian), python3 with venv, and a Python with `tokenizers`
# ($ALLOCBENCH_PYTHON, else python3; pip install tokenizers).
#   scripts/record_programs.sh [OUT_DIR]      (default workloads/recorded)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-workloads/recorded}
mkdir -p "$out"
bin=$(cargo build --release --message-format=json-render-diagnostics 2>/dev/null | sed -n 's/.*"executable":"\([^"]*allocbench\)".*/\1/p' | tail -1)
bin=${bin:-target/release/allocbench}
py=$(python3 -c 'import sys; print(sys.executable)')
tokpy=${ALLOCBENCH_PYTHON:-$py}
venv=${XDG_CACHE_HOME:-$HOME/.cache}/allocbench/pyperformance-1.11.0
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q pyperformance==1.11.0
fi
bench=$("$venv/bin/python" -c 'import pyperformance, os; print(os.path.join(os.path.dirname(pyperformance.__file__), "data-files/benchmarks/bm_xml_etree/run_benchmark.py"))')
record() { local name=$1; shift; "$bin" cpu --record -o "$out/$name.abt" -- "$@"; gzip -9 -n -f "$out/$name.abt"; }

PYTHONMALLOC=malloc record pyperformance-xml_etree "$venv/bin/python" "$bench" --debug-single-value

port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" cpu --record -o "$out/redis-server.abt" -- redis-server --port "$port" --save "" --appendonly no --io-threads 2 --daemonize no > "$out/.redis.log" &
recorder=$!
for _ in $(seq 100); do redis-cli -p "$port" ping > /dev/null 2>&1 && break; sleep 0.1; done
redis-benchmark -p "$port" -n 20000 -c 50 -d 256 -r 100000 -t set,get,lpush,lpop,incr -q
redis-cli -p "$port" shutdown nosave > /dev/null 2>&1 || true
wait "$recorder"
cat "$out/.redis.log" | grep -v '^[0-9]*:[CM] ' || true
rm -f "$out/.redis.log"
gzip -9 -n -f "$out/redis-server.abt"

record tokenizers-bpe "$tokpy" scripts/programs/tokenize_loop.py --docs 300
record http-serving "$py" scripts/programs/http_serving.py
ls -l "$out"
