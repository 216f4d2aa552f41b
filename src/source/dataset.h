/*
 * dataset.h -- naming a dataset (detect.c): which source kind a path names,
 * opening it, and describing an open source. The top of src/source/ (see the
 * module map in source.h); the loader, the dataset API (src/dataset_api.c)
 * and packing use it.
 */
#ifndef STK_DATASET_H
#define STK_DATASET_H

#include "source/source.h"

/* Opens the dataset at path, choosing the source kind from what is there.
 * On failure writes a message naming the path and the reason into err. */
int stk__source_open(stk__source *s, const char *path, const stk__source_params *prm, char *err,
                     size_t errlen);

/* Class c's name: a folder's subfolder, a .stk manifest's name; NULL for
 * kinds that store none, an unnamed class, or c past the classes. */
const char *stk__source_class_name(const stk__source *s, uint64_t c);
/* Fills di for a source opened by stk__source_open. */
void stk__source_describe(const stk__source *s, stk__dataset_info *di);
/* Writes a short key for sample i: the .stk or tar key, CIFAR's
 * "file#record", or for other kinds the name with the leading "root/"
 * removed (a folder's path relative to its root). */
void stk__source_key(const stk__source *s, const char *root, uint64_t i, char *buf, size_t n);

/* ---- Mixtures (mix.c; docs/mixing.md) ------------------------------------
 * n sources as one: child k's sample j is sample offset_k + j (offset_k the
 * children before it's counts). paths are opened with stk__source_open (any
 * kind); shown[k] names child k in messages. The fields are the union of the
 * children's by name, plus "source" (INT: the child's index) when no child
 * has a field of that name. A child failing to open fails the open, naming
 * it. */
int stk__source_mix_open(stk__source *s, const char *const *paths, const char *const *shown,
                         size_t n, const stk__source_params *prm, char *err, size_t errlen);
/* STK_OK when every child has one of the mixture field ids (a requested
 * field's alternatives); else STK_EINVAL naming the field and the child. */
int stk__source_mix_check_field(const stk__source *s, const char *name, const uint32_t *ids,
                                size_t nids, char *err, size_t errlen);
/* Children's sample counts into sizes (up to max); returns the children. */
size_t stk__source_mix_sizes(const stk__source *s, uint64_t *sizes, size_t max);
/* Child k of mixture s (k below its number of sources): its shard table
 * (nshards, shard_first, locate) in its own sample ids, for the per-source
 * shard-aware order. */
const stk__source *stk__source_mix_child(const stk__source *s, size_t k);
/* Whether child k's samples are read through the fetch stage (see mix.c). */
bool stk__source_mix_fetched(const stk__source *s, size_t k);
/* Child k's first shard in the mixture's flattened shard table (its shards
 * are the next stk__source_mix_child(s, k)->nshards when it is fetched). */
size_t stk__source_mix_shard_off(const stk__source *s, size_t k);

#endif
