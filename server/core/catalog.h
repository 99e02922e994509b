/* The tables a shard holds, by id and by name: creating one (or finding
 * the one a name already has), the bytes it needs, what holds for all of
 * them (the slowest worker's clock, being between rounds), and dropping
 * them all. Owned by catalog.c: the catalog is opaque outside it; the
 * tables themselves are state/table.h's. */
#ifndef PSD_CATALOG_H
#define PSD_CATALOG_H

#include "psd.h"

#include <stdint.h>

struct psd_catalog *psd_catalog_create(void);
/* Frees the catalog; its tables must be gone (psd_tables_reset). */
void psd_catalog_destroy(struct psd_catalog *c);

/* Tables on this shard; ids are 0..psd_ntables()-1. */
uint32_t psd_ntables(const struct psd *s);
/* The table with id, or NULL past the last. */
struct psd_table *psd_table_at(const struct psd *s, uint32_t id);
/* The table called name, or NULL. */
struct psd_table *psd_table_named(const struct psd *s, const char *name);
/* A new table of this shard (spec checked) with the next id, the
 * consistency mode's state and the apply helper; psd_tables_add adds it.
 * 0, or an error with nothing left allocated. */
int psd_table_new(struct psd *s, const Ps__TableSpec *spec, struct psd_table **out);
/* Adds t (made by psd_table_new, or restored with its id): the catalog
 * owns it from here. PS_ELIMIT when PS_TABLES_MAX are there (t stays the
 * caller's). */
int psd_tables_add(struct psd *s, struct psd_table *t);
/* Drops every table. */
void psd_tables_reset(struct psd *s);
/* A table's consistency state and the table (one the catalog does not
 * hold: a create that failed half way). */
void psd_table_drop(struct psd *s, struct psd_table *t);

/* Bytes a table of spec (checked) would take on this shard at most:
 * weights and optimizer state, the rows_max rows of a sparse one. Checked
 * against --max-table-bytes before anything is allocated for it. */
uint64_t psd_table_bytes_needed(const struct psd *s, const Ps__TableSpec *spec);
/* 1 when every table is between rounds (always in asp/ssp): a checkpoint
 * written now holds a consistent clock. */
int psd_quiescent(const struct psd *s);
/* A sum that moves whenever a table's steps or clock do. */
uint64_t psd_tables_version(const struct psd *s);

/* Eviction by time: each sparse table with evict_after_s samples its
 * tick against now (ms) and raises its age floor when the samples allow
 * and replication agrees (hooks.h). */
void psd_age_clock(struct psd *s, uint64_t now);

/* OP_CREATE_TABLE. */
void psd_op_create(struct psd *s, const Ps__Header *req, struct psd_reply *rep);

#endif
