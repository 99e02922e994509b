/* A primary's backlog of its newest records (backlog.h). */
#include "backlog.h"

#include "record.h"

#include <stdlib.h>
#include <string.h>

void psd_backlog_init(struct psd_backlog *b, uint64_t max_bytes)
{
    memset(b, 0, sizeof *b);
    b->max_bytes = max_bytes;
}

static void pop(struct psd_backlog *b)
{
    struct psd_backlog_rec *k = b->head;
    b->head = k->next;
    if (b->head == NULL)
        b->tail = NULL;
    b->base = k->seq;
    for (size_t i = 0; i < k->n; i++)
        zmq_msg_close(&k->frames[i]);
    b->bytes -= k->bytes;
    b->records--;
    free(k);
}

void psd_backlog_reset(struct psd_backlog *b, uint64_t seq)
{
    while (b->head != NULL)
        pop(b);
    b->base = b->last = seq;
}

void psd_backlog_add(struct psd_backlog *b, uint64_t seq, const void *hdr, size_t hdr_len,
                     zmq_msg_t *frames, size_t n)
{
    if (seq != b->last + 1)
        psd_backlog_reset(b, seq - 1);
    b->last = seq;
    size_t head = sizeof(struct psd_backlog_rec) + n * sizeof(zmq_msg_t);
    uint64_t bytes = head + hdr_len;
    for (size_t i = 0; i < n; i++)
        bytes += zmq_msg_size(&frames[i]);
    struct psd_backlog_rec *k = bytes <= b->max_bytes ? malloc(head + hdr_len) : NULL;
    if (k == NULL) { /* not kept: nothing before it can be brought up to date */
        psd_backlog_reset(b, seq);
        return;
    }
    k->hdr = (uint8_t *)k + head;
    memcpy(k->hdr, hdr, hdr_len);
    k->hdr_len = hdr_len;
    k->seq = seq;
    k->bytes = bytes;
    k->next = NULL;
    k->n = n;
    if (psd_record_share(k->frames, frames, n) != 0) {
        free(k);
        psd_backlog_reset(b, seq);
        return;
    }
    while (b->head != NULL && b->bytes + bytes > b->max_bytes) {
        pop(b);
        b->evicted++;
    }
    if (b->tail != NULL)
        b->tail->next = k;
    else
        b->head = k;
    b->tail = k;
    b->records++;
    b->bytes += bytes;
}

int psd_backlog_covers(const struct psd_backlog *b, uint64_t seq)
{
    return seq >= b->base && seq <= b->last;
}

const struct psd_backlog_rec *psd_backlog_after(const struct psd_backlog *b, uint64_t seq)
{
    const struct psd_backlog_rec *k = b->head;
    while (k != NULL && k->seq <= seq)
        k = k->next;
    return k;
}
