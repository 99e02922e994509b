/* One multipart receive and the allocator tuning (ps_zmsg.h). */
#include "ps_zmsg.h"

#include <malloc.h>

int ps_zmsg_recv(void *sock, int flags, zmq_msg_t *parts, size_t max, size_t *kept, size_t *total,
                 uint64_t *bytes)
{
    zmq_msg_t extra;
    int more = 1;
    *kept = 0;
    *total = 0;
    while (more) {
        zmq_msg_t *m = *kept < max ? &parts[*kept] : &extra;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, *total == 0 ? flags : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            for (size_t i = 0; i < *kept; i++)
                zmq_msg_close(&parts[i]);
            *kept = 0;
            return -1;
        }
        more = zmq_msg_more(m);
        (*total)++;
        if (bytes != NULL)
            *bytes += zmq_msg_size(m);
        if (m == &extra)
            zmq_msg_close(m); /* excess parts are counted, not kept */
        else
            (*kept)++;
    }
    return 0;
}

void ps_malloc_tune(void)
{
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20); /* freed memory stays for the next message */
}
