/* SPDX-License-Identifier: MIT */
/*
 * peer-omp.c - OpenMP tasks (gcc's libgomp).  Every measurement runs inside
 * one `parallel num_threads(N)` region with the driver in `single`; the
 * other threads wait at the region's barrier and execute tasks.
 *
 *   run (one batch in flight):  #pragma omp taskgroup { N x #pragma omp task }
 *   submit/join (several in flight): the children are tasks with
 *     depend(in: batch), the join is `taskwait depend(inout: batch)`, which
 *     waits for exactly that batch's tasks (OpenMP 5.0).
 *
 * The thread that waits executes tasks meanwhile, as OpenMP does.
 */
#include "bench.h"

#include <errno.h>
#include <omp.h>
#include <stdlib.h>

struct omp_peer {
	int nthreads;
};

struct omp_batch {
	char tag; /* dependence object of this batch */
};

static int om_create(unsigned nthreads, void **out)
{
	struct omp_peer *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->nthreads = (int)nthreads;
	*out = p;
	return 0;
}

static void om_destroy(void *ctx)
{
	free(ctx);
}

static void om_enter(void *ctx, void (*body)(void *), void *arg)
{
	struct omp_peer *p = ctx;
#pragma omp parallel num_threads(p->nthreads)
#pragma omp single
	body(arg);
}

static void *om_batch_new(void *ctx, unsigned maxn)
{
	struct omp_batch *b = calloc(1, sizeof(*b));
	if (!b)
		bench_die("out of memory");
	return b;
}

static void om_batch_free(void *ctx, void *b)
{
	free(b);
}

static void om_run(void *ctx, void *bp, unsigned n, const struct bwork *w)
{
#pragma omp taskgroup
	{
		for (unsigned i = 0; i < n; i++) {
#pragma omp task firstprivate(w)
			bench_child(w);
		}
	}
}

static void om_submit(void *ctx, void *bp, unsigned n, const struct bwork *w)
{
	struct omp_batch *b = bp;
	char *tag = &b->tag;
	(void)tag;
	for (unsigned i = 0; i < n; i++) {
#pragma omp task firstprivate(w) depend(in : tag[0])
		bench_child(w);
	}
}

static void om_join(void *ctx, void *bp)
{
	struct omp_batch *b = bp;
	char *tag = &b->tag;
	(void)tag;
#pragma omp taskwait depend(inout : tag[0])
}

const struct peer_ops peer_omp = {
	.name = "openmp",
	.desc = "libgomp tasks in a taskgroup (taskwait depend when >1 in "
		"flight)",
	.create = om_create,
	.destroy = om_destroy,
	.enter = om_enter,
	.batch_new = om_batch_new,
	.batch_free = om_batch_free,
	.submit = om_submit,
	.join = om_join,
	.run = om_run,
};
