/* trace.c -- the loader's event rings and their Chrome trace-event JSON; see
 * trace.h. */
#include "trace/trace.h"

#include <errno.h>
#include <fcntl.h>
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
    uint64_t count[STK__TR_KINDS];
} track;

struct stk__trace {
    char *path;
    uint64_t origin;
    unsigned ntracks;
    uint64_t cap; /* events per track */
    track *tracks;
};

uint64_t stk__trace_bytes(uint64_t events)
{
    return events * sizeof(event);
}

int stk__trace_create(stk__trace **out, const char *path, unsigned tracks, uint64_t events,
                      char *err, size_t errlen)
{
    *out = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        stk__fmt(err, errlen, "cannot create the trace file %s: %s", path, strerror(errno));
        return STK_EIO;
    }
    close(fd);
    stk__trace *t = stk__calloc(1, sizeof *t);
    if (!t)
        return STK_ENOMEM;
    t->ntracks = tracks;
    t->cap = events / tracks < 16 ? 16 : events / tracks;
    t->origin = stk__now_ns();
    t->path = stk__strdup(path);
    t->tracks = stk__calloc(tracks, sizeof *t->tracks);
    int rc = t->path && t->tracks ? STK_OK : STK_ENOMEM;
    for (unsigned k = 0; rc == STK_OK && k < tracks; k++) {
        t->tracks[k].ev = stk__malloc(t->cap * sizeof(event));
        if (!t->tracks[k].ev)
            rc = STK_ENOMEM;
    }
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
    tr->count[kind]++;
}

uint64_t stk__trace_count(const stk__trace *t, int kind)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < t->ntracks; k++)
        n += t->tracks[k].count[kind];
    return n;
}

uint64_t stk__trace_dropped(const stk__trace *t)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < t->ntracks; k++)
        n += t->tracks[k].n > t->cap ? t->tracks[k].n - t->cap : 0;
    return n;
}

static void put_event(FILE *f, unsigned tid, const event *e, uint64_t batch_size)
{
    static const char *const names[STK__TR_KINDS] = {"read", "process", "batch ready", "next",
                                                     "decode", "transform"};
    /* Microseconds with nanosecond digits: the unit trace viewers expect. */
    fprintf(f, ",\n{\"name\":\"%s\",\"pid\":1,\"tid\":%u,\"ts\":%" PRIu64 ".%03u", names[e->kind],
            tid, e->t0 / 1000, (unsigned)(e->t0 % 1000));
    switch (e->kind) {
    case STK__TR_READ:
    case STK__TR_PROCESS:
    case STK__TR_DECODE:
    case STK__TR_TRANSFORM:
        fprintf(f,
                ",\"ph\":\"X\",\"cat\":\"stage\",\"dur\":%" PRIu64 ".%03u,\"args\":{\"sample\":%" PRIu64
                ",\"batch\":%" PRIu64 ",\"slot\":%u}}",
                (e->t1 - e->t0) / 1000, (unsigned)((e->t1 - e->t0) % 1000), e->a, e->b, e->slot);
        break;
    case STK__TR_READY:
        fprintf(f, ",\"ph\":\"i\",\"s\":\"p\",\"cat\":\"batch\",\"args\":{\"batch\":%" PRIu64 "}}",
                e->a);
        break;
    default: {
        static const char *const status[] = {"delivered", "end of epoch", "timeout", "error"};
        fprintf(f,
                ",\"ph\":\"X\",\"cat\":\"consumer\",\"dur\":%" PRIu64 ".%03u,\"args\":{\"batch\":%" PRIu64
                ",\"result\":\"%s\",\"batch_size\":%" PRIu64 "}}",
                (e->t1 - e->t0) / 1000, (unsigned)((e->t1 - e->t0) % 1000), e->a,
                status[e->b < 4 ? e->b : 3], batch_size);
        break;
    }
    }
}

int stk__trace_finish(stk__trace *t, const stk__trace_totals *tot)
{
    size_t plen = strlen(t->path);
    char *tmp = stk__malloc(plen + 5);
    if (!tmp)
        return STK_ENOMEM;
    memcpy(tmp, t->path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "we");
    int rc = f ? STK_OK : STK_EIO;
    if (f) {
        uint64_t kept = 0;
        for (unsigned k = 0; k < t->ntracks; k++)
            kept += t->tracks[k].n < t->cap ? t->tracks[k].n : t->cap;
        fprintf(f,
                "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"stoker\",\"events\":%" PRIu64
                ",\"dropped_events\":%" PRIu64 ",\"read_items\":%" PRIu64
                ",\"process_items\":%" PRIu64 ",\"samples_delivered\":%" PRIu64
                ",\"batches_delivered\":%" PRIu64 ",\"batch_size\":%" PRIu64
                "},\n\"traceEvents\":[\n"
                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":"
                "\"stoker loader\"}}",
                kept, stk__trace_dropped(t), tot->read_items, tot->process_items,
                tot->samples_delivered, tot->batches_delivered, tot->batch_size);
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
        if (ferror(f))
            rc = STK_EIO;
        if (fclose(f))
            rc = STK_EIO;
    }
    if (rc == STK_OK && rename(tmp, t->path))
        rc = STK_EIO;
    if (rc != STK_OK) {
        unlink(tmp);
        unlink(t->path);
    }
    stk__free(tmp);
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
    stk__free(t->path);
    stk__free(t);
}
