/* SPDX-License-Identifier: MIT */
/*
 * alloc.h - the one allocator every fanout layer uses.
 *
 * jemalloc's mallocx/sdallocx in the shipped build (a record is usually
 * allocated on the caller's thread and freed on another; jemalloc's
 * per-thread caches and sized deallocation make that cheap), the system
 * allocator in sanitizer builds (ASan/TSan replace malloc).  Every
 * allocation goes through here, so fault injection can fail the k-th one.
 */
#ifndef FANOUT_QUEUE_ALLOC_H
#define FANOUT_QUEUE_ALLOC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Cache-line aligned (our structs put hot counters on their own lines). */
#define ALLOC_ALIGN 64
void *fanout__alloc(size_t size);
void fanout__free(void *p, size_t size);
/* The fault-injection check fanout__alloc() makes, and the allocation it
 * makes after it: for an allocator built on this one (lib/blocks.c) that
 * must fail where fanout__alloc() would, and only once. */
bool fanout__alloc_fault(void);
void *fanout__alloc_unchecked(size_t size);

/* Natural alignment, for strings. */
void *fanout__alloc_small(size_t size);
void fanout__free_small(void *p, size_t size);
/* mallctl() of the allocator above; ENOSYS without jemalloc. */
int fanout__mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp,
		    size_t newlen);
/* Fault injection: when > 0, the allocation that takes it to 0 fails. */
extern _Atomic long fanout__fail_alloc_at;

#endif
