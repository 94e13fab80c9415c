/* SPDX-License-Identifier: MIT */
/*
 * peer-mutexpool.c - the classic C thread pool, as most C code writes it:
 * one task queue (a ring of {fn, arg}) under one mutex, a condition variable
 * the workers sleep on, one lock/signal per submitted task; and a per-batch
 * counter + mutex + condition variable for the join.  The submitter does not
 * help run tasks.
 */
#include "bench.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

struct mp_task {
	void (*fn)(void *);
	void *arg;
};

struct mp_pool {
	pthread_mutex_t lock;
	pthread_cond_t nonempty;
	pthread_cond_t nonfull;
	struct mp_task *ring;
	size_t cap, head, count;
	bool stop;
	unsigned nthreads;
	pthread_t *threads;
};

struct mp_batch {
	pthread_mutex_t lock;
	pthread_cond_t done;
	unsigned left;
	const struct bwork *w;
	struct mp_child {
		struct mp_batch *b;
	} * kids;
	unsigned max;
};

static void *mp_worker(void *arg)
{
	struct mp_pool *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		while (p->count == 0 && !p->stop)
			pthread_cond_wait(&p->nonempty, &p->lock);
		if (p->count == 0 && p->stop) {
			pthread_mutex_unlock(&p->lock);
			return NULL;
		}
		struct mp_task t = p->ring[p->head];
		p->head = (p->head + 1) % p->cap;
		if (p->count-- == p->cap)
			pthread_cond_signal(&p->nonfull);
		pthread_mutex_unlock(&p->lock);
		t.fn(t.arg);
	}
}

static void mp_add(struct mp_pool *p, void (*fn)(void *), void *arg)
{
	pthread_mutex_lock(&p->lock);
	while (p->count == p->cap)
		pthread_cond_wait(&p->nonfull, &p->lock);
	p->ring[(p->head + p->count) % p->cap] = (struct mp_task){fn, arg};
	p->count++;
	pthread_cond_signal(&p->nonempty);
	pthread_mutex_unlock(&p->lock);
}

static void mp_child(void *arg)
{
	struct mp_child *k = arg;
	struct mp_batch *b = k->b;
	bench_child(b->w);
	pthread_mutex_lock(&b->lock);
	if (--b->left == 0)
		pthread_cond_signal(&b->done);
	pthread_mutex_unlock(&b->lock);
}

static int mp_create(unsigned nthreads, void **out)
{
	struct mp_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->nonempty, NULL);
	pthread_cond_init(&p->nonfull, NULL);
	p->cap = 1 << 16;
	p->ring = calloc(p->cap, sizeof(*p->ring));
	p->threads = calloc(nthreads, sizeof(*p->threads));
	if (!p->ring || !p->threads)
		return -ENOMEM;
	p->nthreads = nthreads;
	for (unsigned i = 0; i < nthreads; i++)
		if (pthread_create(&p->threads[i], NULL, mp_worker, p))
			bench_die("mutexpool: pthread_create failed");
	*out = p;
	return 0;
}

static void mp_destroy(void *ctx)
{
	struct mp_pool *p = ctx;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->nonempty);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	free(p->threads);
	free(p->ring);
	free(p);
}

static void *mp_batch_new(void *ctx, unsigned maxn)
{
	struct mp_batch *b = calloc(1, sizeof(*b));
	if (!b || !(b->kids = calloc(maxn, sizeof(*b->kids))))
		bench_die("out of memory");
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->done, NULL);
	b->max = maxn;
	for (unsigned i = 0; i < maxn; i++)
		b->kids[i].b = b;
	return b;
}

static void mp_batch_free(void *ctx, void *bp)
{
	struct mp_batch *b = bp;
	pthread_mutex_destroy(&b->lock);
	pthread_cond_destroy(&b->done);
	free(b->kids);
	free(b);
}

static void mp_submit(void *ctx, void *bp, unsigned n, const struct bwork *w)
{
	struct mp_batch *b = bp;
	b->w = w;
	pthread_mutex_lock(&b->lock);
	b->left = n;
	pthread_mutex_unlock(&b->lock);
	for (unsigned i = 0; i < n; i++)
		mp_add(ctx, mp_child, &b->kids[i]);
}

static void mp_join(void *ctx, void *bp)
{
	struct mp_batch *b = bp;
	pthread_mutex_lock(&b->lock);
	while (b->left)
		pthread_cond_wait(&b->done, &b->lock);
	pthread_mutex_unlock(&b->lock);
}

const struct peer_ops peer_mutexpool = {
	.name = "mutexpool",
	.desc = "mutex+condvar queue, per-batch counter+condvar join",
	.create = mp_create,
	.destroy = mp_destroy,
	.batch_new = mp_batch_new,
	.batch_free = mp_batch_free,
	.submit = mp_submit,
	.join = mp_join,
	.split_ok = true,
};
