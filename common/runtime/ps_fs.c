/* Folders (ps_fs.h). */
#include "ps_fs.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

int ps_mkdirs(const char *dir, mode_t mode)
{
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *q = p + 1; *q != '\0'; q++) {
        if (*q != '/')
            continue;
        *q = '\0';
        if (mkdir(p, mode) != 0 && errno != EEXIST)
            return -1;
        *q = '/';
    }
    return mkdir(p, mode) != 0 && errno != EEXIST ? -1 : 0;
}
