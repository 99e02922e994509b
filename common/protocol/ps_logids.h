/* Every log line's id, its level and what it says: the one list. PS_LOG
 * takes an id from here (an id not listed does not compile), and the
 * table in deploy/README.md is generated from it (meson compile -C build
 * logids-doc; a test checks the two agree). S: psd, W: psworker. An id
 * names one message; ids are stable across versions: add, never reuse. */
#ifndef PS_LOGIDS_H
#define PS_LOGIDS_H

#define PS_LOG_IDS(X)                                                                                  \
    X(S0001, ERROR, "--apply-threads: cannot start the helper thread: …")                              \
    X(S0002, ERROR, "psd could not start listening (the reason)")                                      \
    X(S0003, ERROR, "--endpoint-file: cannot write '…'")                                               \
    X(S0004, ERROR, "the checkpoint could not be restored (the reason)")                               \
    X(S0005, ERROR, "--checkpoint-dir: cannot create '…': …")                                          \
    X(S0006, ERROR, "psd could not start (the reason)")                                                \
    X(S0007, ERROR, "out of memory at start")                                                          \
    X(S0008, ERROR, "a replica could not start (--etcd, --advertise; the reason)")                     \
    X(S0010, INFO, "shard … of … listening on … (version, consistency, workers)")                      \
    X(S0011, INFO, "CURVE on: … client key(s) admitted")                                               \
    X(S0012, INFO, "metrics on … (port …): GET /metrics, /healthz, /readyz")                           \
    X(S0013, INFO, "clients on this host may use …")                                                   \
    X(S0014, INFO, "every thread runs on CPUs … (--cpus)")                                             \
    X(S0015, INFO, "a replica of shard … as … (etcd …, keys under …, lease … s)")                      \
    X(S0016, INFO, "file descriptors: … (about that many connections; ulimit -n, LimitNOFILE=)")       \
    X(S0020, INFO, "signal …: shutting down")                                                          \
    X(S0021, INFO, "stopped after … requests (… errors)")                                              \
    X(S0030, INFO, "SIGHUP: an option that may change live changed (its old and new value)")           \
    X(S0031, ERROR, "SIGHUP: config not reloaded, nothing changed: …")                                 \
    X(S0032, WARN, "SIGHUP: … changed, which takes a restart; kept as it was")                         \
    X(S0033, INFO,                                                                                     \
      "SIGHUP: the config was read again (how many options applied, which need a restart)")            \
    X(S0110, DEBUG, "reply dropped: …")                                                                \
    X(S0111, WARN, "cannot bind the same-host endpoint … (…): clients on this host use …")             \
    X(S0112, WARN, "a shared region handed over was refused (… so far): …")                            \
    X(S0113, WARN, "no shared memory for clients on this host (…): their values go through …")         \
    X(S0114, WARN,                                                                                     \
      "… connections on …: at the file-descriptor limit (… less what psd holds): ZeroMQ cannot " \
      "accept more and retries at once, taking a core, until one closes")                              \
    X(S0200, WARN, "an error reply to a worker (the request, the code, the reason; sampled)")          \
    X(S0300, DEBUG, "hello from worker …")                                                             \
    X(S0301, INFO, "worker … shares a memory region with this shard (… regions bound)")                \
    X(S0310, INFO, "created table '…' id …: … elements, this shard […, …), … lr …")                    \
    X(S0311, INFO, "pruning '…' to … sparsity between steps … and …, every …")                         \
    X(S0320, INFO, "pruned '…' at step …: … of … weights (target now …)")                              \
    X(S0330, WARN,                                                                                     \
      "worker … silent for … ms (--worker-timeout …): dropped from the live set; rounds go on "  \
      "without it (… of … workers live)")                                                              \
    X(S0331, INFO, "a dropped worker was heard again: it rejoins at a round boundary")                 \
    X(S0332, INFO, "a push from outside the round was not applied")                                    \
    X(S0340, DEBUG, "a push applied before came again: answered, not applied (exactly-once)")          \
    X(S0400, WARN, "a pull has waited long for workers (which)")                                       \
    X(S0500, INFO, "admitted CURVE client … from … (… so far)")                                        \
    X(S0501, WARN, "refused client … from …: … (… refused so far)")                                    \
    X(S0502, WARN,                                                                                     \
      "refused a connection on …: handshake failed (…; a plaintext or non-CURVE client?) (… "    \
      "refused so far)")                                                                               \
    X(S0600, INFO, "checkpoint … written (…, … tables, … ms)")                                         \
    X(S0601, WARN, "checkpoint … is bad (…); trying an older one")                                     \
    X(S0602, ERROR, "a checkpoint could not be written (the reason)")                                  \
    X(S0603, WARN,                                                                                     \
      "no checkpoint at shutdown: a bsp round is in progress; the newest is from … ms ago")            \
    X(S0604, INFO, "no checkpoint at shutdown: nothing changed since … was written")                   \
    X(S0605, INFO,                                                                                     \
      "a bsp round is in progress: serving until it ends (at most … ms), then writing the "          \
      "checkpoint")                                                                                    \
    X(S0606, INFO, "the round ended: stopping")                                                        \
    X(S0607, WARN,                                                                                     \
      "the bsp round did not end within --stop-timeout-ms … (a worker gone?): stopping without "     \
      "it")                                                                                            \
    X(S0608, INFO,                                                                                     \
      "no checkpoint at shutdown: this backup has not loaded its primary's state, and one of "         \
      "what it holds would hide the newest in --checkpoint-dir")                                       \
    X(S0610, INFO, "restored …: … tables (… ms)")                                                      \
    X(S0611, WARN, "no valid checkpoint for this shard in --checkpoint-dir: starting empty")           \
    X(S0612, ERROR,                                                                                    \
      "--checkpoint-dir holds checkpoints none of which restores into this shard: refusing to "        \
      "start (--start-empty overrides)")                                                               \
    X(S0620, WARN,                                                                                     \
      "'…' restored at an older clock caught up with its workers at clock …: … round(s) of its " \
      "updates were lost")                                                                             \
    X(S0702, WARN, "cannot write the in-sync set to etcd (…): replies wait")                           \
    X(S0703, INFO, "in sync: this primary and … backup(s)")                                            \
    X(S0704, WARN, "backup … dropped: …")                                                              \
    X(S0705, ERROR, "state transfer: the checkpoint could not be written or read")                     \
    X(S0706, INFO, "backup …: state transfer sent (… bytes, written in … ms by a forked writer)")      \
    X(S0707, WARN, "… asked to follow, but the most backups follow already")                           \
    X(S0708, INFO, "backup … follows; its state goes between rounds")                                  \
    X(S0710, ERROR, "cannot connect to the primary …")                                                 \
    X(S0711, INFO, "following the primary … (epoch …)")                                                \
    X(S0712, WARN, "asking the primary for its state again: …")                                        \
    X(S0713, ERROR, "state transfer from … does not load, or cannot be written: …")                    \
    X(S0714, INFO, "state from … loaded (… tables, … bytes, record …)")                                \
    X(S0715, WARN, "shard …: this replica is the primary now, epoch …")                                \
    X(S0716, ERROR, "shard …: no longer primary (…)")                                                  \
    X(S0717, WARN, "etcd did not answer: cannot read, campaign or renew (the reason)")                 \
    X(S0718, WARN,                                                                                     \
      "shard … has no primary, and only a replica in etcd's in-sync set may take over")                \
    X(S0719, INFO, "giving up the primary's lease: a backup takes over")                               \
    X(S0720, INFO, "shard … stopped cleanly: etcd records its state as epoch … record …")              \
    X(S0721, WARN, "cannot record the clean stop in etcd (the reason)")                                \
    X(S0722, INFO,                                                                                     \
      "a backup stopping: following the primary until its last record (at most … ms)")                 \
    X(S0723, INFO,                                                                                     \
      "shard … stopped cleanly at epoch … record …, which this replica's checkpoint "            \
      "holds: taking over")                                                                            \
    X(S0724, WARN,                                                                                     \
      "shard … stopped cleanly at epoch … record …; this replica holds another state "           \
      "and may not take over")                                                                         \
    X(S0725, WARN,                                                                                     \
      "psctl recover: shard …: … took over from its checkpoint at epoch … record …; what was " \
      "lost")                                                                                          \
    X(S0726, ERROR, "--replica-name … is held by the process at …: two may not share one")             \
    X(S0727, WARN, "--replica-name … is held by …: waiting for its lease to run out")                  \
    X(S0728, WARN, "etcd no longer holds --replica-name …'s lease: claiming it again")                 \
    X(S0729, INFO, "backup … resumes from its own state (epoch … record …): no state transfer")        \
    X(S0730, WARN, "backup …'s own state cannot be brought up to date (why): the whole state")         \
    X(S0731, INFO, "resuming from this replica's own state (epoch … record …): no state transfer")     \
    X(W0001, INFO, "rank … of … on the backend (and the model)")                                       \
    X(W0002, ERROR, "psworker could not start or run (the reason)")                                    \
    X(W0003, ERROR, "--save: …")                                                                       \
    X(W0004, ERROR, "--summary-json: cannot write '…'")                                                \
    X(W0005, ERROR, "--metrics-listen: the metrics endpoint could not start (the reason)")             \
    X(W0006, INFO, "shard … (…) is on this host: using …")                                             \
    X(W0007, INFO, "threads on CPUs …, ZeroMQ's I/O thread on …")                                      \
    X(W0008, INFO,                                                                                     \
      "… of … shards share memory with this worker: gradients and weights move without sockets "   \
      "there")                                                                                         \
    X(W0011, INFO, "rejoining a run in progress at clock … (epoch …, step … of …)")                    \
    X(W0012, WARN,                                                                                     \
      "the servers took this worker out of their rounds at clock … (it was silent or late): "        \
      "rejoining at clock …")                                                                          \
    X(W0013, INFO, "metrics on … (port …): GET /metrics, /healthz")                                    \
    X(W0014, WARN, "waited … ms for shards to answer their hello (which, why, and the deadline)")      \
    X(W0015, INFO, "--device …: …; training on the CPU")                                               \
    X(W0017, WARN,                                                                                     \
      "the run is over: the servers are at clock … and this run has … steps; reading the final "   \
      "weights only")                                                                                  \
    X(W0018, INFO, "embedding MLP on …")                                                               \
    X(W0019, INFO,                                                                                     \
      "computing in … with f32 accumulation (loss scale …; skipped steps agreed through psd or "   \
      "decided by each worker)")                                                                       \
    X(W0020, INFO,                                                                                     \
      "stage … of … (pipeline … of …): its layers and its share of the model's multiply-adds")         \
    X(W0021, INFO, "stage … of …: where it listens and connects; the schedule and micro-batches")      \
    X(W0022, INFO,                                                                                     \
      "--wire-dtype …: the … shard(s) sharing memory with this worker take f32 through it; the "   \
      "other … take … on their sockets")                                                               \
    X(W0100, INFO, "done: … steps, test accuracy …, … samples/s")                                      \
    X(W0200, INFO, "epoch …/… step …/… loss … … samples/s ETA …s")                                     \
    X(W0210, INFO, "epoch …: test accuracy …")                                                         \
    X(W0220, INFO, "epoch …/… step …/… log-loss … … samples/s ETA …s")                                 \
    X(W0221, INFO, "held-out log-loss …, accuracy …")                                                  \
    X(W0230, INFO, "loss scale … after … steps without an overflow")                                   \
    X(W0240, WARN,                                                                                     \
      "a shard's primary changed: … move(s) between replicas so far; shards now at …")                 \
    X(W0250, INFO,                                                                                     \
      "stage …/… epoch …/… step …/… (loss) … samples/s; forward, backward and waiting shares")         \
    X(W0300, ERROR, "dense model: a pull of this step failed")                                         \
    X(W0301, ERROR, "dense model: a pull failed")                                                      \
    X(W0302, ERROR, "dense model: a push failed")                                                      \
    X(W0303, ERROR, "dense model: a top-k push failed")                                                \
    X(W0304, ERROR, "dense model: rejoining the rounds failed")                                        \
    X(W0305, ERROR,                                                                                    \
      "the loss became … at step … of the epoch: stopping before its gradients are pushed (a "     \
      "learning rate too high for this model?)")                                                       \
    X(W0306, WARN,                                                                                     \
      "step at clock … skipped: gradients overflowed at loss scale … (here, or on another "        \
      "worker); the scale is now …")                                                                   \
    X(W0307, ERROR, "the loss scale fell below …: the gradients are not finite at any scale")          \
    X(W0308, ERROR, "the overflow vote failed (why)")                                                  \
    X(W0310, ERROR, "sparse model: a table call failed (which, and why)")                              \
    X(W0320, ERROR,                                                                                    \
      "stage … of …: a neighbouring stage is gone, silent, or sent what this stage did not "       \
      "expect")                                                                                        \
    X(W0311, ERROR, "sparse model: a pull of a batch's rows failed")                                   \
    X(W0312, ERROR, "sparse model: a push of a batch's rows failed")                                   \
    X(W0313, ERROR, "sparse model: waiting for an overlapped pull failed")

enum ps_log_id {
#define PS_LOG_ID_ENUM(id, level, what) PS_LOGID_##id,
    PS_LOG_IDS(PS_LOG_ID_ENUM)
#undef PS_LOG_ID_ENUM
        PS_LOGID_COUNT
};

#endif
