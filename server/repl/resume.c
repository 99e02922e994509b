/* A primary's choice between a resume and a state transfer for a backup
 * that follows (repl_impl.h, backlog.h). */
#include "repl_impl.h"

#include "ps_err.h"

#include <inttypes.h>
#include <stdio.h>

/* Where in this epoch the state after record seq of epoch brings a backup
 * (*from), or why it cannot (0 with why written). */
static int reaches(const struct psd_repl *r, uint64_t epoch, uint64_t seq, uint64_t *from,
                   char *why, size_t len)
{
    const struct psd_backlog *bl = &r->backlog;
    if (epoch == r->epoch && seq > r->seq) {
        snprintf(why, len, "it is past this primary's last record %" PRIu64, r->seq);
        return 0;
    }
    if (epoch == r->epoch) {
        *from = seq;
    } else if (epoch == r->prev_epoch && seq == r->prev_seq && r->prev_epoch != 0) {
        *from = 0; /* the state this epoch began from */
    } else {
        if (r->prev_epoch != 0)
            snprintf(why, len,
                     "this primary's epoch %" PRIu64 " began from epoch %" PRIu64 " record %" PRIu64
                     ", another state",
                     r->epoch, r->prev_epoch, r->prev_seq);
        else
            snprintf(why, len,
                     "this primary's epoch %" PRIu64 " began from no state a replica names",
                     r->epoch);
        return 0;
    }
    if (!psd_backlog_covers(bl, *from)) {
        snprintf(why, len,
                 "the backlog holds records %" PRIu64 " to %" PRIu64 " of epoch %" PRIu64
                 ", not %" PRIu64 " on (--replica-backlog-mib)",
                 bl->base + 1, bl->last, r->epoch, *from + 1);
        return 0;
    }
    return 1;
}

int psd__repl_try_resume(struct psd_repl *r)
{
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++) {
        struct psd_backup *b = &r->backups.b[i];
        if (b->state != PSD_BACKUP_TRANSFER || b->resume_epoch == 0)
            continue;
        uint64_t e = b->resume_epoch, q = b->resume_seq, from = 0;
        b->resume_epoch = b->resume_seq = 0; /* decided now, either way */
        char why[256];
        if (reaches(r, e, q, &from, why, sizeof why)) {
            int rc = psd_transfer_resume(&r->xfer, r->epoch, from, 1u << i, &r->backlog, e, q);
            if (rc == 0) {
                r->resumed++;
                PS_LOG(r->log, PS_LOG_INFO, S0729,
                       "backup %s resumes from its own state (epoch %" PRIu64 " record %" PRIu64
                       "), this primary's after record %" PRIu64 ": no state transfer, %" PRIu64
                       " records from the backlog",
                       b->endpoint, e, q, from, r->xfer.kept.n);
                return 1;
            }
            snprintf(why, sizeof why, "%s",
                     rc == PS_ELIMIT ? "the records after it pass --replica-transfer-mib"
                                     : "no memory for the records after it");
        }
        r->resume_refused++;
        PS_LOG(r->log, PS_LOG_WARN, S0730,
               "backup %s holds a state of its own (epoch %" PRIu64 " record %" PRIu64
               ") that cannot be brought up to date here: %s; it gets the whole state",
               b->endpoint, e, q, why);
    }
    return 0;
}
