/* A primary's backlog of its newest records, and the record queue it
 * shares with state transfers (backlog.h). */
#include "backlog.h"

#include "record.h"

#include "ps_err.h"

#include <stdlib.h>
#include <string.h>

uint64_t psd_rec_bytes(size_t hdr_len, zmq_msg_t *frames, size_t n)
{
    uint64_t bytes = sizeof(struct psd_rec) + n * sizeof(zmq_msg_t) + hdr_len;
    for (size_t i = 0; i < n; i++)
        bytes += zmq_msg_size(&frames[i]);
    return bytes;
}

int psd_recq_push(struct psd_recq *q, uint64_t seq, const void *hdr, size_t hdr_len,
                  zmq_msg_t *frames, size_t n, uint64_t bytes)
{
    size_t head = sizeof(struct psd_rec) + n * sizeof(zmq_msg_t);
    struct psd_rec *k = malloc(head + hdr_len);
    if (k == NULL)
        return PS_ENOMEM;
    k->hdr = (uint8_t *)k + head;
    memcpy(k->hdr, hdr, hdr_len);
    k->hdr_len = hdr_len;
    k->seq = seq;
    k->bytes = bytes;
    k->n = n;
    k->next = NULL;
    if (psd_record_share(k->frames, frames, n) != 0) {
        free(k);
        return PS_ENOMEM;
    }
    if (q->tail != NULL)
        q->tail->next = k;
    else
        q->head = k;
    q->tail = k;
    q->n++;
    q->bytes += bytes;
    return 0;
}

void psd_recq_pop(struct psd_recq *q)
{
    struct psd_rec *k = q->head;
    q->head = k->next;
    if (q->head == NULL)
        q->tail = NULL;
    for (size_t i = 0; i < k->n; i++)
        zmq_msg_close(&k->frames[i]);
    q->bytes -= k->bytes;
    q->n--;
    free(k);
}

void psd_recq_clear(struct psd_recq *q)
{
    while (q->head != NULL)
        psd_recq_pop(q);
}

void psd_backlog_init(struct psd_backlog *b, uint64_t max_bytes)
{
    memset(b, 0, sizeof *b);
    b->max_bytes = max_bytes;
}

/* The oldest record goes: the backlog now starts after it. */
static void pop(struct psd_backlog *b)
{
    b->base = b->q.head->seq;
    psd_recq_pop(&b->q);
}

void psd_backlog_reset(struct psd_backlog *b, uint64_t seq)
{
    psd_recq_clear(&b->q);
    b->base = b->last = seq;
}

void psd_backlog_add(struct psd_backlog *b, uint64_t seq, const void *hdr, size_t hdr_len,
                     zmq_msg_t *frames, size_t n)
{
    if (seq != b->last + 1)
        psd_backlog_reset(b, seq - 1);
    b->last = seq;
    uint64_t bytes = psd_rec_bytes(hdr_len, frames, n);
    if (bytes > b->max_bytes) { /* not kept: nothing before it can be brought up to date */
        psd_backlog_reset(b, seq);
        return;
    }
    while (b->q.head != NULL && b->q.bytes + bytes > b->max_bytes) {
        pop(b);
        b->evicted++;
    }
    if (psd_recq_push(&b->q, seq, hdr, hdr_len, frames, n, bytes) != 0)
        psd_backlog_reset(b, seq);
}

int psd_backlog_covers(const struct psd_backlog *b, uint64_t seq)
{
    return seq >= b->base && seq <= b->last;
}

const struct psd_rec *psd_backlog_after(const struct psd_backlog *b, uint64_t seq)
{
    const struct psd_rec *k = b->q.head;
    while (k != NULL && k->seq <= seq)
        k = k->next;
    return k;
}
