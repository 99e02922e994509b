/* netdelay: packet latency and loss where the kernel has no sch_netem.
 *
 *   netdelay --queue N --delay-ms D [--loss P] [--seed S]
 *
 * Takes the packets an iptables NFQUEUE rule sends to queue N (in the
 * network namespace it runs in), holds each D ms and lets it go, in
 * order, as netem's delay does; drops a fraction P of them at random, as
 * netem's loss does. Only the packets' metadata is copied to user space.
 * Writes "ready" to stderr once bound (the test waits for it), and on
 * SIGTERM or SIGINT lets every held packet go and writes "packets N
 * dropped M".
 * Uses libnetfilter_queue from Debian. A test tool, not part of psd. */
#define _GNU_SOURCE /* ppoll */
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#ifndef NF_ACCEPT /* linux/netfilter.h's verdicts (that header clashes with netinet/in.h) */
#define NF_DROP   0
#define NF_ACCEPT 1
#endif

#define HELD_MAX (1u << 16) /* packets held at once; the queue's length too */

struct held {
    uint32_t id;
    uint64_t due_us;
};

static struct held ring[HELD_MAX];
static uint32_t head, count;
static uint64_t delay_us, packets, dropped;
static double loss;
static uint64_t rng = 0x9e3779b97f4a7c15u;
static volatile sig_atomic_t stop;

static uint64_t now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

static double uniform(void) /* xorshift64*: reproducible with --seed */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1du) >> 11) / 9007199254740992.0;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa,
                     void *data)
{
    (void)msg;
    (void)data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (ph == NULL)
        return 0;
    uint32_t id = ntohl(ph->packet_id);
    packets++;
    if (uniform() < loss || count == HELD_MAX) {
        dropped++;
        return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
    }
    ring[(head + count) % HELD_MAX] = (struct held){id, now_us() + delay_us};
    count++;
    return 0;
}

/* Lets go every held packet due by `until`: one verdict for the newest
 * due covers all before it (ids grow, and dropped ones have theirs). */
static void release(struct nfq_q_handle *qh, uint64_t until)
{
    uint32_t n = 0;
    while (n < count && ring[(head + n) % HELD_MAX].due_us <= until)
        n++;
    if (n == 0)
        return;
    nfq_set_verdict_batch(qh, ring[(head + n - 1) % HELD_MAX].id, NF_ACCEPT);
    head = (head + n) % HELD_MAX;
    count -= n;
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: netdelay --queue N --delay-ms D [--loss FRACTION] [--seed S]\n");
    return 2;
}

int main(int argc, char **argv)
{
    long queue = -1;
    double delay_ms = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        char *end;
        double v = strtod(argv[i + 1], &end);
        if (*end != '\0' || end == argv[i + 1]) {
            fprintf(stderr, "netdelay: %s: '%s' is not a number\n", argv[i], argv[i + 1]);
            return 2;
        }
        if (strcmp(argv[i], "--queue") == 0 && v >= 0 && v <= 65535 && v == (long)v)
            queue = (long)v;
        else if (strcmp(argv[i], "--delay-ms") == 0 && v >= 0 && v <= 10000)
            delay_ms = v;
        else if (strcmp(argv[i], "--loss") == 0 && v >= 0 && v <= 1)
            loss = v;
        else if (strcmp(argv[i], "--seed") == 0 && v >= 1)
            rng = (uint64_t)v;
        else {
            fprintf(stderr, "netdelay: %s %s: unknown option or out of range\n", argv[i],
                    argv[i + 1]);
            return 2;
        }
    }
    if (queue < 0 || delay_ms < 0 || argc % 2 != 1)
        return usage();
    delay_us = (uint64_t)(delay_ms * 1000.0 + 0.5);
    struct nfq_handle *h = nfq_open();
    if (h == NULL) {
        fprintf(stderr, "netdelay: cannot open nfnetlink_queue: %s\n", strerror(errno));
        return 1;
    }
    struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)queue, on_packet, NULL);
    if (qh == NULL || nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
        fprintf(stderr, "netdelay: cannot bind queue %ld: %s\n", queue, strerror(errno));
        nfq_close(h);
        return 1;
    }
    nfq_set_queue_maxlen(qh, HELD_MAX);
    nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO); /* whole GSO packets */
    int fd = nfq_fd(h);
    int big = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    fprintf(stderr, "ready\n");
    static char buf[1 << 16];
    while (!stop) {
        uint64_t now = now_us();
        release(qh, now);
        uint64_t wait_us = 100000;
        if (count > 0) {
            uint64_t due = ring[head].due_us;
            wait_us = due > now ? due - now : 0;
        }
        struct timespec ts = {(time_t)(wait_us / 1000000u), (long)(wait_us % 1000000u) * 1000L};
        struct pollfd p = {fd, POLLIN, 0};
        int r = ppoll(&p, 1, &ts, NULL);
        if (r < 0 && errno != EINTR)
            break;
        while (r > 0) { /* drain what is there */
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) {
                if (errno == ENOBUFS) /* the kernel dropped some: they count as lost */
                    continue;
                break;
            }
            nfq_handle_packet(h, buf, (int)n);
        }
    }
    release(qh, UINT64_MAX);
    nfq_destroy_queue(qh);
    nfq_close(h);
    fprintf(stderr, "packets %llu dropped %llu\n", (unsigned long long)packets,
            (unsigned long long)dropped);
    return 0;
}
