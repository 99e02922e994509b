/* Shared regions for same-host clients: memfd, sealing, SCM_RIGHTS. */
#define _GNU_SOURCE
#include "ps_shm.h"

#include "ps_err.h"
#include "ps_limits.h"
#include "ps_local.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static const char MAGIC[8] = {'P', 'S', 'D', 'S', 'H', 'M', '0', '1'};
#define HAND_BYTES 16 /* magic, then the token (host order: same host) */

int ps_shm_create(size_t size, struct ps_shm *out, char *err, size_t errlen)
{
    out->fd = -1;
    out->base = NULL;
    out->size = 0;
    long page = sysconf(_SC_PAGESIZE);
    size_t p = page > 0 ? (size_t)page : 4096u;
    if (size < PS_SHM_BYTES_MIN || size > PS_SHM_BYTES_MAX)
        return ps_errf(PS_ELIMIT, err, errlen, "shared region of %zu bytes: outside [%u, %llu]",
                       size, PS_SHM_BYTES_MIN, (unsigned long long)PS_SHM_BYTES_MAX);
    size = (size + p - 1) / p * p;
    int fd = memfd_create("psc-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return ps_errf(PS_EIO, err, errlen, "memfd_create: %s", strerror(errno));
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        int e = errno;
        close(fd);
        return ps_errf(PS_EIO, err, errlen, "shared region of %zu bytes: %s", size, strerror(e));
    }
    out->fd = fd;
    out->base = base;
    out->size = size;
    return 0;
}

void ps_shm_close(struct ps_shm *r)
{
    if (r->base != NULL)
        munmap(r->base, r->size);
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    r->base = NULL;
    r->size = 0;
}

/* The fd socket's address: the local endpoint's abstract name + "/shm". */
static int address(const char *local, struct sockaddr_un *sa, socklen_t *len)
{
    if (strncmp(local, PS_LOCAL_PREFIX, strlen(PS_LOCAL_PREFIX)) != 0)
        return -1;
    const char *name = local + strlen("ipc://@");
    size_t n = strlen(name);
    if (n + 5 > sizeof sa->sun_path - 1)
        return -1;
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path + 1, name, n);
    memcpy(sa->sun_path + 1 + n, "/shm", 4);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n + 4);
    return 0;
}

int ps_shm_hand(const char *local, int fd, uint64_t token, int timeout_ms, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    socklen_t salen;
    if (address(local, &sa, &salen) != 0)
        return ps_errf(PS_EINVAL, err, errlen, "'%s' is not a local endpoint", local);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return ps_errf(PS_EIO, err, errlen, "socket: %s", strerror(errno));
    int rc = 0;
    unsigned char msg[HAND_BYTES];
    memcpy(msg, MAGIC, 8);
    memcpy(msg + 8, &token, 8);
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {msg, sizeof msg};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    unsigned char answer = 0;
    struct pollfd pfd = {s, POLLIN, 0};
    /* connect and send wait at most timeout_ms too (a Unix socket's
     * connect waits while the listener's backlog is full) */
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&sa, salen) != 0)
        rc = ps_errf(PS_ECLOSED, err, errlen, "%s/shm: connect: %s", local, strerror(errno));
    else if (sendmsg(s, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof msg)
        rc = ps_errf(PS_EIO, err, errlen, "%s/shm: send: %s", local, strerror(errno));
    else if (poll(&pfd, 1, timeout_ms) != 1)
        rc = ps_errf(PS_ETIMEDOUT, err, errlen, "%s/shm: no answer in %d ms", local, timeout_ms);
    else if (recv(s, &answer, 1, 0) != 1 || answer != 1)
        rc = ps_errf(PS_EREMOTE, err, errlen, "%s/shm: the shard refused the region", local);
    close(s);
    return rc;
}

int ps_shm_listen(const char *local, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    socklen_t salen;
    if (address(local, &sa, &salen) != 0)
        return ps_errf(PS_EINVAL, err, errlen, "'%s' is not a local endpoint", local);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return ps_errf(PS_EIO, err, errlen, "socket: %s", strerror(errno));
    if (bind(s, (struct sockaddr *)&sa, salen) != 0 || listen(s, (int)PS_SHM_CONNS_MAX) != 0) {
        int e = errno;
        close(s);
        return ps_errf(PS_EIO, err, errlen, "%s/shm: %s", local, strerror(e));
    }
    return s;
}

int ps_shm_take(int conn, uint64_t *token, void **base, size_t *size, char *err, size_t errlen)
{
    unsigned char msg[HAND_BYTES + 1];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct iovec iov = {msg, sizeof msg};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return PS_SHM_PENDING;
    /* every descriptor that came is ours to close */
    int fds[4], nfds = 0;
    for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm != NULL;
         cm = CMSG_NXTHDR(&mh, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfds < 4; i++)
                memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
    int rc = 0;
    struct stat st;
    int seals = 0, mode = 0;
    if (n < 0)
        rc = ps_errf(PS_EIO, err, errlen, "receive: %s", strerror(errno));
    else if (n != HAND_BYTES || memcmp(msg, MAGIC, 8) != 0)
        rc = ps_errf(PS_EPROTO, err, errlen, "a hand-over of %zd bytes without the magic", n);
    else if ((mh.msg_flags & MSG_CTRUNC) || nfds != 1)
        rc = ps_errf(PS_EPROTO, err, errlen, "a hand-over needs exactly one descriptor (%d came%s)",
                     nfds, (mh.msg_flags & MSG_CTRUNC) ? ", more cut off" : "");
    else if (memcmp(msg + 8, &(uint64_t){0}, 8) == 0)
        rc = ps_errf(PS_EPROTO, err, errlen,
                     "a hand-over under token 0 (a region is handed over under the non-zero token "
                     "its hello names)");
    else if (fstat(fds[0], &st) != 0 || !S_ISREG(st.st_mode))
        rc = ps_errf(PS_EPROTO, err, errlen, "the descriptor is not a regular file");
    else if (st.st_size < (off_t)PS_SHM_BYTES_MIN || (uint64_t)st.st_size > PS_SHM_BYTES_MAX)
        rc = ps_errf(PS_ELIMIT, err, errlen, "a region of %lld bytes: outside [%u, %llu]",
                     (long long)st.st_size, PS_SHM_BYTES_MIN, (unsigned long long)PS_SHM_BYTES_MAX);
    else if ((seals = fcntl(fds[0], F_GET_SEALS)) < 0 || !(seals & F_SEAL_SHRINK))
        rc = ps_errf(PS_EPROTO, err, errlen, "the region is not sealed against shrinking");
    else if ((mode = fcntl(fds[0], F_GETFL)) < 0 || (mode & O_ACCMODE) != O_RDWR)
        rc = ps_errf(PS_EPROTO, err, errlen, "the region is not open for reading and writing");
    if (rc == 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
        if (p == MAP_FAILED)
            rc = ps_errf(PS_EIO, err, errlen, "cannot map the region: %s", strerror(errno));
        else {
            memcpy(token, msg + 8, 8);
            *base = p;
            *size = (size_t)st.st_size;
        }
    }
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    return rc;
}

void ps_shm_answer(int conn, int taken)
{
    unsigned char b = taken ? 1 : 0;
    ssize_t w = send(conn, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)w;
}
