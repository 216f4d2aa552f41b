/* gpu_bandwidth.c -- the device stage on a real GPU (run by
 * scripts/test-gpu.sh; needs an NVIDIA driver and GPU):
 *
 *   1. peak: host-to-device bandwidth of page-locked memory, 64 MiB copies
 *      back to back on one stream (what CUDA's bandwidthTest calls pinned);
 *   2. stage: a record file of ImageNet-sized uint8 samples (224x224x3,
 *      batches of 256 = 38.5 MB) through the loader with device "cuda:0",
 *      the consumer waiting for each batch's copy on the host, against the
 *      same loader without a device (the rate the host side can deliver):
 *      the copy efficiency is stage / min(host rate, peak), target >= 90 %;
 *   3. end to end: the built-in dataset with imagenet-train to float32,
 *      normalised on the CPU (device none) vs uint8 over the bus and
 *      normalised on the GPU (device cuda), samples/s and their ratio.
 *
 * Side by side in one run; ratios are what to compare across machines.
 *
 *   cc -O2 -Iinclude -Isrc bench/gpu_bandwidth.c build/release/libstoker.a \
 *      $(sed -n 's/^LIB_DEPS := //p' Makefile) -o build/gpu_bandwidth
 *   build/gpu_bandwidth [DATASET]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "device/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double peak_gbps(void)
{
    char err[512];
    stk__dev *d = NULL;
    if (stk__dev_open_cuda(&d, 0, err, sizeof err)) {
        fprintf(stderr, "gpu_bandwidth: %s\n", err);
        exit(1);
    }
    const size_t n = (size_t)64 << 20;
    void *h = NULL;
    stk__dptr dp = 0;
    stk__stream s = NULL;
    stk__event e = NULL;
    if (d->ops->host_alloc(d, n, &h, err, sizeof err) ||
        d->ops->dev_alloc(d, n, &dp, err, sizeof err)) {
        fprintf(stderr, "gpu_bandwidth: %s\n", err);
        exit(1);
    }
    memset(h, 1, n);
    d->ops->enter(d);
    if (d->ops->stream_create(d, &s, err, sizeof err) ||
        d->ops->event_create(d, &e, err, sizeof err)) {
        fprintf(stderr, "gpu_bandwidth: %s\n", err);
        exit(1);
    }
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        for (int k = 0; k < 16; k++)
            d->ops->copy_h2d(d, dp, h, n, s, err, sizeof err);
        d->ops->event_record(d, e, s, err, sizeof err);
        d->ops->event_sync(d, e, err, sizeof err);
        double gbps = 16.0 * (double)n / (now_s() - t0) / 1e9;
        if (gbps > best)
            best = gbps;
    }
    d->ops->event_destroy(d, e);
    d->ops->stream_destroy(d, s);
    d->ops->leave(d);
    d->ops->dev_free(d, dp);
    d->ops->host_free(d, h);
    stk__dev_close(d);
    return best;
}

/* Samples/s and bytes/s of `epochs` epochs through a loader; with a device
 * the consumer waits for each batch's copy on the host. */
static void loader_rate(const char *path, size_t record, const char *transform, const char *dtype,
                        const char *device, int epochs, double *sps, double *bps)
{
    stk_options *o = NULL;
    stk_options_create(&o);
    stk_options_set_source(o, path);
    if (record)
        stk_options_set_records(o, record, 0, 0);
    stk_options_set_batch_size(o, 256);
    if (transform)
        stk_options_set_transform(o, transform);
    stk_options_set(o, "dtype", dtype);
    stk_options_set(o, "device", device);
    double t0 = now_s();
    stk_loader *l = NULL;
    int rc = stk_loader_open(&l, o);
    if (rc) {
        fprintf(stderr, "gpu_bandwidth: %s: %s\n", stk_strerror(rc), stk_loader_errmsg(l));
        exit(1);
    }
    uint64_t samples = 0, bytes = 0;
    for (int e = 0; e < epochs; e++) {
        stk_batch *b;
        while ((rc = stk_loader_next(l, &b)) == STK_OK) {
            if (stk_batch_sync(b) != STK_OK) {
                fprintf(stderr, "gpu_bandwidth: copy failed\n");
                exit(1);
            }
            samples += b->size;
            bytes += b->size * b->sample_bytes;
            stk_batch_release(b);
        }
        if (rc != STK_END) {
            fprintf(stderr, "gpu_bandwidth: %s: %s\n", stk_strerror(rc), stk_loader_errmsg(l));
            exit(1);
        }
    }
    double secs = now_s() - t0;
    stk_loader_close(l);
    stk_options_destroy(o);
    *sps = (double)samples / secs;
    *bps = (double)bytes / secs;
}

int main(int argc, char **argv)
{
    const char *data = argc > 1 ? argv[1] : "data/default";
    double peak = peak_gbps();
    printf("peak H2D (pinned, 64 MiB copies): %.2f GB/s\n", peak);

    const size_t rec = 224 * 224 * 3;
    const size_t n = 256 * 40;
    char path[] = "/dev/shm/stoker-gpu-bw-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    uint8_t *buf = malloc(rec);
    for (size_t i = 0; i < rec; i++)
        buf[i] = (uint8_t)(i * 131);
    for (size_t k = 0; k < n; k++)
        if (write(fd, buf, rec) != (ssize_t)rec) {
            perror("write");
            return 1;
        }
    close(fd);
    free(buf);
    double s_host, b_host, s_dev, b_dev;
    loader_rate(path, rec, NULL, "uint8", "cpu", 3, &s_host, &b_host);
    loader_rate(path, rec, NULL, "uint8", "cuda:0", 3, &s_dev, &b_dev);
    unlink(path);
    double limit = b_host / 1e9 < peak ? b_host / 1e9 : peak;
    printf("records 224x224x3, batch 256: host only %.2f GB/s, to the GPU %.2f GB/s = %.0f %% of "
           "min(host, peak) (target >= 90 %%)\n",
           b_host / 1e9, b_dev / 1e9, 100.0 * b_dev / 1e9 / limit);

    double s_cpu, s_gpu, unused;
    loader_rate(data, 0, "imagenet-train", "float32", "cpu", 2, &s_cpu, &unused);
    loader_rate(data, 0, "imagenet-train", "float32", "cuda:0", 2, &s_gpu, &unused);
    printf("%s imagenet-train float32: normalised on the CPU %.0f samples/s, on the GPU "
           "(uint8 over the bus) %.0f samples/s: %.2fx\n",
           data, s_cpu, s_gpu, s_gpu / s_cpu);
    return 0;
}
