/* trace.c -- the loader's event rings and their Chrome trace-event JSON; see
 * trace.h. */
#include "trace/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct event {
    uint64_t t0, t1; /* ns since the trace began */
    uint64_t a, b;
    uint32_t slot;
    uint32_t kind;
} event;

typedef struct track {
    event *ev;
    uint64_t n; /* events recorded on this track (the ring keeps the last cap) */
} track;

struct stk__trace {
    char *path;
    char *tmp; /* the temporary file the events go to, renamed over path */
    int fd;    /* open on tmp from create until finish (-1 after) */
    uint64_t origin;
    unsigned ntracks;
    uint64_t cap; /* events per track */
    track *tracks;
};

uint64_t stk__trace_bytes(uint64_t events)
{
    return events * sizeof(event);
}

/* The first bytes of every file stk__trace_finish writes: what marks an
 * existing file as a trace that may be replaced. */
static const char trace_magic[] = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":"
                                  "\"stoker\"";

/* May `path` be replaced by a trace? Yes when nothing is there, or an empty
 * regular file (what an interrupted run of an older stoker left), or a
 * regular file that begins as a stoker trace does. Anything else (another
 * file, a directory, a symlink, a FIFO) is someone's data: refused, with
 * the reason in err. */
static int check_target(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return STK_OK;
        stk__fmt(err, errlen, "cannot use %s as the trace file: %s", path, strerror(errno));
        return STK_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        stk__fmt(err, errlen,
                 "%s exists and is not a regular file; the trace is written only to a new "
                 "file or over an earlier trace",
                 path);
        return STK_EINVAL;
    }
    if (st.st_size == 0)
        return STK_OK;
    char head[sizeof trace_magic];
    ssize_t n = -1;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), why = errno;
    if (fd >= 0) {
        n = read(fd, head, sizeof trace_magic - 1);
        why = errno;
        close(fd);
    }
    if (n < 0) {
        stk__fmt(err, errlen, "cannot read %s to check that it is a trace: %s", path,
                 strerror(why));
        return STK_EIO;
    }
    if ((size_t)n != sizeof trace_magic - 1 || memcmp(head, trace_magic, sizeof trace_magic - 1)) {
        stk__fmt(err, errlen,
                 "%s exists and is not a stoker trace; the trace is written only to a new file "
                 "or over an earlier trace (choose another path)",
                 path);
        return STK_EINVAL;
    }
    return STK_OK;
}

/* Creates the temporary file in the target's directory (so the rename at
 * finish stays on one filesystem and is atomic): ".NAME.XXXXXXXXXXXX" with a
 * suffix that is not predictable, opened with O_EXCL | O_NOFOLLOW so it is
 * always a new file of ours, never something a name points to. */
static int open_temp(stk__trace *t, char *err, size_t errlen)
{
    const char *path = t->path, *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0, plen = strlen(path);
    t->tmp = stk__malloc(plen + 24);
    if (!t->tmp)
        return STK_ENOMEM;
    static _Atomic uint64_t counter; /* relaxed: only needs to differ per call */
    int err_no = EEXIST;
    for (int attempt = 0; attempt < 64 && t->fd < 0 && err_no == EEXIST; attempt++) {
        uint64_t x =
            stk__now_ns() ^ ((uint64_t)getpid() << 32) ^
            (atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed) * 0x9E3779B97F4A7C15ull);
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r)
            x ^= r;
        x ^= x >> 29;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 32;
        snprintf(t->tmp, plen + 24, "%.*s.%s.%012" PRIx64, (int)dirlen, path, path + dirlen,
                 (uint64_t)(x & 0xFFFFFFFFFFFFull));
        t->fd = open(t->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        err_no = t->fd < 0 ? errno : 0;
    }
    if (t->fd < 0) {
        stk__fmt(err, errlen, "cannot create the trace file %s (its temporary file %s): %s", path,
                 t->tmp, strerror(err_no));
        return STK_EIO;
    }
    return STK_OK;
}

int stk__trace_create(stk__trace **out, const char *path, unsigned tracks, uint64_t events,
                      char *err, size_t errlen)
{
    *out = NULL;
    int rc = check_target(path, err, errlen);
    if (rc != STK_OK)
        return rc;
    stk__trace *t = stk__calloc(1, sizeof *t);
    if (!t)
        return STK_ENOMEM;
    t->fd = -1;
    t->ntracks = tracks;
    t->cap = events / tracks < 16 ? 16 : events / tracks;
    t->origin = stk__now_ns();
    t->path = stk__strdup(path);
    t->tracks = stk__calloc(tracks, sizeof *t->tracks);
    rc = t->path && t->tracks ? STK_OK : STK_ENOMEM;
    for (unsigned k = 0; rc == STK_OK && k < tracks; k++) {
        t->tracks[k].ev = stk__malloc(t->cap * sizeof(event));
        if (!t->tracks[k].ev)
            rc = STK_ENOMEM;
    }
    if (rc == STK_OK)
        rc = open_temp(t, err, errlen);
    if (rc != STK_OK) {
        stk__trace_destroy(t);
        return rc;
    }
    *out = t;
    return STK_OK;
}

void stk__trace_event(stk__trace *t, unsigned track_id, int kind, uint64_t t0, uint64_t t1,
                      uint64_t a, uint64_t b, uint32_t slot)
{
    track *tr = &t->tracks[track_id];
    event *e = &tr->ev[tr->n % t->cap];
    e->t0 = t0 > t->origin ? t0 - t->origin : 0;
    e->t1 = t1 > t->origin ? t1 - t->origin : 0;
    e->a = a;
    e->b = b;
    e->slot = slot;
    e->kind = (uint32_t)kind;
    tr->n++;
}

/* Events recorded but no longer held by their track's ring. */
static uint64_t trace_dropped(const stk__trace *t)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < t->ntracks; k++)
        n += t->tracks[k].n > t->cap ? t->tracks[k].n - t->cap : 0;
    return n;
}

static void put_event(FILE *f, unsigned tid, const event *e, uint64_t batch_size)
{
    static const char *const names[STK__TR_KINDS] = {"read", "process", "batch ready",
                                                     "next", "decode",  "transform"};
    /* Microseconds with nanosecond digits: the unit trace viewers expect. */
    fprintf(f, ",\n{\"name\":\"%s\",\"pid\":1,\"tid\":%u,\"ts\":%" PRIu64 ".%03u", names[e->kind],
            tid, e->t0 / 1000, (unsigned)(e->t0 % 1000));
    switch (e->kind) {
    case STK__TR_READ:
    case STK__TR_PROCESS:
    case STK__TR_DECODE:
    case STK__TR_TRANSFORM:
        fprintf(f,
                ",\"ph\":\"X\",\"cat\":\"stage\",\"dur\":%" PRIu64
                ".%03u,\"args\":{\"sample\":%" PRIu64 ",\"batch\":%" PRIu64 ",\"slot\":%u}}",
                (e->t1 - e->t0) / 1000, (unsigned)((e->t1 - e->t0) % 1000), e->a, e->b, e->slot);
        break;
    case STK__TR_READY:
        fprintf(f, ",\"ph\":\"i\",\"s\":\"p\",\"cat\":\"batch\",\"args\":{\"batch\":%" PRIu64 "}}",
                e->a);
        break;
    default: {
        static const char *const status[] = {"delivered", "end of epoch", "timeout", "error"};
        fprintf(f,
                ",\"ph\":\"X\",\"cat\":\"consumer\",\"dur\":%" PRIu64
                ".%03u,\"args\":{\"batch\":%" PRIu64 ",\"result\":\"%s\",\"batch_size\":%" PRIu64
                "}}",
                (e->t1 - e->t0) / 1000, (unsigned)((e->t1 - e->t0) % 1000), e->a,
                status[e->b < 4 ? e->b : 3], batch_size);
        break;
    }
    }
}

int stk__trace_finish(stk__trace *t, const stk__trace_totals *tot)
{
    if (t->fd < 0)
        return STK_EIO;
    FILE *f = fdopen(t->fd, "w");
    if (!f) {
        close(t->fd);
        t->fd = -1;
        unlink(t->tmp);
        return STK_EIO;
    }
    t->fd = -1; /* the stream owns it now */
    int rc = STK_OK;
    if (f) {
        uint64_t kept = 0;
        for (unsigned k = 0; k < t->ntracks; k++)
            kept += t->tracks[k].n < t->cap ? t->tracks[k].n : t->cap;
        fprintf(
            f,
            "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"stoker\",\"events\":%" PRIu64
            ",\"dropped_events\":%" PRIu64 ",\"read_items\":%" PRIu64 ",\"process_items\":%" PRIu64
            ",\"samples_delivered\":%" PRIu64 ",\"batches_delivered\":%" PRIu64
            ",\"batch_size\":%" PRIu64 "},\n\"traceEvents\":[\n"
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":"
            "\"stoker loader\"}}",
            kept, trace_dropped(t), tot->read_items, tot->process_items, tot->samples_delivered,
            tot->batches_delivered, tot->batch_size);
        for (unsigned k = 0; k < t->ntracks; k++) {
            if (k == 0)
                fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,"
                           "\"args\":{\"name\":\"consumer\"}}");
            else
                fprintf(f,
                        ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,"
                        "\"args\":{\"name\":\"worker %u\"}}",
                        k, k - 1);
            const track *tr = &t->tracks[k];
            uint64_t first = tr->n > t->cap ? tr->n - t->cap : 0;
            for (uint64_t i = first; i < tr->n; i++)
                put_event(f, k, &tr->ev[i % t->cap], tot->batch_size);
        }
        fprintf(f, "\n]}\n");
        if (fflush(f) || ferror(f))
            rc = STK_EIO;
        if (fclose(f))
            rc = STK_EIO;
    }
    /* The target is checked again: something may have been put at the path
     * during the run, and it is not ours to replace. On any failure the
     * previous file at the path stays as it was. */
    char why[8];
    if (rc == STK_OK && check_target(t->path, why, sizeof why) != STK_OK)
        rc = STK_EIO;
    if (rc == STK_OK && rename(t->tmp, t->path))
        rc = STK_EIO;
    if (rc != STK_OK)
        unlink(t->tmp);
    return rc;
}

void stk__trace_destroy(stk__trace *t)
{
    if (!t)
        return;
    if (t->tracks)
        for (unsigned k = 0; k < t->ntracks; k++)
            stk__free(t->tracks[k].ev);
    stk__free(t->tracks);
    if (t->fd >= 0) {
        /* Never finished (the open failed after it, or finish was not
         * reached): the temporary file goes, the target was never touched. */
        close(t->fd);
        unlink(t->tmp);
    }
    stk__free(t->tmp);
    stk__free(t->path);
    stk__free(t);
}
