#!/usr/bin/env python3
"""acp-shim vs websocat, side by side on one acpd: cold start, relay throughput, memory.

Usage: bench/shim.sh  (builds release binaries, then runs this with their paths)
       python3 bench/shim.py ACPD SHIM AGENT [WEBSOCAT]

Measured, per relay (median of runs):
  start      process start -> `initialize` answered (daemon and agent already warm)
  stream     `session/prompt` of `stream N 64` -> its answer (N updates relayed)
  peak RSS   VmHWM of the relay process at the end of the stream
  CPU        user+sys CPU time of the relay process for the whole run (its own cost)
websocat is a bare relay: no resumption, no parsing. Its numbers are the floor.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CHUNKS = int(os.environ.get("BENCH_CHUNKS", "20000"))
RUNS = int(os.environ.get("BENCH_RUNS", "5"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Relay:
    def __init__(self, argv):
        self.t0 = time.perf_counter()
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, bufsize=0)
        self.out = self.p.stdout
        self.next_id = 0

    def request(self, method, params):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()
        return self.next_id

    def until(self, rid):
        n = 0
        while True:
            line = self.out.readline()
            if not line:
                raise RuntimeError("relay closed its stdout")
            m = json.loads(line)
            if "method" not in m and m.get("id") == rid:
                return m, n
            n += 1

    def peak_rss_kib(self):
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    def cpu_ms(self):
        with open(f"/proc/{self.p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        return ticks * 1000 / os.sysconf("SC_CLK_TCK")

    def close(self):
        self.p.stdin.close()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()


def one_run(argv):
    r = Relay(argv)
    rid = r.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    r.until(rid)
    start = time.perf_counter() - r.t0
    rid = r.request("session/new", {"cwd": "/tmp", "mcpServers": []})
    sid = r.until(rid)[0]["result"]["sessionId"]
    t = time.perf_counter()
    rid = r.request("session/prompt",
                    {"sessionId": sid, "prompt": [{"type": "text", "text": f"stream {CHUNKS} 64"}]})
    _, seen = r.until(rid)
    stream = time.perf_counter() - t
    rss = r.peak_rss_kib()
    cpu = r.cpu_ms()
    r.close()
    if seen < CHUNKS:
        raise RuntimeError(f"only {seen} updates relayed")
    return start, stream, rss, cpu


def main():
    acpd, shim, agent = sys.argv[1:4]
    websocat = sys.argv[4] if len(sys.argv) > 4 else None
    port = free_port()
    data = tempfile.mkdtemp()
    log = open(os.path.join(data, "acpd.log"), "w")
    daemon = subprocess.Popen([acpd, "serve", "--no-auth", "--listen", f"127.0.0.1:{port}",
                               "--data-dir", data, "--agent", f"s={agent}"],
                              stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        url = f"ws://127.0.0.1:{port}/acp"
        relays = {"acp-shim": [shim, url]}
        if websocat:
            relays["websocat"] = [websocat, "-t", url]
        one_run(relays["acp-shim"])  # warm the agent pool and the page cache
        results = {name: [] for name in relays}
        for _ in range(RUNS):
            for name, argv in relays.items():  # interleaved, so load hits both alike
                results[name].append(one_run(argv))
        t = time.perf_counter()
        subprocess.run([shim, "--version"], stdout=subprocess.DEVNULL, check=True)
        version_ms = (time.perf_counter() - t) * 1000
        print(f"{CHUNKS} updates of 64 bytes per stream, median of {RUNS} runs, "
              f"`acp-shim --version` {version_ms:.1f} ms")
        print(f"{'relay':10} {'start ms':>9} {'stream ms':>10} {'updates/s':>10} {'peak RSS MiB':>13} {'CPU ms':>7}")
        for name, rs in results.items():
            start = statistics.median(r[0] for r in rs) * 1000
            stream = statistics.median(r[1] for r in rs)
            rss = statistics.median(r[2] for r in rs) / 1024
            cpu = statistics.median(r[3] for r in rs)
            print(f"{name:10} {start:9.1f} {stream * 1000:10.0f} {CHUNKS / stream:10.0f} {rss:13.1f} {cpu:7.0f}")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


if __name__ == "__main__":
    main()
