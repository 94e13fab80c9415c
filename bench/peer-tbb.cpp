// SPDX-License-Identifier: MIT
//
// peer-tbb.cpp - oneTBB behind the C harness: one tbb::task_group per batch,
// task_group::run() per child, task_group::wait() as the join (the waiting
// thread executes tasks meanwhile).  Concurrency is limited to the bench's
// thread count with tbb::global_control, i.e. the waiting thread plus N-1
// workers, TBB's own model.
#include "bench.h"

#include <cerrno>
#include <new>
#include <tbb/global_control.h>
#include <tbb/task_group.h>

namespace {

struct tbb_peer {
	tbb::global_control limit;
	explicit tbb_peer(unsigned n)
	    : limit(tbb::global_control::max_allowed_parallelism, n)
	{
	}
};

struct tbb_batch {
	tbb::task_group tg;
};

int tb_create(unsigned nthreads, void **out)
{
	try {
		*out = new tbb_peer(nthreads);
	} catch (const std::bad_alloc &) {
		return -ENOMEM;
	}
	return 0;
}

void tb_destroy(void *ctx)
{
	delete static_cast<tbb_peer *>(ctx);
}

void *tb_batch_new(void *, unsigned)
{
	return new tbb_batch;
}

void tb_batch_free(void *, void *b)
{
	delete static_cast<tbb_batch *>(b);
}

void tb_submit(void *, void *bp, unsigned n, const struct bwork *w)
{
	auto *b = static_cast<tbb_batch *>(bp);
	for (unsigned i = 0; i < n; i++)
		b->tg.run([w] { bench_child(w); });
}

void tb_join(void *, void *bp)
{
	static_cast<tbb_batch *>(bp)->tg.wait();
}

struct peer_ops make_ops()
{
	struct peer_ops o = {};
	o.name = "onetbb";
	o.desc = "tbb::task_group run/wait";
	o.create = tb_create;
	o.destroy = tb_destroy;
	o.batch_new = tb_batch_new;
	o.batch_free = tb_batch_free;
	o.submit = tb_submit;
	o.join = tb_join;
	return o;
}

} // namespace

extern "C" const struct peer_ops peer_tbb = make_ops();
