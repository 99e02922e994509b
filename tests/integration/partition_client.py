#!/usr/bin/env python3
"""A client of tests/integration/test_partition.py: pushes 1.0 into table
"w" (asp, sgd, lr 1: each applied push takes 1 off) one at a time until
the file STOP exists, and writes a line per push: "ok ENDPOINT" with the
replica that acknowledged it, or "err TEXT". Run inside a namespace."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "worker", "python"))
import numpy as np  # noqa: E402
import psd  # noqa: E402

servers, rank, out, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
c = psd.Client(servers, rank=rank, workers=2, timeout_ms=20000)
c.create_table("w", 1, optimizer="sgd", lr=1.0)
one = np.ones(1, np.float32)
with open(out, "w", buffering=1) as f:
    f.write("ready\n")
    while not os.path.exists(stop):
        try:
            c.push("w", one).wait(3000)
            f.write("ok %s %.3f\n" % (c.endpoint(), time.time()))
        except psd.Error as e:
            f.write("err %s\n" % str(e).replace("\n", " "))
        time.sleep(0.01)
c.close()
