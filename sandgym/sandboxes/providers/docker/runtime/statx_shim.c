/* gVisor release-20221219 rejects statx(..., AT_NO_AUTOMOUNT) with EINVAL (fixed upstream in
 * release-20230227); coreutils 9 (ls, stat) always passes it. The flag is a no-op for
 * stat-like calls on a kernel without automounts, so drop it and make the raw syscall. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
