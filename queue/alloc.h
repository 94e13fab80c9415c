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
#include <stdint.h>

/* Cache-line aligned (our structs put hot counters on their own lines). */
#define ALLOC_ALIGN 64
void *fanout__alloc(size_t size);
void fanout__free(void *p, size_t size);

/*
 * A cache of large blocks (records of big batches), one per engine; see
 * alloc.c.  Blocks of FA_CACHE_MIN bytes and more are rounded up to a power
 * of two, and *got says the size to free them with.
 */
#define FA_CACHE_MIN_SHIFT 14 /* 16 KiB */
#define FA_CACHE_MAX_SHIFT 24 /* 16 MiB */
#define FA_CACHE_CLASSES (FA_CACHE_MAX_SHIFT - FA_CACHE_MIN_SHIFT + 1)
#define FA_CACHE_SLOTS 32
#define FA_CACHE_BYTES ((size_t)32 << 20) /* at most this much kept */
struct fa_cache {
	_Atomic size_t
		bytes; /* A: bytes held in the slots, <= FA_CACHE_BYTES */
	_Atomic uint64_t hits; /* A: a statistic for the tests */
	_Atomic(void *) slot[FA_CACHE_CLASSES][FA_CACHE_SLOTS]
		__attribute__((aligned(ALLOC_ALIGN)));
};
void fa_cache_init(struct fa_cache *c);
void *fa_cache_alloc(struct fa_cache *c, size_t size, size_t *got);
void fa_cache_free(struct fa_cache *c, void *p, size_t size);
/* Free every cached block; nothing may use @c concurrently. */
void fa_cache_drain(struct fa_cache *c);
/* Natural alignment, for strings. */
void *fanout__alloc_small(size_t size);
void fanout__free_small(void *p, size_t size);
/* mallctl() of the allocator above; ENOSYS without jemalloc. */
int fanout__mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp,
		    size_t newlen);
/* Fault injection: when > 0, the allocation that takes it to 0 fails. */
extern _Atomic long fanout__fail_alloc_at;

#endif
