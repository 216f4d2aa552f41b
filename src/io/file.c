/* file.c -- local file calls with EINTR retried in one place, and (in the
 * test library only, STK_TEST) the hook that makes the n-th call fail (see
 * file.h). */
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/file.h>
#include <unistd.h>

#define M(k)    (1u << (k))
#define M_PATH  (M(STK__IOF_EIO) | M(STK__IOF_EINTR) | M(STK__IOF_ENOENT))
#define M_FD    (M(STK__IOF_EIO) | M(STK__IOF_EINTR))
#define M_IO(n) (M_FD | ((n) > 1 ? M(STK__IOF_SHORT) : 0u))
#define M_STORE M(STK__IOF_ENOSPC)

#ifdef STK_TEST
/* The countdown only needs each decrement to be atomic (which thread's call
 * is the n-th does not matter); the kind is published last, with release, so
 * a call that sees it armed sees the countdown it was armed with (arming
 * while a loader's threads run, as the mid-run sweep does). */
static atomic_int g_kind;
static atomic_int g_sticky;
static atomic_long g_left = -1;
static atomic_long g_calls;
static atomic_long g_fired;

void stk__iofault_arm(int kind, long n, int sticky)
{
    atomic_store_explicit(&g_kind, STK__IOF_NONE, memory_order_relaxed);
    atomic_store_explicit(&g_calls, 0, memory_order_relaxed);
    atomic_store_explicit(&g_fired, 0, memory_order_relaxed);
    atomic_store_explicit(&g_left, n, memory_order_relaxed);
    atomic_store_explicit(&g_sticky, sticky, memory_order_relaxed);
    if (n >= 0 && kind > STK__IOF_NONE && kind <= STK__IOF_ENOSPC)
        atomic_store_explicit(&g_kind, kind, memory_order_release);
}

long stk__iofault_calls(void)
{
    return atomic_load_explicit(&g_calls, memory_order_relaxed);
}

long stk__iofault_fired(void)
{
    return atomic_load_explicit(&g_fired, memory_order_relaxed);
}

/* The fault this call gets (STK__IOF_NONE almost always). mask: the kinds
 * that apply to the call. */
static int fault(unsigned mask)
{
    int k = atomic_load_explicit(&g_kind, memory_order_acquire);
    if (k == STK__IOF_NONE || !(mask & M((unsigned)k)))
        return STK__IOF_NONE;
    atomic_fetch_add_explicit(&g_calls, 1, memory_order_relaxed);
    long prev = atomic_fetch_sub_explicit(&g_left, 1, memory_order_relaxed);
    if (prev > 0 || (prev < 0 && !atomic_load_explicit(&g_sticky, memory_order_relaxed)))
        return STK__IOF_NONE;
    atomic_fetch_add_explicit(&g_fired, 1, memory_order_relaxed);
    return k;
}
#else
/* The installed library injects no faults: the checks fold away. */
static inline int fault(unsigned mask)
{
    (void)mask;
    return STK__IOF_NONE;
}
#endif

/* Sets errno for an error fault and says whether the call fails with it. */
static bool fail_with(int f)
{
    switch (f) {
    case STK__IOF_EIO: errno = EIO; return true;
    case STK__IOF_EINTR: errno = EINTR; return true;
    case STK__IOF_ENOENT: errno = ENOENT; return true;
    case STK__IOF_ENOSPC: errno = ENOSPC; return true;
    default: return false;
    }
}

/* A short transfer keeps about half of n (n > 1 here). */
static size_t shorten(int f, size_t n)
{
    return f == STK__IOF_SHORT ? n / 2 : n;
}

int stk__open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    /* O_TMPFILE includes O_DIRECTORY's bit: test it whole. */
    if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, unsigned);
        va_end(ap);
    }
    for (;;) {
        int fd = fail_with(fault(M_PATH)) ? -1 : open(path, flags, mode);
        if (fd >= 0 || errno != EINTR)
            return fd;
    }
}

int stk__close(int fd)
{
    /* Never retried: on Linux the descriptor is gone even when close fails. */
    return close(fd);
}

ssize_t stk__read(int fd, void *buf, size_t n)
{
    for (;;) {
        int f = fault(M_IO(n));
        ssize_t r = fail_with(f) ? -1 : read(fd, buf, shorten(f, n));
        if (r >= 0 || errno != EINTR)
            return r;
    }
}

ssize_t stk__pread(int fd, void *buf, size_t n, off_t off)
{
    for (;;) {
        int f = fault(M_IO(n));
        ssize_t r = fail_with(f) ? -1 : pread(fd, buf, shorten(f, n), off);
        if (r >= 0 || errno != EINTR)
            return r;
    }
}

ssize_t stk__preadv(int fd, const struct iovec *iov, int iovcnt, off_t off)
{
    size_t total = 0;
    for (int k = 0; k < iovcnt; k++)
        total += iov[k].iov_len;
    for (;;) {
        int f = fault(M_IO(total));
        ssize_t r;
        if (fail_with(f))
            r = -1;
        else if (f == STK__IOF_SHORT) {
            /* The first half of the bytes, whichever buffers hold them. */
            struct iovec cut[8];
            size_t want = total / 2;
            int m = 0;
            for (int k = 0; k < iovcnt && m < 8 && want; k++) {
                if (!iov[k].iov_len)
                    continue;
                cut[m] = iov[k];
                if (cut[m].iov_len > want)
                    cut[m].iov_len = want;
                want -= cut[m].iov_len;
                m++;
            }
            r = preadv(fd, cut, m, off);
        } else
            r = preadv(fd, iov, iovcnt, off);
        if (r >= 0 || errno != EINTR)
            return r;
    }
}

ssize_t stk__write_fd(int fd, const void *buf, size_t n)
{
    for (;;) {
        int f = fault(M_IO(n) | M_STORE);
        ssize_t r = fail_with(f) ? -1 : write(fd, buf, shorten(f, n));
        if (r >= 0 || errno != EINTR)
            return r;
    }
}

ssize_t stk__pwrite(int fd, const void *buf, size_t n, off_t off)
{
    for (;;) {
        int f = fault(M_IO(n) | M_STORE);
        ssize_t r = fail_with(f) ? -1 : pwrite(fd, buf, shorten(f, n), off);
        if (r >= 0 || errno != EINTR)
            return r;
    }
}

int stk__fsync(int fd)
{
    for (;;) {
        int r = fail_with(fault(M_FD | M_STORE)) ? -1 : fsync(fd);
        if (r == 0 || errno != EINTR)
            return r;
    }
}

int stk__fallocate(int fd, off_t off, off_t len)
{
    for (;;) {
        int r;
        if (fail_with(fault(M_FD | M_STORE)))
            r = -1;
        else {
#ifdef __linux__
            /* fallocate(2), not posix_fallocate: glibc's posix_fallocate
             * emulates an unsupporting filesystem by writing every block,
             * where the caller would rather fall back to a sparse file. */
            r = fallocate(fd, 0, off, len);
#else
            int e = posix_fallocate(fd, off, len);
            r = e ? -1 : 0;
            if (e)
                errno = e == EINVAL ? EOPNOTSUPP : e;
#endif
        }
        if (r == 0 || errno != EINTR)
            return r;
    }
}

int stk__fstat(int fd, struct stat *st)
{
    for (;;) {
        int r = fail_with(fault(M_FD)) ? -1 : fstat(fd, st);
        if (r == 0 || errno != EINTR)
            return r;
    }
}

int stk__stat(const char *path, struct stat *st)
{
    for (;;) {
        int r = fail_with(fault(M_PATH)) ? -1 : stat(path, st);
        if (r == 0 || errno != EINTR)
            return r;
    }
}

int stk__lstat(const char *path, struct stat *st)
{
    for (;;) {
        int r = fail_with(fault(M_PATH)) ? -1 : lstat(path, st);
        if (r == 0 || errno != EINTR)
            return r;
    }
}

DIR *stk__opendir(const char *path)
{
    for (;;) {
        DIR *d = fail_with(fault(M_PATH)) ? NULL : opendir(path);
        if (d || errno != EINTR)
            return d;
    }
}

struct dirent *stk__readdir(DIR *d)
{
    if (fail_with(fault(M(STK__IOF_EIO))))
        return NULL;
    errno = 0;
    return readdir(d);
}

int stk__closedir(DIR *d)
{
    return closedir(d);
}

int stk__mkdir(const char *path, mode_t mode)
{
    for (;;) {
        int r = fail_with(fault(M_PATH)) ? -1 : mkdir(path, mode);
        if (r == 0 || errno != EINTR)
            return r;
    }
}

int stk__unlink(const char *path)
{
    for (;;) {
        int r = fail_with(fault(M_PATH)) ? -1 : unlink(path);
        if (r == 0 || errno != EINTR)
            return r;
    }
}

int stk__flock(int fd, int op)
{
    for (;;) {
        int r = fail_with(fault(M_FD)) ? -1 : flock(fd, op);
        if (r == 0 || errno != EINTR)
            return r;
    }
}

ssize_t stk__pread_upto(int fd, void *buf, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = stk__pread(fd, (uint8_t *)buf + got, n - got, off + (off_t)got);
        if (k < 0)
            return -1;
        if (k == 0)
            break;
        got += (size_t)k;
    }
    return (ssize_t)got;
}
