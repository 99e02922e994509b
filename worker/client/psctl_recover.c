/* psctl recover (psctl_impl.h): a replicated shard whose in-sync set was lost
 * whole taken over by the replica holding the newest checkpoint. */
#include "psctl_impl.h"

#include "ps_opts.h"

#include <stdio.h>
#include <string.h>

/* One replica's answer to psctl recover's question. */
struct survivor {
    const char *ep;
    int up;
    struct psc_shard_stats st;
    struct psc_client *c;
};

/* psctl recover for one shard, given as its replicas "A|B|...". */
static int recover_shard(const struct config *cfg, const char *entry)
{
    char list[PS_ENDPOINT_MAX * 4 + 8];
    snprintf(list, sizeof list, "%s", entry);
    struct survivor sv[4];
    int n = 0;
    for (char *save = NULL, *ep = strtok_r(list, "|", &save); ep != NULL && n < 4;
         ep = strtok_r(NULL, "|", &save)) {
        struct survivor *v = &sv[n++];
        memset(v, 0, sizeof *v);
        v->ep = ep;
        struct config one = *cfg;
        one.servers = ep;
        struct cluster k;
        memset(&k, 0, sizeof k);
        if (psc__ctl_connect(&one, &k) != 0)
            continue;
        v->c = k.c;
        v->st.struct_size = sizeof v->st;
        v->up = psc_stats(v->c, 0, (int)cfg->timeout_ms, &v->st) == 0;
    }
    int best = -1, rc = 0;
    for (int i = 0; i < n; i++) {
        const struct survivor *v = &sv[i];
        if (v->up && strcmp(v->st.role, "primary") == 0) {
            printf("shard %u: %s is its primary (epoch %llu): nothing to recover\n", v->st.shard,
                   v->ep, (unsigned long long)v->st.epoch);
            best = -2;
            break;
        }
        if (v->up && strcmp(v->st.role, "primary") != 0 && v->st.tables > 0 &&
            (best < 0 || v->st.ckpt_epoch > sv[best].st.ckpt_epoch ||
             (v->st.ckpt_epoch == sv[best].st.ckpt_epoch && v->st.ckpt_seq > sv[best].st.ckpt_seq)))
            best = i;
    }
    if (best >= 0) {
        const struct psc_shard_stats *b = &sv[best].st;
        printf("shard %u: etcd's in-sync set (%s) was at epoch %llu%s; candidates:\n", b->shard,
               b->insync[0] ? b->insync : "none", (unsigned long long)b->insync_epoch,
               b->insync_stopped ? ", and records a clean stop" : "");
        for (int i = 0; i < n; i++) {
            const struct survivor *v = &sv[i];
            if (!v->up) {
                printf("  %s  does not answer\n", v->ep);
                continue;
            }
            if (v->st.tables == 0) {
                printf("  %s  %s, %u tables: not a candidate\n", v->ep, v->st.role, v->st.tables);
                continue;
            }
            printf("  %s  checkpoint at epoch %llu record %llu: lacks what the set acknowledged "
                   "after it%s\n",
                   v->ep, (unsigned long long)v->st.ckpt_epoch, (unsigned long long)v->st.ckpt_seq,
                   i == best ? " (chosen: the newest)" : "");
        }
        char detail[PS_ERROR_TEXT_MAX];
        if (psc_recover(sv[best].c, 0, (int)cfg->timeout_ms, detail, sizeof detail) == 0) {
            printf("  %s\n", detail);
        } else {
            fprintf(stderr, "psctl: recover: %s: %s\n", sv[best].ep, detail);
            rc = 1;
        }
    } else if (best == -1) {
        fprintf(stderr,
                "psctl: recover: no replica of %s answers as a candidate holding a checkpoint\n",
                entry);
        rc = 1;
    }
    for (int i = 0; i < n; i++)
        if (sv[i].c != NULL)
            psc_destroy(sv[i].c);
    return rc;
}

int psc__ctl_recover(const struct config *cfg)
{
    char buf[8192], err[512];
    const char *eps[PS_SHARDS_MAX];
    size_t n = 0;
    if (ps_split_servers(cfg->servers, buf, sizeof buf, eps, &n, err, sizeof err) != 0) {
        fprintf(stderr, "psctl: %s\n", err);
        return 2;
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        rc |= recover_shard(cfg, eps[i]);
    return rc;
}
