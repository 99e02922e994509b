/* CPU pinning: lists of CPUs written as taskset -c and the kernel's
 * cpuset files write them ("0,2-3"), checked against the CPUs this process
 * may run on, and applied to every thread of the process.
 *
 * Where a worker and a shard share a small machine, keeping the training
 * thread on one core and the servers and ZeroMQ's I/O threads on another
 * stops them from taking turns on both (tests/bench/HISTORY.md, "Pinning"). */
#ifndef PS_CPUS_H
#define PS_CPUS_H

#include <stddef.h>

/* CPUs in a list at most (and the highest CPU number + 1 accepted). */
#define PS_CPUS_MAX 1024

struct ps_cpus {
    int n; /* CPUs in cpu[], ascending, no repeats; 0: no list */
    int cpu[PS_CPUS_MAX];
};

/* Parses s ("N", "A-B", comma-separated) into out. Every CPU must be one
 * this process may run on now (sched_getaffinity). 0, or PS_EINVAL with
 * a sentence in err that names flag, the bad item and the allowed CPUs. */
int ps_cpus_parse(const char *flag, const char *s, struct ps_cpus *out, char *err, size_t errlen);

/* Writes the list back in the same form ("0,2-3") into buf. */
void ps_cpus_format(const struct ps_cpus *c, char *buf, size_t len);

/* Pins every thread this process has now to c; threads started later
 * inherit it from the thread that starts them. 0, or PS_EINVAL (err). */
int ps_cpus_pin_process(const struct ps_cpus *c, char *err, size_t errlen);

/* CPUs the calling thread may run on (1 when that cannot be read). */
int ps_cpus_allowed(void);

/* The list of them, ascending (n 0 when it cannot be read). */
void ps_cpus_allowed_list(struct ps_cpus *out);

#endif
