/* SPDX-License-Identifier: MIT */
/*
 * child.c - what a running child may call.
 *
 * Correctness: every call here touches only the calling child's own result
 * slot (c->res) and owned[] byte, which no other thread reads until the
 * join's release/acquire (join.c); or it reads the record's `cancel` word,
 * an atomic.  A struct fanout_child lives on the runner's stack for exactly
 * the duration of the child function, so a child that keeps the pointer
 * past its return is outside the contract.  After fanout_defer() the slot
 * belongs to whoever finishes the pending child, so the setters refuse.
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define MAX_TEXT (16u << 20)

char *fanout__str_dup(const char *s, size_t len)
{
	size_t size = sizeof(size_t) + len + 1;
	size_t *p = fanout__alloc_small(size);
	char *d;

	if (!p)
		return NULL;
	*p = size;
	d = (char *)(p + 1);
	memcpy(d, s, len);
	d[len] = '\0';
	return d;
}

void fanout__str_free(const char *s)
{
	size_t *p;

	if (!s)
		return;
	p = (size_t *)(void *)s - 1;
	fanout__free_small(p, *p);
}

bool fanout_interrupted(const struct fanout_child *c)
{
	if (!c)
		return false;
	/* acquire: pairs with the release fetch_or in fanout__cancel_rec(). */
	return atomic_load_explicit(&c->rec->cancel, memory_order_acquire) &
	       FANOUT_CANCEL_INTERRUPT;
}

/* The record now owns a string in a result slot: the free must look. */
void fanout__mark_strings(struct record *rec)
{
	/* relaxed: read by the RCU callback that frees the record, which
	 * every child's writes happen before (join acq_rel, then the refcount
	 * and call_rcu); loaded first so only the first string writes it. */
	if (!atomic_load_explicit(&rec->strings, memory_order_relaxed))
		atomic_store_explicit(&rec->strings, true,
				      memory_order_relaxed);
}

int fanout_set_summary(struct fanout_child *c, const char *s, size_t len)
{
	char *d;

	if (!c || c->pending || (!s && len) || len > MAX_TEXT)
		return -EINVAL;
	d = fanout__str_dup(s ? s : "", len);
	if (!d)
		return -ENOMEM;
	fanout__str_free(c->res->summary);
	c->res->summary = d;
	fanout__mark_strings(c->rec);
	return 0;
}

int fanout_set_error(struct fanout_child *c, const char *msg)
{
	size_t len;
	char *d;

	if (!c || c->pending || !msg)
		return -EINVAL;
	len = strnlen(msg, MAX_TEXT + 1);
	if (len > MAX_TEXT)
		return -EINVAL;
	d = fanout__str_dup(msg, len);
	if (!d)
		return -ENOMEM;
	if (c->rec->owned[c->index] & OWN_ERROR)
		fanout__str_free(c->res->error);
	c->res->error = d;
	c->rec->owned[c->index] |= OWN_ERROR;
	fanout__mark_strings(c->rec);
	return 0;
}

int fanout_add_cost(struct fanout_child *c, double x)
{
	double sum;

	if (!c || c->pending || !isfinite(x) || x < 0)
		return -EINVAL;
	/* A sum past the largest double is refused, as by
	 * fanout_pending_add_cost(): no child's cost is ever +inf. */
	sum = c->res->cost + x;
	if (!isfinite(sum))
		return -EINVAL;
	c->res->cost = sum;
	return 0;
}

unsigned fanout_child_index(const struct fanout_child *c)
{
	return c ? c->index : 0;
}

unsigned fanout_child_depth(const struct fanout_child *c)
{
	return c ? c->rec->depth : 0;
}

fanout_id fanout_child_id(const struct fanout_child *c)
{
	return c ? c->rec->id : 0;
}

struct fanout_child *fanout_current_child(void)
{
	return fanout__current();
}
