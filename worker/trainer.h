/* psworker's trainer: its configuration (the flags), the state of a run
 * every file reads, and the parts of its modes, each owned by one file
 * and opaque elsewhere. The files each have their own header, from the
 * bottom of psworker's stack up: model.h (the passes), report.h
 * (/metrics), local.h (--standalone's optimizer), topk.h (--topk),
 * connect.h (the client), exchange.h (weights and gradients), train.h
 * (the steps); psworker.c on top sets up, runs and saves. No file calls
 * one above it. */
#ifndef PSW_TRAINER_H
#define PSW_TRAINER_H

#include "cnn.h"
#include "data.h"
#include "mlp.h"
#include "psclient.h"
#include "sparse_lr.h"

#include "psk.h"
#include "psk_optim.h"

#include "ps_cpus.h"
#include "ps_log.h"

#include <stddef.h>
#include <stdint.h>

#define EVAL_BATCH 1000
#define TABLES_MAX (2 * (PSW_LAYERS_MAX + PSW_CONV_MAX))

struct config {
    const char *servers;
    uint64_t rank, workers;
    const char *model, *layers, *arch, *data;
    uint64_t batch, epochs, seed;
    double lr, momentum, weight_decay, topk, l1, l2;
    uint64_t rows_max, embed_dim, embed_hidden, admit_after, evict_after, evict_half_life;
    int evict_at_budget;
    const char *optimizer, *device, *lr_schedule, *wire_dtype, *precision;
    const char *summary_json, *save, *log_level, *curve_secret, *curve_server_key, *config;
    const char *metrics_listen, *cpus, *io_cpus;
    int standalone, no_local_ipc, no_shm, no_batch, whole_pulls;
    uint64_t max_steps, log_every, timeout_ms, test_delay_ms, accum_steps, retry_ms, heartbeat_ms;
    uint64_t compute_threads;
    double loss_scale;
    uint64_t growth_interval, test_overflow_at, test_stop_at;
    /* pipelines (pipe.h): stage = rank % stages, pipeline = rank / stages */
    uint64_t stages, microbatches, stage_timeout_ms;
    const char *schedule, *cuts, *stage_endpoints, *stage_listen;
    int help;
};

/* --stages: what pipe.c measures; report.c and the summary read it. */
struct psw_stage_stats {
    double forward_s, backward_s; /* in this stage's passes */
    double idle_s;                /* waiting for a neighbour's tensor: the bubble, and imbalance */
    uint64_t held, held_max;      /* micro-batches between their forward and backward */
    uint64_t link_sent, link_received; /* bytes of tensors to and from the neighbours */
};

struct trainer {
    const char *const *eps; /* --servers, while psc_create says hello (log_hello_waiting) */
    uint32_t neps;
    struct config cfg;
    struct ps_log log;
    struct psk_backend *be;
    struct psw_mlp mlp; /* the MLP, or the CNN's head */
    struct psw_cnn cnn; /* --model cnn: the convolutions */
    int k0;             /* the convolutions' tables, which come first (0: an MLP) */
    int fc0;            /* a pipeline stage: the whole head's layer its first layer is */
    int kbase;          /* a pipeline stage: the whole model's index of its table 0 */
    int shaped;         /* --model cnn: tables carry their shapes */
    struct psw_split train, test;
    uint32_t *perm;
    float *h_in; /* a device's batch before its upload (NULL on the CPU backend) */
    int *h_lab;
    int ntables;
    float *hw[TABLES_MAX], *hg[TABLES_MAX]; /* host weights and gradients */
    struct ps_pool *pool;                   /* --compute-threads 2 */
    /* the modes' parts, each owned by its file and opaque elsewhere (NULL
     * where the mode is off) */
    struct psc_client *c;         /* distributed: the client (libpsclient's) */
    struct psw_exchange *ex;      /* distributed: exchange.c's pulls in flight, weight sets */
    struct psw_local *local;      /* --standalone: local.c's optimizer and its state */
    struct psw_topk *topk;        /* --topk: topk.c's residuals and selections */
    int alias;                    /* CPU backend: host buffers are the model's own buffers */
    struct ps_cpus cpus, io_cpus; /* --cpus, --io-cpus (n == 0: not given) */
    float *acc[TABLES_MAX];       /* --accum-steps > 1: summed gradients (device) */
    uint64_t decay_steps;         /* optimizer steps of the whole run (lr schedule) */
    uint64_t clock;               /* steps done (in the run: a rejoining worker starts later) */
    uint64_t clock0;              /* where this process started */
    uint64_t done;                /* steps this process took */
    int fresh;                    /* device weights are those of `clock` */
    double train_seconds;
    /* --precision: 16-bit compute; f16 scales the loss (GradScaler's rules) */
    int prec;                /* enum psk_precision */
    double scale;            /* the loss scale (1 unless f16) */
    uint64_t clean, skipped; /* steps since the last overflow or growth; steps skipped */
    int overflow_injected;   /* --test-overflow-at did its one */
    struct psc_vote vote;    /* the workers' "found inf" rounds */
    struct psw_report *rep;  /* report.c's: /metrics and what it shows */
    struct psw_pipe *pipe;   /* --stages > 1: pipe.c's link and schedule */
    struct psw_stage_stats stage;
};

/* --stages: this process's stage, its pipeline, and the pipelines (the
 * data-parallel replicas: --workers / --stages). */
static inline uint64_t psw_stage(const struct config *c)
{
    return c->rank % c->stages;
}
static inline uint64_t psw_pipeline(const struct config *c)
{
    return c->rank / c->stages;
}
static inline uint64_t psw_pipelines(const struct config *c)
{
    return c->workers / c->stages;
}

#endif
