#!/usr/bin/env python3
"""deploy/slurm/psd.sbatch, run as Slurm would run it, on this host: a
stand-in srun starts each step's tasks with SLURM_PROCID, SLURM_NTASKS
and SLURMD_NODENAME set as for a block distribution over two "nodes",
127.0.0.1 and 127.0.0.2 (both loopback), and a stand-in scontrol names
them. The script's own commands are unchanged: 2 shards from --shard auto
(PSD_SHARD from SLURM_PROCID), 2 workers from --rank auto --workers auto,
the export, and the shards' checkpoints at SIGTERM.

Not exercised: Slurm itself (its scheduling, --overlap, real nodes)."""
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile

from pstest import check, failures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SRUN = r'''#!/usr/bin/env python3
import os, signal, subprocess, sys
args, opts = sys.argv[1:], {}
while args and args[0].startswith("--"):
    a = args.pop(0)[2:]
    if "=" in a:
        k, v = a.split("=", 1)
    elif a == "overlap":
        k, v = a, "1"
    else:
        k, v = a, args.pop(0)
    opts[k] = v
n = int(opts.get("ntasks", os.environ["SLURM_NTASKS"]))
nodes = os.environ["PSD_TEST_NODES"].split()
nn = int(opts.get("nodes", len(nodes)))
procs = []
for i in range(n):
    env = dict(os.environ, SLURM_PROCID=str(i), SLURM_NTASKS=str(n),
               SLURMD_NODENAME=nodes[i * nn // n])
    procs.append(subprocess.Popen(args, env=env))
signal.signal(signal.SIGTERM, lambda *_: [p.send_signal(signal.SIGTERM) for p in procs])
sys.exit(max(p.wait() for p in procs))
'''

SCONTROL = r'''#!/bin/sh
[ "$1 $2" = "show hostnames" ] || { echo "scontrol stand-in: $*" >&2; exit 2; }
for n in $PSD_TEST_NODES; do echo "$n"; done
'''


def free_port():
    for _ in range(20):
        a, b = socket.socket(), socket.socket()
        try:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            b.bind(("127.0.0.2", port))
            return port
        except OSError:
            continue
        finally:
            a.close()
            b.close()
    return None


def main(tmp):
    bins = os.path.join(tmp, "bin")
    os.makedirs(bins)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        p = os.path.join(bins, name)
        open(p, "w").write(text)
        os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR)
    for var in ("PSD_BIN", "PSWORKER_BIN", "PSCTL_BIN"):  # psd, psworker, psctl on PATH
        os.symlink(os.environ[var], os.path.join(bins, os.path.basename(os.environ[var])))
    port = free_port()
    if port is None:
        print("no port free on both 127.0.0.1 and 127.0.0.2: skipped")
        return 77
    ckpt = os.path.join(tmp, "ckpt")
    env = dict(os.environ, PATH=bins + os.pathsep + os.environ["PATH"], SLURM_JOB_ID="42",
               SLURM_JOB_NUM_NODES="2", SLURM_NTASKS="2", SLURM_JOB_NODELIST="127.0.0.[1-2]",
               PSD_TEST_NODES="127.0.0.1 127.0.0.2", PSD_PORT=str(port), PSD_CKPT=ckpt,
               PSD_EPOCHS="1", PSWORKER_ARGS="--max-steps 30 --device cpu --batch 32 --timeout-ms 20000")
    for v in ("RANK", "WORLD_SIZE", "JOB_COMPLETION_INDEX", "PSD_SHARD", "PSD_WORKERS"):
        env.pop(v, None)
    r = subprocess.run(["bash", os.path.join(ROOT, "deploy", "slurm", "psd.sbatch")], env=env,
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    check(r.returncode == 0, "psd.sbatch ends with status 0 (%d)" % r.returncode)
    if r.returncode != 0:
        print(out[-4000:])
    check("shard 0 of 2" in out and "shard 1 of 2" in out,
          "the two shards took shards 0 and 1 from SLURM_PROCID")
    check("rank 0 of 2" in out and "rank 1 of 2" in out,
          "the two workers took ranks 0 and 1 of 2 from SLURM_PROCID and SLURM_NTASKS")
    check(out.count("done: 30 steps") == 2, "both workers took their 30 steps")
    model = ckpt + "-model.safetensors"
    check(os.path.exists(model) and os.path.getsize(model) > 200000,
          "the export wrote the model (%s)" % model)
    for i in range(2):
        d = os.path.join(ckpt, str(i))
        files = os.listdir(d) if os.path.isdir(d) else []
        check(any(f.startswith("shard-%d-of-2-" % i) for f in files),
              "shard %d left a checkpoint at SIGTERM (%s)" % (i, files))
    return 0


if __name__ == "__main__":
    tmp = tempfile.mkdtemp(prefix="pstest-slurm.")
    try:
        code = main(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if code == 77:
        sys.exit(77)
    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    sys.exit(1 if failures else 0)
