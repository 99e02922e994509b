/* When checkpoints are written: every --checkpoint-every, on request
 * (psctl checkpoint) once the round is quiet, and whether the newest one
 * still holds the current state. The format is checkpoint.c's. */
#include "psd_impl.h"

#include "checkpoint.h"

#include "ps_clock.h"
#include "ps_err.h"
#include "ps_pool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Writes a checkpoint (the shard is between rounds); out gets the path
 * written, or the error. */
static int write_checkpoint(struct psd *s, const char *why, char *out, size_t outlen)
{
    char path[PS_PATH_MAX], err[512];
    uint64_t t0 = (uint64_t)ps_mono_ms();
    int rc = psd_checkpoint_write(s, s->ckpt_dir, path, sizeof path, err, sizeof err);
    s->ckpt_last_ms = (uint64_t)ps_mono_ms();
    if (rc != 0) {
        PS_LOG(s->log, PS_LOG_ERROR, S0602, "%s", err);
        snprintf(out, outlen, "%s", err);
        return rc;
    }
    s->ckpt_written++;
    s->ckpt_ok_ms = s->ckpt_current_ms = s->ckpt_last_ms;
    s->ckpt_state = psd_state_version(s);
    s->ckpt_pending = 0;
    PS_LOG(s->log, PS_LOG_INFO, S0600, "checkpoint %s written (%s, %u tables, %llu ms)", path, why,
           s->ntables, (unsigned long long)(s->ckpt_last_ms - t0));
    snprintf(out, outlen, "%s", path);
    snprintf(s->ckpt_path, sizeof s->ckpt_path, "%s", path);
    return 0;
}

int psd_checkpoint_now(struct psd *s, const char *why)
{
    if (s->ckpt_dir == NULL || !psd_quiescent(s))
        return PSD_CKPT_SKIPPED;
    char out[PS_PATH_MAX + 100];
    return write_checkpoint(s, why, out, sizeof out);
}

uint64_t psd_state_version(const struct psd *s)
{
    uint64_t v = s->changes; /* each term only grows: a change moves the sum */
    for (uint32_t i = 0; i < s->ntables; i++)
        v += s->tables[i]->steps + s->tables[i]->clock;
    return v;
}

void psd_checkpoint_mark_saved(struct psd *s)
{
    s->ckpt_state = psd_state_version(s);
    s->ckpt_last_ms = s->ckpt_current_ms = (uint64_t)ps_mono_ms();
}

/* Due by the interval: written at the first moment the shard is between
 * rounds (checked after every request and on every tick), and only when
 * the state differs from the newest checkpoint's: an idle shard, or one
 * that has no tables yet, writes nothing. */
void psd_checkpoint_if_due(struct psd *s)
{
    if (s->ckpt_dir == NULL)
        return;
    if (s->ckpt_pending) {
        psd_checkpoint_now(s, "asked for");
    } else if (s->ckpt_every_ms > 0 &&
               (uint64_t)ps_mono_ms() - s->ckpt_last_ms >= s->ckpt_every_ms) {
        if (psd_state_version(s) == s->ckpt_state) {
            s->ckpt_last_ms = (uint64_t)ps_mono_ms();
            if (s->ckpt_written)
                s->ckpt_current_ms = s->ckpt_last_ms;
        } else {
            psd_checkpoint_now(s, "interval");
        }
    }
}

/* psctl checkpoint: now, or (bsp, mid-round) at the end of the round. */
void psd_op_checkpoint(struct psd *s, const Ps__Header *req, struct psd_reply *rep)
{
    if (s->ckpt_dir == NULL) {
        psd_reply_errorf(s, req, PS_ENOTSUP, rep,
                         "checkpoint: shard %u runs without --checkpoint-dir", s->shard);
        return;
    }
    char detail[PS_PATH_MAX + 200]; /* a path and a sentence about it */
    uint64_t age = (uint64_t)ps_mono_ms() - s->ckpt_ok_ms;
    if (s->ckpt_written > 0 && age < PS_CHECKPOINT_ASK_MIN_MS) {
        snprintf(detail, sizeof detail,
                 "%s, written %llu ms ago, stands (at most one asked-for checkpoint every %u ms)",
                 s->ckpt_path, (unsigned long long)age, PS_CHECKPOINT_ASK_MIN_MS);
    } else if (psd_quiescent(s)) {
        int rc = write_checkpoint(s, "asked for", detail, sizeof detail);
        if (rc != 0) {
            psd_reply_errorf(s, req, rc, rep, "checkpoint: %s", detail);
            return;
        }
    } else {
        s->ckpt_pending = 1;
        snprintf(detail, sizeof detail, "a round is in progress: written when it ends");
    }
    Ps__Header h;
    psd_reply_init(&h, req);
    h.detail = detail;
    psd_reply_header(s, &h, rep);
}

double psd_checkpoint_age_s(const struct psd *s)
{
    return s->ckpt_written ? (double)((uint64_t)ps_mono_ms() - s->ckpt_current_ms) / 1e3 : -1.0;
}
