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
#include <stddef.h>

/* Cache-line aligned (our structs put hot counters on their own lines). */
#define ALLOC_ALIGN 64
void *fanout__alloc(size_t size);
void fanout__free(void *p, size_t size);
/* Give the kernel back the free pages kept for large blocks (alloc.c). */
void fanout__alloc_trim(void);
/* Natural alignment, for strings. */
void *fanout__alloc_small(size_t size);
void fanout__free_small(void *p, size_t size);
/* Fault injection: when > 0, the allocation that takes it to 0 fails. */
extern _Atomic long fanout__fail_alloc_at;

#endif
