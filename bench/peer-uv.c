/* SPDX-License-Identifier: MIT */
/*
 * peer-uv.c - libuv's threadpool: uv_queue_work() per child, the work
 * callback on a pool thread, the completion (after_work) callback through
 * the event loop on the submitting thread, which counts the batch down.
 * The pool size is UV_THREADPOOL_SIZE, set to the bench's thread count
 * before libuv first uses it; the pool is process-wide and lives until exit.
 */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

struct uv_batch {
	uv_work_t *reqs;
	unsigned max;
	unsigned left;
	const struct bwork *w;
};

struct uv_peer {
	uv_loop_t loop;
};

static void uvp_work(uv_work_t *req)
{
	struct uv_batch *b = req->data;
	bench_child(b->w);
}

static void uvp_after(uv_work_t *req, int status)
{
	struct uv_batch *b = req->data;
	if (status)
		bench_die("libuv: work failed: %s", uv_strerror(status));
	b->left--;
}

static int uvp_create(unsigned nthreads, void **out)
{
	static bool sized;
	char buf[16];
	if (!sized) {
		snprintf(buf, sizeof(buf), "%u", nthreads);
		setenv("UV_THREADPOOL_SIZE", buf, 1);
		sized = true;
	}
	struct uv_peer *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	int rc = uv_loop_init(&p->loop);
	if (rc) {
		free(p);
		return rc;
	}
	*out = p;
	return 0;
}

static void uvp_destroy(void *ctx)
{
	struct uv_peer *p = ctx;
	uv_run(&p->loop, UV_RUN_DEFAULT);
	uv_loop_close(&p->loop);
	free(p);
}

static void *uvp_batch_new(void *ctx, unsigned maxn)
{
	struct uv_batch *b = calloc(1, sizeof(*b));
	if (!b || !(b->reqs = calloc(maxn, sizeof(*b->reqs))))
		bench_die("out of memory");
	b->max = maxn;
	for (unsigned i = 0; i < maxn; i++)
		b->reqs[i].data = b;
	return b;
}

static void uvp_batch_free(void *ctx, void *bp)
{
	struct uv_batch *b = bp;
	free(b->reqs);
	free(b);
}

static void uvp_submit(void *ctx, void *bp, unsigned n, const struct bwork *w)
{
	struct uv_peer *p = ctx;
	struct uv_batch *b = bp;
	b->w = w;
	b->left = n;
	for (unsigned i = 0; i < n; i++) {
		int rc = uv_queue_work(&p->loop, &b->reqs[i], uvp_work,
				       uvp_after);
		if (rc)
			bench_die("uv_queue_work: %s", uv_strerror(rc));
	}
}

static void uvp_join(void *ctx, void *bp)
{
	struct uv_peer *p = ctx;
	struct uv_batch *b = bp;
	while (b->left)
		uv_run(&p->loop, UV_RUN_ONCE);
}

const struct peer_ops peer_uv = {
	.name = "libuv",
	.desc = "uv_queue_work, completions via the loop",
	.create = uvp_create,
	.destroy = uvp_destroy,
	.batch_new = uvp_batch_new,
	.batch_free = uvp_batch_free,
	.submit = uvp_submit,
	.join = uvp_join,
};
