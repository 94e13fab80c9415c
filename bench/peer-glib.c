/* SPDX-License-Identifier: MIT */
/*
 * peer-glib.c - GLib's GThreadPool: an exclusive pool of N threads,
 * g_thread_pool_push() per child; the join is the GLib idiom of an atomic
 * counter whose last decrement signals a GCond under a GMutex.
 */
#include "bench.h"

#include <errno.h>
#include <glib.h>
#include <stdlib.h>

struct gl_batch {
	gint left;
	GMutex lock;
	GCond cond;
	gboolean done;
	const struct bwork *w;
	struct gl_child {
		struct gl_batch *b;
	} * kids;
	unsigned max;
};

static void gl_func(gpointer data, gpointer user)
{
	struct gl_child *k = data;
	struct gl_batch *b = k->b;
	bench_child(b->w);
	if (g_atomic_int_dec_and_test(&b->left)) {
		g_mutex_lock(&b->lock);
		b->done = TRUE;
		g_cond_signal(&b->cond);
		g_mutex_unlock(&b->lock);
	}
}

static int gl_create(unsigned nthreads, void **out)
{
	GError *err = NULL;
	GThreadPool *pool =
		g_thread_pool_new(gl_func, NULL, (gint)nthreads, TRUE, &err);
	if (!pool) {
		fprintf(stderr, "fanout-bench: g_thread_pool_new: %s\n",
			err ? err->message : "?");
		g_clear_error(&err);
		return -EAGAIN;
	}
	*out = pool;
	return 0;
}

static void gl_destroy(void *ctx)
{
	g_thread_pool_free(ctx, FALSE, TRUE);
}

static void *gl_batch_new(void *ctx, unsigned maxn)
{
	struct gl_batch *b = calloc(1, sizeof(*b));
	if (!b || !(b->kids = calloc(maxn, sizeof(*b->kids))))
		bench_die("out of memory");
	g_mutex_init(&b->lock);
	g_cond_init(&b->cond);
	b->max = maxn;
	for (unsigned i = 0; i < maxn; i++)
		b->kids[i].b = b;
	return b;
}

static void gl_batch_free(void *ctx, void *bp)
{
	struct gl_batch *b = bp;
	g_mutex_clear(&b->lock);
	g_cond_clear(&b->cond);
	free(b->kids);
	free(b);
}

static void gl_submit(void *ctx, void *bp, unsigned n, const struct bwork *w)
{
	struct gl_batch *b = bp;
	b->w = w;
	b->done = FALSE;
	g_atomic_int_set(&b->left, (gint)n);
	for (unsigned i = 0; i < n; i++) {
		GError *err = NULL;
		if (!g_thread_pool_push(ctx, &b->kids[i], &err))
			bench_die("g_thread_pool_push: %s",
				  err ? err->message : "?");
	}
}

static void gl_join(void *ctx, void *bp)
{
	struct gl_batch *b = bp;
	g_mutex_lock(&b->lock);
	while (!b->done)
		g_cond_wait(&b->cond, &b->lock);
	g_mutex_unlock(&b->lock);
}

const struct peer_ops peer_glib = {
	.name = "glib",
	.desc = "GThreadPool push, atomic counter + GCond join",
	.create = gl_create,
	.destroy = gl_destroy,
	.batch_new = gl_batch_new,
	.batch_free = gl_batch_free,
	.submit = gl_submit,
	.join = gl_join,
	.split_ok = true,
};
