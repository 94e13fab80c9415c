/* SPDX-License-Identifier: MIT */
/*
 * blocks.h - a cache of large record blocks (records of big batches), one
 * per engine; see blocks.c.  Blocks of 1 << BLOCKS_MIN_SHIFT bytes and more
 * are rounded up to a power of two, and *got says the size to free them
 * with.  Smaller ones go straight to the allocator (queue/alloc.h).
 * Any thread may alloc and free concurrently; drain only when nothing
 * else uses the cache.
 */
#ifndef FANOUT_LIB_BLOCKS_H
#define FANOUT_LIB_BLOCKS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define BLOCKS_MIN_SHIFT 14 /* 16 KiB */
#define BLOCKS_MAX_SHIFT 24 /* 16 MiB */
#define BLOCKS_CLASSES (BLOCKS_MAX_SHIFT - BLOCKS_MIN_SHIFT + 1)
#define BLOCKS_SLOTS 32
#define BLOCKS_BYTES ((size_t)32 << 20) /* at most this much kept */
#define BLOCKS_ALIGN 64

struct fanout_blocks {
	_Atomic size_t bytes;  /* A: bytes held in the slots, <= BLOCKS_BYTES */
	_Atomic uint64_t hits; /* A: a statistic for the tests */
	_Atomic(void *) slot[BLOCKS_CLASSES][BLOCKS_SLOTS] /* A */
		__attribute__((aligned(BLOCKS_ALIGN)));
};

void fanout__blocks_init(struct fanout_blocks *c);
void *fanout__blocks_alloc(struct fanout_blocks *c, size_t size, size_t *got);
void fanout__blocks_free(struct fanout_blocks *c, void *p, size_t size);
/* Free every cached block; nothing may use @c concurrently. */
void fanout__blocks_drain(struct fanout_blocks *c);

#endif
