/* SPDX-License-Identifier: MIT */
/*
 * annotate.h - ThreadSanitizer hand-off annotations that vanish otherwise.
 *
 * Concurrency Kit's ck_pr loads and stores are plain volatile accesses, and
 * Debian's liburcu 0.13 has no TSan annotations, so TSan cannot see the
 * happens-before edges they create.  We state those edges ourselves, at the
 * points where OUR objects cross threads through THEIR structures:
 *
 *   FQ_HANDOFF_RELEASE(obj)  before publishing obj (ring enqueue, lfht add)
 *   FQ_HANDOFF_ACQUIRE(obj)  after taking it out (dequeue, lookup match)
 *
 * Suppressions (tests/tsan.supp) name only functions inside the libraries;
 * races in our own code are never suppressed.
 */
#ifndef FANOUT_QUEUE_ANNOTATE_H
#define FANOUT_QUEUE_ANNOTATE_H

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FQ_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define FQ_TSAN 1
#endif

#ifdef FQ_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define FQ_HANDOFF_RELEASE(obj) __tsan_release((void *)(obj))
#define FQ_HANDOFF_ACQUIRE(obj) __tsan_acquire((void *)(obj))
#else
#define FQ_HANDOFF_RELEASE(obj) ((void)(obj))
#define FQ_HANDOFF_ACQUIRE(obj) ((void)(obj))
#endif

#endif
