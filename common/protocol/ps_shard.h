/* Where data lives: dense ranges and sparse keys over S shards.
 *
 * Dense tables split into S contiguous ranges whose sizes differ by at most
 * one element (the first n % S shards get one more). Sparse keys go to a
 * shard by jump consistent hash (Lamping & Veach) of a mixed key, so adding a
 * shard moves only about 1/(S+1) of the keys. Any process computes placement
 * from (n, S) or (key, S) alone; nothing here talks to the network. */
#ifndef PS_SHARD_H
#define PS_SHARD_H

#include <stddef.h>
#include <stdint.h>

/* Range [*lo, *hi) of shard `shard` for a table of n elements over `shards`.
 * Preconditions: shards > 0, shard < shards. */
void ps_shard_range(uint64_t n, uint32_t shards, uint32_t shard, uint64_t *lo, uint64_t *hi);

/* Shard that owns element `index` of an n-element table. index < n. */
uint32_t ps_shard_of_index(uint64_t n, uint32_t shards, uint64_t index);

/* 64-bit finaliser (splitmix64): spreads nearby keys over the whole range.
 * Inline: psd hashes every key of a sparse request with it. */
static inline uint64_t ps_mix64(uint64_t x)
{
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

/* Jump consistent hash of a raw 64-bit key into [0, buckets). buckets > 0. */
uint32_t ps_jump_hash(uint64_t key, uint32_t buckets);

/* Shard of a sparse key: jump hash of the mixed key. */
uint32_t ps_shard_of_key(uint64_t key, uint32_t shards);

/* How many of the n increasing keys are below x (binary search): where a
 * shard's range starts in a sorted key list. */
size_t ps_keys_below(const uint64_t *keys, size_t n, uint64_t x);

#endif
