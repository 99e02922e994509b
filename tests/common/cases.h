/* Malformed-request cases shared by the decoder unit test and the
 * over-the-socket integration test. Each case builds its frames into a
 * caller-provided buffer set and names the error code the server must
 * answer with. `server_only` cases need server state (tables) to fail and
 * pass the decoder alone. */
#ifndef PSTEST_CASES_H
#define PSTEST_CASES_H

#include "ps.pb-c.h"

#include <stddef.h>
#include <stdint.h>

#define CASE_FRAMES_MAX      6
#define CASE_FRAME_BYTES_MAX (128u * 1024u)

struct case_msg {
    size_t nframes;
    size_t size[CASE_FRAMES_MAX];
    unsigned char *data[CASE_FRAMES_MAX]; /* each CASE_FRAME_BYTES_MAX bytes */
};

struct bad_case {
    const char *name;
    int expect;      /* PS_E* code in the reply */
    int server_only; /* needs a table with id 0 of 1000 elements on shard 0 of 1 */
    void (*build)(struct case_msg *m);
};

extern const struct bad_case bad_cases[];

/* A dense table spec for tests: `size` elements of 1.0 (constant init),
 * SGD at lr 0.5, momentum 0.9, Adam's betas 0.9/0.999 and eps 1e-8 for
 * the tests that pick another optimizer. */
void case_table_spec(Ps__TableSpec *s, const char *name, uint64_t size);
/* A sparse table spec: rows of dim floats, zeros at first, SGD at lr. */
void case_sparse_spec(Ps__TableSpec *s, const char *name, uint32_t dim, uint64_t rows_max,
                      float lr);
extern const size_t bad_cases_count;

/* Allocates and frees the frame buffers of a case_msg. */
int case_msg_alloc(struct case_msg *m);
void case_msg_free(struct case_msg *m);
/* Frame 0: h packed (the message's only frame so far). */
void case_put_header(struct case_msg *m, const Ps__Header *h);
/* Appends a frame of `bytes` (its buffer is the caller's to fill). */
void case_add_frame(struct case_msg *m, size_t bytes);

/* Value-bytes limit the cases assume (the server runs with this). */
#define CASE_MAX_MESSAGE_BYTES (1024u * 1024u)
/* ...and with this --max-table-bytes. */
#define CASE_TABLE_BYTES_MAX 4096000u

#endif
