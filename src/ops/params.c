/*
 * params.c -- random parameters of torchvision's RandomResizedCrop, drawn
 * from the sample's counter-based generator instead of torch's global one.
 * The algorithm (and its integer rounding) follows torchvision 0.14's
 * RandomResizedCrop.get_params line by line so the distribution of crops is
 * the same.
 */
#include "ops/ops.h"

#include <math.h>

/* Python's round() on a float: half to even, which is what rint does in the
 * default rounding mode. */
static double py_round(double x)
{
    return nearbyint(x);
}

void stk__rrc_params(stk__rng *rng, uint32_t width, uint32_t height, const double scale[2],
                     const double ratio[2], uint32_t out[4], int *fallback)
{
    const double area = (double)height * (double)width;
    const double lr0 = log(ratio[0]), lr1 = log(ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target_area = area * (scale[0] + (scale[1] - scale[0]) * stk__rng_uniform(rng));
        double aspect = exp(lr0 + (lr1 - lr0) * stk__rng_uniform(rng));
        double wf = py_round(sqrt(target_area * aspect));
        double hf = py_round(sqrt(target_area / aspect));
        if (wf > 0 && wf <= (double)width && hf > 0 && hf <= (double)height) {
            uint32_t w = (uint32_t)wf, h = (uint32_t)hf;
            out[0] = (uint32_t)stk__rng_below(rng, (uint64_t)(height - h) + 1);
            out[1] = (uint32_t)stk__rng_below(rng, (uint64_t)(width - w) + 1);
            out[2] = h;
            out[3] = w;
            if (fallback)
                *fallback = 0;
            return;
        }
    }
    double in_ratio = (double)width / (double)height;
    double rmin = ratio[0] < ratio[1] ? ratio[0] : ratio[1];
    double rmax = ratio[0] < ratio[1] ? ratio[1] : ratio[0];
    uint32_t w, h;
    if (in_ratio < rmin) {
        w = width;
        h = (uint32_t)py_round((double)w / rmin);
    } else if (in_ratio > rmax) {
        h = height;
        w = (uint32_t)py_round((double)h * rmax);
    } else {
        w = width;
        h = height;
    }
    /* Rounding can overshoot by one on tiny images; torchvision would then
     * crop outside the image, which PIL pads with black. Clamp instead. */
    if (h > height)
        h = height;
    if (w > width)
        w = width;
    if (h == 0)
        h = 1;
    if (w == 0)
        w = 1;
    out[0] = (height - h) / 2;
    out[1] = (width - w) / 2;
    out[2] = h;
    out[3] = w;
    if (fallback)
        *fallback = 1;
}
