/*
 * file.h -- the library's local file calls, in one place.
 *
 * Every open/read/pread/stat/fstat/opendir/readdir the library makes on a
 * local file goes through these wrappers, for two reasons:
 *   - EINTR is retried here, once for every caller (a signal arriving during
 *     a read is never an error);
 *   - tests can make the n-th call fail (stk__iofault_arm), the way
 *     stk__alloc_fail_after makes the n-th allocation fail, and sweep n over
 *     a whole session (tests/c/test_iofault.c).
 * In the test library (STK_TEST, see internal.h) each wrapper costs one
 * atomic load over the system call while unarmed; in the installed library
 * the fault check is not compiled in.
 *
 * Same contracts as the system calls, except that none returns EINTR. Reads
 * may still be short (as the system calls may be): callers loop, or use
 * stk__pread_upto.
 */
#ifndef STK_IO_FILE_H
#define STK_IO_FILE_H

#include "internal.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

int stk__open(const char *path, int flags, ...); /* mode_t third argument with O_CREAT */
int stk__close(int fd);
ssize_t stk__read(int fd, void *buf, size_t n);
ssize_t stk__pread(int fd, void *buf, size_t n, off_t off);
ssize_t stk__preadv(int fd, const struct iovec *iov, int iovcnt, off_t off);
ssize_t stk__write_fd(int fd, const void *buf, size_t n);
ssize_t stk__pwrite(int fd, const void *buf, size_t n, off_t off);
int stk__fsync(int fd);
/* Allocates the blocks of [off, off+len) (extending the file): 0, or -1 with
 * errno (EOPNOTSUPP where the filesystem cannot, ENOSPC when full). */
int stk__fallocate(int fd, off_t off, off_t len);
int stk__fstat(int fd, struct stat *st);
int stk__stat(const char *path, struct stat *st);
int stk__lstat(const char *path, struct stat *st);
DIR *stk__opendir(const char *path);
/* readdir; NULL with errno 0 at the end, NULL with errno set on an error. */
struct dirent *stk__readdir(DIR *d);
int stk__closedir(DIR *d);
/* The calls a writer makes besides open/write (packing, src/pack/): they go
 * through here too so that the fault sweep reaches them. mkdir and unlink
 * are path calls; flock takes a descriptor (stk__fsync is above). */
int stk__mkdir(const char *path, mode_t mode);
int stk__unlink(const char *path);
int stk__flock(int fd, int op);

/* Reads up to n bytes at off, looping over short reads: fewer than n only at
 * end of file. -1 with errno on an error. */
ssize_t stk__pread_upto(int fd, void *buf, size_t n, off_t off);

/* ---- Fault injection (test hooks: STK_TEST builds only, see internal.h) --
 * stk__iofault_arm(kind, n, sticky): the n-th next call (0 = the very next)
 * that the fault kind applies to fails that way; with sticky, every applicable
 * call after it fails too. kind 0 (or n < 0) disarms. Kinds and the calls they
 * apply to:
 *   STK__IOF_EIO     every call: -1/NULL with EIO
 *   STK__IOF_EINTR   every call but readdir/close: -1 with EINTR (the wrappers
 *                    retry, so callers never see it)
 *   STK__IOF_SHORT   read/pread/preadv/write of more than one byte: about half
 *                    the bytes are transferred
 *   STK__IOF_ENOENT  path calls (open, stat, lstat, opendir, mkdir, unlink):
 *                    -1/NULL with ENOENT
 *   STK__IOF_ENOSPC  calls that store bytes (write, pwrite, fallocate, fsync):
 *                    -1 with ENOSPC, as on a full disk
 * stk__iofault_calls(): applicable calls since the last arm (arm with
 * n = LONG_MAX to count a fault-free session). stk__iofault_fired(): faults
 * injected since the last arm. */
enum {
    STK__IOF_NONE = 0,
    STK__IOF_EIO,
    STK__IOF_EINTR,
    STK__IOF_SHORT,
    STK__IOF_ENOENT,
    STK__IOF_ENOSPC
};
#ifdef STK_TEST
void stk__iofault_arm(int kind, long n, int sticky);
long stk__iofault_calls(void);
long stk__iofault_fired(void);
#endif

#endif
