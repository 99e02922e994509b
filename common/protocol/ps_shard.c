/* Dense range split and sparse key placement. */
#include "ps_shard.h"

#include <assert.h>

void ps_shard_range(uint64_t n, uint32_t shards, uint32_t shard, uint64_t *lo, uint64_t *hi)
{
    assert(shards > 0);
    assert(shard < shards);
    uint64_t base = n / shards;
    uint64_t rem = n % shards;
    uint64_t extra = shard < rem ? shard : rem;
    *lo = (uint64_t)shard * base + extra;
    *hi = *lo + base + (shard < rem ? 1 : 0);
}

uint32_t ps_shard_of_index(uint64_t n, uint32_t shards, uint64_t index)
{
    assert(shards > 0);
    assert(index < n);
    uint64_t base = n / shards;
    uint64_t rem = n % shards;
    /* The first `rem` shards hold base+1 elements each. */
    uint64_t big = rem * (base + 1);
    if (index < big)
        return (uint32_t)(index / (base + 1));
    return (uint32_t)(rem + (index - big) / base);
}

uint32_t ps_jump_hash(uint64_t key, uint32_t buckets)
{
    assert(buckets > 0);
    int64_t b = -1;
    int64_t j = 0;
    while (j < (int64_t)buckets) {
        b = j;
        key = key * UINT64_C(2862933555777941757) + 1;
        j = (int64_t)((double)(b + 1) * ((double)(UINT64_C(1) << 31) / (double)((key >> 33) + 1)));
    }
    return (uint32_t)b;
}

uint32_t ps_shard_of_key(uint64_t key, uint32_t shards)
{
    if (shards == 1)
        return 0; /* without mixing the key: this runs for every key of a request */
    return ps_jump_hash(ps_mix64(key), shards);
}

size_t ps_keys_below(const uint64_t *keys, size_t n, uint64_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
