/* A primary's backups and the rules of the in-sync set (backups.h). */
#include "backups.h"

#include <stdio.h>
#include <string.h>

uint64_t psd_backups_required(const struct psd_backups *set)
{
    uint64_t m = UINT64_MAX;
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++) {
        const struct psd_backup *b = &set->b[i];
        if ((b->state == PSD_BACKUP_IN_SYNC || b->state == PSD_BACKUP_LEAVING) && b->acked < m)
            m = b->acked;
    }
    return m;
}

struct psd_backup *psd_backups_slot(struct psd_backups *set, uint64_t id)
{
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if (set->b[i].state != PSD_BACKUP_FREE && set->b[i].id == id)
            return &set->b[i];
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if (set->b[i].state == PSD_BACKUP_FREE)
            return &set->b[i];
    return NULL;
}

void psd_backup_follows(struct psd_backup *b, uint64_t id, const char *endpoint, const void *route,
                        size_t route_len, uint64_t now_ms)
{
    memset(b, 0, sizeof *b);
    b->state = PSD_BACKUP_TRANSFER;
    memcpy(b->route, route, route_len);
    b->route_len = route_len;
    b->id = id;
    snprintf(b->endpoint, sizeof b->endpoint, "%s", endpoint);
    b->heard_ms = now_ms;
}

void psd_backup_transferred(struct psd_backup *b, uint64_t seq)
{
    b->state = PSD_BACKUP_CATCHING_UP;
    b->from_seq = seq;
}

int psd_backup_acked(struct psd_backup *b, uint64_t seq, uint64_t sent, uint64_t now_ms)
{
    b->heard_ms = now_ms;
    if (seq > b->acked && seq <= sent)
        b->acked = seq;
    if (b->state != PSD_BACKUP_CATCHING_UP || b->acked < b->from_seq)
        return 0;
    b->state = PSD_BACKUP_IN_SYNC; /* waited for from here on; then listed */
    return 1;
}

int psd_backup_drop(struct psd_backup *b)
{
    if (b->state == PSD_BACKUP_FREE || b->state == PSD_BACKUP_LEAVING)
        return 0;
    if (b->state == PSD_BACKUP_IN_SYNC) {
        b->state = PSD_BACKUP_LEAVING;
        return 1;
    }
    b->state = PSD_BACKUP_FREE;
    return 0;
}

uint32_t psd_backups_leaving_mask(const struct psd_backups *set)
{
    uint32_t mask = 0;
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if (set->b[i].state == PSD_BACKUP_LEAVING)
            mask |= 1u << i;
    return mask;
}

void psd_backups_listed(struct psd_backups *set, uint32_t mask)
{
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if ((mask & (1u << i)) && set->b[i].state == PSD_BACKUP_LEAVING)
            set->b[i].state = PSD_BACKUP_FREE;
}

uint32_t psd_backups_in_sync(const struct psd_backups *set, uint64_t *ids, const char **endpoints)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if (set->b[i].state == PSD_BACKUP_IN_SYNC) {
            ids[n] = set->b[i].id;
            endpoints[n++] = set->b[i].endpoint;
        }
    return n;
}

int psd_backups_leaving(const struct psd_backups *set)
{
    return psd_backups_leaving_mask(set) != 0;
}

int psd_backups_waiting(const struct psd_backups *set)
{
    for (uint32_t i = 0; i < PSD_BACKUPS_MAX; i++)
        if (set->b[i].state == PSD_BACKUP_TRANSFER)
            return 1;
    return 0;
}

int psd_backup_silent(const struct psd_backup *b, uint64_t now_ms, uint64_t timeout_ms,
                      uint64_t catch_up_ms)
{
    if (b->state == PSD_BACKUP_FREE || b->state == PSD_BACKUP_LEAVING)
        return 0;
    uint64_t limit = b->state == PSD_BACKUP_IN_SYNC ? timeout_ms : catch_up_ms;
    return now_ms - b->heard_ms > limit;
}

int psd_backup_gets_records(const struct psd_backup *b)
{
    return b->state >= PSD_BACKUP_CATCHING_UP;
}

int psd_backup_gets_beats(const struct psd_backup *b)
{
    return b->state >= PSD_BACKUP_TRANSFER && b->state <= PSD_BACKUP_IN_SYNC;
}

uint64_t psd_backup_lag(const struct psd_backup *b, uint64_t seq)
{
    return b->state >= PSD_BACKUP_CATCHING_UP ? seq - b->acked : seq;
}
