// SPDX-License-Identifier: MIT
//
// barcheck-tbb.cpp - oneTBB for bench/barcheck.c: a tbb::task_group per
// batch, run() per child, wait() as the join (the waiting thread runs
// tasks meanwhile, TBB's own model), at most @nthreads threads in all
// (tbb::global_control).  Every child calls barcheck_child().
#include <cstdint>
#include <ctime>
#include <memory>
#include <tbb/global_control.h>
#include <tbb/task_group.h>

extern "C" void barcheck_child(void);
extern "C" unsigned barcheck_clock_every(unsigned k);

namespace {

std::unique_ptr<tbb::global_control> limit;
std::unique_ptr<tbb::task_group[]> groups;
unsigned ngroups;

uint64_t now_ns()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void start(tbb::task_group &g, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		g.run([] { barcheck_child(); });
}

} // namespace

extern "C" int barcheck_tbb_init(unsigned nthreads, unsigned maxgroups)
{
	limit.reset(new tbb::global_control(
		tbb::global_control::max_allowed_parallelism, nthreads));
	groups.reset(new tbb::task_group[maxgroups]);
	ngroups = maxgroups;
	return 0;
}

extern "C" void barcheck_tbb_fini(void)
{
	groups.reset();
	limit.reset();
}

// Batches of @n children, @k of them in flight (wait for the oldest, start
// a new one), for @dur_ns.  Returns the children joined.
extern "C" uint64_t barcheck_tbb_stream(unsigned n, unsigned k, uint64_t dur_ns)
{
	uint64_t done = 0, end = now_ns() + dur_ns;
	unsigned head = 0, tick = 0, every;
	bool more = true;
	if (k > ngroups)
		k = ngroups;
	every = barcheck_clock_every(k);
	for (unsigned i = 0; i < k; i++)
		start(groups[i], n);
	for (unsigned live = k; live; head = (head + 1) % k) {
		groups[head].wait();
		done += n;
		live--;
		if (more && ++tick % every == 0 && now_ns() >= end)
			more = false;
		if (more) {
			start(groups[head], n);
			live++;
		}
	}
	return done;
}

// One batch of @n: run, then wait.
extern "C" void barcheck_tbb_batch(unsigned n)
{
	start(groups[0], n);
	groups[0].wait();
}
