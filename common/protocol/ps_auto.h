/* Indices from the environment, for processes that a scheduler starts
 * (Kubernetes, Slurm, MPI) rather than a person: psd --shard auto,
 * psworker --rank auto and --workers auto, and the Python package's
 * defaults. Each looks at its sources in order and takes the first that
 * is set; a source set to anything but a whole number in range is an
 * error that names it; when none is set, the error names every source it
 * tried.
 *
 *   shard:   PSD_SHARD, then the host name's ordinal suffix (NAME-N, as a
 *            StatefulSet names its pods; a domain after a dot is ignored)
 *   rank:    JOB_COMPLETION_INDEX (an Indexed Job), RANK (torchrun),
 *            SLURM_PROCID, OMPI_COMM_WORLD_RANK
 *   workers: WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PSD_WORKERS
 *            (an Indexed Job sets no count: its manifest sets PSD_WORKERS) */
#ifndef PS_AUTO_H
#define PS_AUTO_H

#include <stddef.h>
#include <stdint.h>

/* 0 with *out in [min, max], or PS_EINVAL with a sentence in err that
 * begins with flag (e.g. "--rank auto"). */
int ps_auto_shard(const char *flag, uint64_t min, uint64_t max, uint64_t *out, char *err,
                  size_t errlen);
int ps_auto_rank(const char *flag, uint64_t min, uint64_t max, uint64_t *out, char *err,
                 size_t errlen);
int ps_auto_workers(const char *flag, uint64_t min, uint64_t max, uint64_t *out, char *err,
                    size_t errlen);

/* N of a host name "NAME-N" or "NAME-N.domain" (N decimal, at most 9
 * digits, NAME not empty), or -1. */
int64_t ps_host_ordinal(const char *host);

#endif
