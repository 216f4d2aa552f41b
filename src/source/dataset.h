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

#endif
