/* The structs of psclient.h that grow (sized.c; psclient.h, "ABI"). */
#ifndef PSC_SIZED_IMPL_H
#define PSC_SIZED_IMPL_H

#include "psclient.h"

#include <stddef.h>

/* Structs that grow (sized.c): PSC__END(type, field) is where field
 * ends, the first version's size when field is its last. */
#define PSC__END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
int psc__sized_in(void *ours, size_t ours_size, size_t first, const void *caller, const char *what,
                  char *err, size_t errlen);
int psc__sized_check_out(const void *caller, size_t ours_size, size_t first, const char *what,
                         char *err, size_t errlen);
size_t psc__sized_size(const void *caller);
void psc__sized_out(void *caller, const void *ours, size_t ours_size);
/* The first versions' sizes. */
#define PSC__CONFIG_V1      PSC__END(struct psc_config, hello_waiting_arg)
#define PSC__TABLE_SPEC_V1  PSC__END(struct psc_table_spec, npushers)
#define PSC__TABLE_STATS_V1 PSC__END(struct psc_table_stats, shape)
#define PSC__SHARD_STATS_V1 PSC__END(struct psc_shard_stats, replicas)
#define PSC__VOTE_V1        PSC__END(struct psc_vote, share)
#define PSC__LINK_CONFIG_V1 PSC__END(struct psc_link_config, ncurve_allow)
#define PSC__TENSOR_V1      PSC__END(struct psc_tensor, eval)

#endif
