/* Folders: what the processes need of the file system beyond stdio. */
#ifndef PS_FS_H
#define PS_FS_H

#include <sys/types.h>

/* mkdir -p: dir and the folders above it that are missing, with mode.
 * 0, or -1 with errno set (ENAMETOOLONG past PATH_MAX). */
int ps_mkdirs(const char *dir, mode_t mode);

#endif
