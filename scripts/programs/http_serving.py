"""A multi-threaded Python serving loop: the standard library's ThreadingHTTPServer (one thread per
connection) answering JSON requests from client threads in bursts, with idle gaps.

Recorded by scripts/record_programs.sh; the server's code is CPython's (http.server,
socketserver, json), this file only drives it.
    python3 http_serving.py [--requests 3000] [--clients 8] [--seed 1]
"""

import argparse
import json
import random
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cache = {}

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        # A reply that grows with the request, and a cache that keeps some of them.
        words = body["prompt"].split()
        reply = {"tokens": [w[::-1] for w in words] * body["n"], "id": body["id"]}
        if body["id"] % 7 == 0:
            Handler.cache[body["id"] % 500] = reply
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def client(port, ids, seed):
    rng = random.Random(seed)
    for i in ids:
        prompt = " ".join(f"w{rng.randrange(5000)}" for _ in range(rng.randrange(5, 200)))
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/",
            data=json.dumps({"id": i, "prompt": prompt, "n": rng.randrange(1, 8)}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req) as r:
            json.loads(r.read())
        if rng.random() < 0.02:
            time.sleep(rng.uniform(0.01, 0.05))  # an idle gap


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ids = list(range(a.requests))
    threads = [threading.Thread(target=client, args=(port, ids[c :: a.clients], a.seed + c)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.shutdown()
    print(f"served {a.requests} requests from {a.clients} client threads; {len(Handler.cache)} cached")


if __name__ == "__main__":
    main()
