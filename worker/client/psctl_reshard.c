/* psctl reshard (psctl_impl.h): checkpoints of S shards rewritten for N. */
#include "psctl_impl.h"

#include "reshard.h"
#include "snapshot.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Offline, on the checkpoint files (server/state/snapshot.h). */
int psc__ctl_reshard(const struct config *cfg)
{
    char err[1024];
    if (cfg->from == NULL || cfg->to == NULL || cfg->shards == 0) {
        fprintf(stderr, "psctl: reshard needs --from DIR, --shards N (1..%u) and --to DIR\n",
                PS_SHARDS_MAX);
        return 2;
    }
    uint32_t old = 0;
    struct psd_cons cons;
    if (psd_snapshot_params(cfg->from, &old, &cons, err, sizeof err) != 0) {
        fprintf(stderr, "psctl: reshard: %s\n", err);
        return 1;
    }
    char what[256];
    if (mkdir(cfg->to, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "psctl: reshard: cannot make %s: %s\n", cfg->to, strerror(errno));
        return 1;
    }
    if (psd_snapshot_found(cfg->to, what, sizeof what) > 0) {
        fprintf(stderr,
                "psctl: reshard: %s holds checkpoints already (%s): give an empty "
                "directory\n",
                cfg->to, what);
        return 1;
    }
    int rc = 0;
    for (uint32_t j = 0; rc == 0 && j < cfg->shards; j++) {
        struct psd_snapshot s = {.shard = j, .shards = (uint32_t)cfg->shards, .cons = cons};
        char path[PS_PATH_MAX];
        rc = psd_reshard(&s, cfg->from, old, err, sizeof err);
        if (rc == 0)
            rc = psd_snapshot_write(&s, cfg->to, path, sizeof path, err, sizeof err);
        if (rc == 0)
            printf("shard %u of %llu: %s (%u tables)\n", j, (unsigned long long)cfg->shards, path,
                   s.ntables);
        psd_snapshot_free(&s);
    }
    if (rc != 0) {
        fprintf(stderr, "psctl: reshard: %s\n", err);
        return 1;
    }
    printf("resharded %u shard(s) of %s into %llu in %s\n", old, cfg->from,
           (unsigned long long)cfg->shards, cfg->to);
    return 0;
}
