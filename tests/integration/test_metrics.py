#!/usr/bin/env python3
"""psd and psworker serve Prometheus metrics: /metrics passes
`promtool check metrics`, its counters move with traffic, /healthz and
/readyz answer, other paths and methods are refused, and a bad
--metrics-listen is named.

Exits 77 (skipped) where promtool is not installed (Debian's `prometheus`;
deploy/install-deps.sh installs it)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

from pstest import check, finish, poll, reap, spawn

PSD = os.environ["PSD_BIN"]
PSW = os.environ["PSWORKER_BIN"]
def port_of(log):
    def find():
        with open(log) as f:
            m = re.search(r"metrics on \S+ \(port (\d+)\)", f.read())
        return int(m.group(1)) if m else None
    return poll(find, "the metrics port in " + log)


def get(port, path, method="GET"):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def samples(text):
    """{'name{labels}': value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def scrape_until(port, pred, what):
    """The samples of /metrics once pred(samples) holds (None past the deadline)."""
    def once():
        s = samples(get(port, "/metrics")[2])
        return s if pred(s) else None
    return poll(once, what)


def promtool_ok(text, what):
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "",
          "promtool check metrics accepts %s%s" % (what, (": " + r.stdout + r.stderr) if r.returncode
                                                   or r.stdout.strip() or r.stderr.strip() else ""))


def main(tmp):
    psd_log = os.path.join(tmp, "psd.log")
    ep = os.path.join(tmp, "ep")
    psd = spawn([PSD, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", ep,
           "--metrics-listen", "127.0.0.1:0", "--consistency", "bsp"], psd_log)
    port = port_of(psd_log)
    if not port or not poll(lambda: os.path.exists(ep), "the endpoint file"):
        return
    endpoint = open(ep).read().strip()

    status, ctype, text = get(port, "/metrics")
    check(status == 200 and ctype.startswith("text/plain; version=0.0.4"),
          "psd GET /metrics: 200, text format 0.0.4 (%d, %s)" % (status, ctype))
    promtool_ok(text, "psd's /metrics before any traffic")
    before = samples(text)
    check(before.get('psd_requests_total{op="push_pull"}') == 0, "no push-pulls counted yet")
    check(before.get("psd_live_workers") == 0, "no live workers yet")
    status, _, body = get(port, "/healthz")
    check(status == 200 and body == "ok\n", "psd /healthz: 200 ok")
    status, _, body = get(port, "/readyz")
    check(status == 200 and body == "ready: serving\n",
          "psd /readyz without replicas: 200 ready (%s %r)" % (status, body))
    check(get(port, "/metrics", "POST")[0] == 405, "POST /metrics: 405")
    check(get(port, "/nope")[0] == 404, "GET /nope: 404")

    # a worker trains through it, with its own endpoint
    w_log = os.path.join(tmp, "w.log")
    w = spawn([PSW, "--servers", endpoint, "--layers", "784,32,10", "--epochs", "1",
               "--max-steps", "300", "--test-delay-ms", "5", "--device", "cpu",
               "--metrics-listen", "127.0.0.1:0"], w_log)
    wport = port_of(w_log)
    if not wport:
        return

    first = scrape_until(wport, lambda s: s.get("psworker_steps_total", 0) >= 20,
                         "the worker's first steps")
    if not first:
        return
    wtext = get(wport, "/metrics")[2]
    promtool_ok(wtext, "psworker's /metrics while training")
    check(get(wport, "/healthz")[0] == 200, "psworker /healthz: 200")
    later = scrape_until(wport, lambda s: s["psworker_steps_total"] > first["psworker_steps_total"],
                         "the worker's step count to move")
    if later:
        check(later["psworker_sent_bytes_total"] > first["psworker_sent_bytes_total"] > 0,
              "psworker bytes sent move with training (%g -> %g)" % (
                  first["psworker_sent_bytes_total"], later["psworker_sent_bytes_total"]))
        check(later["psworker_samples_per_second"] > 0, "psworker samples/s > 0 (%g)" %
              later["psworker_samples_per_second"])
        check(0 < later["psworker_loss"] < 10, "psworker loss is a loss (%g)" % later["psworker_loss"])
    during = scrape_until(port, lambda s: s.get('psd_requests_total{op="push_pull"}', 0) > 0,
                          "psd's push-pulls to count")
    check(during and during["psd_live_workers"] == 1, "psd: 1 live worker during training")
    # the worker is on psd's host: it shares a region with it
    check(during and during.get("psd_shm_regions") == 1,
          "psd: 1 shared region bound during training (%s)" % (during or {}).get("psd_shm_regions"))
    check(w.wait(timeout=120) == 0, "the worker finished")

    after = scrape_until(port, lambda s: s.get('psd_worker_clock{worker="0"}', 0) >= 300,
                         "psd to show worker 0 at clock 300")  # published every 250 ms
    if not after:
        return
    text = get(port, "/metrics")[2]
    promtool_ok(text, "psd's /metrics after training")
    tables = [k for k in after if k.startswith("psd_table_updates_total{")]
    check(len(tables) == 4, "4 tables listed (%d)" % len(tables))
    check(all(after[k] >= 300 for k in tables), "every table took >= 300 updates")
    # the values went through the shared region, the headers through the socket
    check(after["psd_shm_received_bytes_total"] > 300 * 4 * 784 * 32,
          "psd's shared-memory bytes received cover the gradients (%g)" %
          after["psd_shm_received_bytes_total"])
    check(after["psd_shm_sent_bytes_total"] > 300 * 4 * 784 * 32,
          "psd's shared-memory bytes sent cover the weights (%g)" % after["psd_shm_sent_bytes_total"])
    check(0 < after["psd_received_bytes_total"] < 300 * 4 * 784 * 32,
          "psd bytes received are headers only (%g)" % after["psd_received_bytes_total"])
    counts = [v for k, v in after.items() if k.startswith("psd_apply_seconds_count{")]
    check(len(counts) == 4 and min(counts) >= 300, "apply histogram counted every update")
    check(after.get('psd_worker_clock{worker="0"}') == 300, "worker 0's clock is 300")
    # replies sent from the tables' memory (none here: they went through
    # the region; test_lend checks lending)
    lent = [k for k in after if k.startswith("psd_table_lent_bytes_total{")]
    check(len(lent) == 4, "lent bytes listed for 4 tables (%d)" % len(lent))
    cows = [k for k in after if k.startswith("psd_table_copies_on_write_total{")]
    check(len(cows) == 4, "copies on write listed for 4 tables (%d)" % len(cows))

    # an error reply is counted by op and code: a worker asking for the
    # same tables with other sizes
    r = subprocess.run([PSW, "--servers", endpoint, "--layers", "784,16,10", "--max-steps", "1",
                        "--device", "cpu"], capture_output=True, text=True, timeout=120)
    check(r.returncode != 0, "a worker with other layer sizes is refused")
    errs = scrape_until(
        port, lambda s: s.get('psd_error_replies_total{op="create_table",code="EEXIST"}', 0) >= 1,
        "the refusal to be counted")
    check(bool(errs), "psd_error_replies_total{op=create_table,code=EEXIST} counted it")

    psd.send_signal(signal.SIGTERM)
    check(psd.wait(timeout=60) == 0, "psd exits 0 on SIGTERM (no sanitizer or leak report)")

    # bad flags: named, nonzero exit
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    for bad, what in (("127.0.0.1", "ADDR:PORT"), ("127.0.0.1:99999", "99999"),
                      ("localhost:0", "numeric"), ("127.0.0.1:%d" % busy.getsockname()[1], "cannot listen")):
        r = subprocess.run([PSD, "--listen", "tcp://127.0.0.1:0", "--metrics-listen", bad],
                           capture_output=True, text=True, timeout=30)
        check(r.returncode != 0 and what in r.stderr,
              "psd --metrics-listen %s: refused, naming '%s' (rc %d: %s)" % (
                  bad, what, r.returncode, r.stderr.strip()[-200:]))


if __name__ == "__main__":
    if shutil.which("promtool") is None:
        print("promtool not installed (Debian package prometheus): skipped")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="pstest-metrics.")
    try:
        main(tmp)
    finally:
        reap()
    finish(tmp)
