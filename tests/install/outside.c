/* A program outside the tree: built against the installed libpsclient
 * with nothing but `pkg-config --cflags --libs libpsclient`. Creates a
 * table on the psd at argv[1], pushes a gradient, pulls the weights back
 * and checks them; prints what it found. Exit 0 only when all was right. */
#include <psclient.h>

#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: outside ENDPOINT\n");
        return 2;
    }
    const char *servers[] = {argv[1]};
    struct psc_config cfg = {
        .struct_size = sizeof cfg, .servers = servers, .nservers = 1, .connect_timeout_ms = 10000};
    struct psc_client *c = NULL;
    char err[256];
    if (psc_create(&cfg, &c, err, sizeof err) != 0) {
        fprintf(stderr, "psc_create: %s\n", err);
        return 1;
    }
    struct psc_table_spec spec;
    psc_table_spec_init(&spec, "outside", 8);
    spec.lr = 0.5f;
    uint32_t t = 0;
    int rc = psc_table_create(c, &spec, 10000, &t);
    float g[8], w[8];
    for (int i = 0; i < 8; i++)
        g[i] = (float)i;
    uint64_t ticket = 0;
    if (rc == 0)
        rc = psc_push(c, t, 0, 8, g, 0, &ticket);
    if (rc == 0)
        rc = psc_wait(c, ticket, 10000);
    if (rc == 0)
        rc = psc_pull(c, t, 0, 8, w, 0, &ticket);
    if (rc == 0)
        rc = psc_wait(c, ticket, 10000);
    if (rc != 0) {
        fprintf(stderr, "%s (%s): %s\n", psc_err_name(rc), psc_strerror(rc), psc_last_error(c));
        psc_destroy(c);
        return 1;
    }
    int bad = 0;
    for (int i = 0; i < 8; i++)
        bad += w[i] != -0.5f * (float)i; /* zero weights, one SGD step */
    printf("pulled %g %g ... %g after one push; %s = \"%s\"\n", w[0], w[1], w[7],
           psc_err_name(PS_ETIMEDOUT), psc_strerror(PS_ETIMEDOUT));
    psc_destroy(c);
    return bad != 0;
}
