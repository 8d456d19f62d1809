#!/usr/bin/env python3
# CPU per update of acpd and of acp-shim, read from /proc (utime+stime) around each prompt:
# starts target/release's acpd (SQLite, no auth) with the scripted agent, connects acp-shim,
# streams N updates of SIZE bytes REPS times and prints rate and µs of CPU per update.
#   python3 bench/cpu.py [N=200000] [SIZE=64] [REPS=3]
# PERF=FILE: `perf record --call-graph dwarf` of acpd (of acp-shim with PERF_SHIM=1) during the
# last run. LOAD=K: then K session/loads of the session, timed. NEW=K: then K sequential
# session/new, timed, with acpd's and acp-shim's CPU per session/new and acpd's RSS per live
# session; ECHO=K the same for K `_scripted/echo` (PERF then profiles these instead of the last
# run). TICK=K: then K updates, one every MS (default 10) ms, with acpd's context switches per
# update by thread (wake-ups are what a lone update costs) and each update's latency, agent
# write -> editor read (the agent stamps each chunk). METRICS=1: the journal's commit
# metrics at the end. BIN=DIR: binaries from DIR. Build first:
#   cargo build --release -p acpd -p acp-shim -p acpd-scripted-agent
import json, os, socket, subprocess, sys, time, tempfile
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
SIZE = int(sys.argv[2]) if len(sys.argv) > 2 else 64
REPS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
BIN = os.environ.get("BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release"))
PERF = os.environ.get("PERF")
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
d = tempfile.mkdtemp()
# The sessions' cwd, beside the data directory: acpd refuses one around it.
w = tempfile.mkdtemp()
acpd = subprocess.Popen([f"{BIN}/acpd", "serve", "--no-auth", "--listen", f"127.0.0.1:{port}", "--data-dir", d,
    "--agent", f"s={BIN}/acpd-scripted-agent", "--journal-max-entries", "0", "--journal-max-bytes", "0",
    "--max-requests-per-second", "0", "--max-sessions-per-principal", "0", "--max-connections", "0", "--max-connections-per-principal", "0"],
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(d + "/acpd.log", "w"),
    # No stderr line per request from the agent (acpd would log each one), as in benches/relay.
    env=dict(os.environ, ACPD_SCRIPTED_AGENT_QUIET="1"))
for _ in range(100):
    try: socket.create_connection(("127.0.0.1", port)).close(); break
    except OSError: time.sleep(0.05)
shim = subprocess.Popen([f"{BIN}/acp-shim", f"ws://127.0.0.1:{port}/acp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    env=dict(os.environ, ACPD_LOG="warn"))
nid = [0]
def send(m, p):
    nid[0] += 1
    shim.stdin.write((json.dumps({"jsonrpc": "2.0", "id": nid[0], "method": m, "params": p}) + "\n").encode()); shim.stdin.flush()
    return nid[0]
def wait(i):
    key = b'"id":%d' % i
    n = 0
    while True:
        l = shim.stdout.readline()
        if not l: raise SystemExit("eof")
        if key in l and b'"result"' in l or key in l and b'"error"' in l: return n, l
        n += 1
def io(pid):
    f = dict(l.split(": ") for l in open(f"/proc/{pid}/io").read().splitlines())
    return int(f["wchar"]), int(f["write_bytes"])
def rss(pid):
    return next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:"))
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
wait(send("initialize", {"protocolVersion": 1, "clientCapabilities": {}}))
_, l = wait(send("session/new", {"cwd": w, "mcpServers": []}))
sid = json.loads(l)["result"]["sessionId"]
perf = None
for r in range(REPS):
    if PERF and r == REPS - 1 and not (os.environ.get("NEW") or os.environ.get("ECHO")):
        perf = subprocess.Popen(["perf", "record", "-F", os.environ.get("PERF_F", "1000"), "--call-graph", "dwarf,16384", "-o", PERF, "-p", str(shim.pid if os.environ.get("PERF_SHIM") else acpd.pid)], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    c0 = cpu(acpd.pid); s0 = cpu(shim.pid); w0 = io(acpd.pid); t0 = time.time()
    n, l = wait(send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": f"stream {N} {SIZE}"}]}))
    t = time.time() - t0; c = cpu(acpd.pid) - c0; sc = cpu(shim.pid) - s0; w1 = io(acpd.pid)
    print(f"run {r}: {n} lines in {t:.3f}s = {n/t:,.0f}/s; acpd cpu {c:.2f}s = {c/n*1e6:.2f} us/update; shim {sc/n*1e6:.2f} us/update; acpd writes {(w1[0]-w0[0])/n:.0f} B/update ({(w1[1]-w0[1])/n:.0f} B to storage)", flush=True)
    if perf: perf.send_signal(2); perf.wait()
if os.environ.get("LOAD"):
    for r in range(int(os.environ["LOAD"])):
        sh = subprocess.Popen([f"{BIN}/acp-shim", f"ws://127.0.0.1:{port}/acp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, ACPD_LOG="warn"))
        shim_old = shim; shim = sh
        wait(send("initialize", {"protocolVersion": 1, "clientCapabilities": {}}))
        t0 = time.time(); n, _ = wait(send("session/load", {"sessionId": sid, "cwd": w, "mcpServers": []})); t = time.time() - t0
        print(f"load {r}: {n} lines in {t*1000:.1f} ms", flush=True)
        sh.stdin.close(); sh.wait(); shim = shim_old
# Context switches of every thread of a process, by thread id (name, count), from /proc.
def switches(pid):
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            n = sum(int(l.split()[1]) for l in open(f"/proc/{pid}/task/{t}/status") if "ctxt_switches" in l)
        except OSError:
            continue
        out[t] = (name, n)
    return out
def per_call(pid, a0, a1, k):
    per = {}
    for t, (name, n) in a1.items():
        per[name] = per.get(name, 0) + (n - a0.get(t, (name, 0))[1]) / k
    return per
for mode in ("NEW", "ECHO"):
    if not os.environ.get(mode):
        continue
    k = int(os.environ[mode])
    method, params = {
        "NEW": ("session/new", {"cwd": w, "mcpServers": [], "_meta": {"scripted": {"quiet": True}}}),
        "ECHO": ("_scripted/echo", {"n": 1}),
    }[mode]
    for phase in ("warm", "measured"):
        if PERF and phase == "measured":
            perf = subprocess.Popen(["perf", "record", "-F", os.environ.get("PERF_F", "1000"), "--call-graph", "dwarf,16384", "-o", PERF, "-p", str(shim.pid if os.environ.get("PERF_SHIM") else acpd.pid)], stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        c0 = cpu(acpd.pid); s0 = cpu(shim.pid); m0 = rss(acpd.pid); ts = []; x0 = switches(acpd.pid)
        for _ in range(k):
            t0 = time.perf_counter(); wait(send(method, params)); ts.append(time.perf_counter() - t0)
        c = cpu(acpd.pid) - c0; sc = cpu(shim.pid) - s0; m = rss(acpd.pid) - m0; ts.sort()
        per = per_call(acpd.pid, x0, switches(acpd.pid), k)
        xs = f"{sum(per.values()):.1f} (" + ", ".join(f"{name} {n:.1f}" for name, n in sorted(per.items()) if n >= 0.05) + ")"
        slow = sum(t > 0.002 for t in ts)
        print(f"{method} {phase}: p50 {ts[k//2]*1e6:.0f} us, p90 {ts[k*9//10]*1e6:.0f} us, p99 {ts[k*99//100]*1e6:.0f} us, max {ts[-1]*1e6:.0f} us, {slow} over 2 ms; acpd cpu {c/k*1e6:.0f} us, shim {sc/k*1e6:.0f} us per call; acpd RSS +{m/k:.1f} KiB per call; acpd context switches per call {xs}", flush=True)
        if perf and phase == "measured": perf.send_signal(2); perf.wait()
if os.environ.get("TICK"):
    # One update every MS ms (an LLM's pace): nothing batches, so what each update costs is
    # wake-ups. Context switches of every acpd thread and of acp-shim per update, from /proc.
    k, ms = int(os.environ["TICK"]), int(os.environ.get("MS", "10"))
    for r in range(2):
        a0 = switches(acpd.pid); s0 = switches(shim.pid); c0 = cpu(acpd.pid)
        key = b'"id":%d' % send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": f"tick {k} {ms}"}]})
        lat = []
        while True:
            l = shim.stdout.readline()
            now = time.time_ns()
            if not l: raise SystemExit("eof")
            if key in l: break
            at = l.find(b"tick ")
            if at >= 0:
                lat.append((now - int(l[at + 5:].split(b'"')[0].split()[0])) / 1e3)
        lat.sort()
        a1 = switches(acpd.pid); s1 = switches(shim.pid); c = cpu(acpd.pid) - c0
        per = per_call(acpd.pid, a0, a1, k)
        total = sum(per.values()); shim_n = (sum(n for _, n in s1.values()) - sum(n for _, n in s0.values())) / k
        detail = ", ".join(f"{name} {n:.1f}" for name, n in sorted(per.items()) if n >= 0.05)
        print(f"tick {r}: {k} updates every {ms} ms; acpd {total:.1f} context switches per update ({detail}), acp-shim {shim_n:.1f}; acpd cpu {c/k*1e6:.0f} us/update; latency p50 {lat[len(lat)//2]:.0f} us, p99 {lat[len(lat)*99//100]:.0f} us", flush=True)
if os.environ.get("METRICS"):
    import urllib.request
    m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    print("\n".join(l for l in m.splitlines() if "journal_batch_size" in l or "journal_commit_seconds_sum" in l or "journal_commit_seconds_count" in l))
shim.stdin.close(); shim.wait(); acpd.terminate(); acpd.wait()
