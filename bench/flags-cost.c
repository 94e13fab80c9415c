/* SPDX-License-Identifier: MIT */
/*
 * flags-cost.c - what the opt-in flags of issue 13 save, per child:
 * FANOUT_NO_CHILD_CLOCK (engine) and FANOUT_BORROW_TASKS (batch), each
 * against the default (children timed, tasks and goals copied).
 *
 *   build/plain/flags-cost [ROUNDS]      (default 31)
 *
 * Two shapes, no-op children:
 *   solo  fanout_run() on an engine with max_children 1: the calling
 *         thread runs every child itself, no other thread involved, so
 *         the figure is the library's own per-child path (claim, run,
 *         clock, result slot) plus the per-batch cost spread over the
 *         batch - the part the flags change, without cross-core noise;
 *   par   fanout_dispatch() + fanout_wait() on a default engine of every
 *         CPU (the shape of the bench's "fanout" row).
 * The four configurations take turns inside every round, so a noisy
 * neighbour hits them alike; medians (and minima) over the rounds are
 * printed, with the load average; on a shared host the minima are the
 * steadier figure.  Not a test: nothing here asserts.
 */
#include <fanout.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int noop(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

#define NCONF 4
static const char *const conf_name[NCONF] = {"default", "no-clock", "borrow",
					     "both"};

/* ns per child of @reps batches of @n children through @e. */
static double batch_ns(struct fanout_engine *e, bool par,
		       const struct fanout_task *t, unsigned n, unsigned flags,
		       unsigned reps)
{
	struct fanout_batch b = {.tasks = t, .ntasks = n, .flags = flags};
	struct fanout_event *ev;
	uint64_t t0 = fanout_now_ns();

	for (unsigned r = 0; r < reps; r++) {
		int rc = par ? fanout_dispatch(e, &b, NULL) :
			       fanout_run(e, &b, &ev);

		if (!rc && par)
			rc = fanout_wait(fanout_default_sink(e), &ev, 10000);
		if (rc || ev->ncompleted != n) {
			fprintf(stderr, "flags-cost: %s\n",
				fanout_strerror(rc));
			exit(1);
		}
		fanout_event_free(ev);
	}
	return (double)(fanout_now_ns() - t0) / ((double)reps * n);
}

int main(int argc, char **argv)
{
	static const unsigned sizes[] = {1, 64, 512, 4096};
	const unsigned nsizes = sizeof(sizes) / sizeof(sizes[0]);
	unsigned rounds = argc > 1 ? (unsigned)atoi(argv[1]) : 31;
	struct fanout_task *t = calloc(4096, sizeof(*t));
	double *v = calloc((size_t)rounds * 2 * nsizes * NCONF, sizeof(*v));
	struct fanout_engine *eng[2][2]; /* [par][no-clock] */
	double load[3];

	if (!t || !v || rounds < 1)
		return 2;
	for (unsigned i = 0; i < 4096; i++)
		t[i] = (struct fanout_task){"a goal of some length", noop,
					    NULL};
	for (int par = 0; par < 2; par++)
		for (int nc = 0; nc < 2; nc++) {
			struct fanout_config cfg = {
				.flags = FANOUT_NO_PIN |
					 (nc ? FANOUT_NO_CHILD_CLOCK : 0),
				.workers = par ? 0 : 1,
				.max_children = par ? 0 : 1,
				.spin_ns = par ? 0 : 1};

			if (fanout_create(&cfg, &eng[par][nc]))
				return 1;
		}
	if (getloadavg(load, 3) == 3)
		printf("load average at start: %.2f %.2f %.2f\n", load[0],
		       load[1], load[2]);
	for (unsigned r = 0; r < rounds; r++)
		for (int par = 0; par < 2; par++)
			for (unsigned s = 0; s < nsizes; s++) {
				unsigned n = sizes[s];
				/* ~20k children per figure; parked batch-1
				 * dispatches are slow, 500 of them do. */
				unsigned reps = 20000 / n;

				reps = reps < 20 ? 20 : reps;
				if (par && n == 1)
					reps = 500;
				for (int c = 0; c < NCONF; c++)
					v[((size_t)(par * nsizes + s) * NCONF +
					   c) * rounds +
					  r] = batch_ns(eng[par][c & 1], par, t,
							n,
							c & 2 ? FANOUT_BORROW_TASKS :
								0,
							reps);
			}
	if (getloadavg(load, 3) == 3)
		printf("load average at end:   %.2f %.2f %.2f\n", load[0],
		       load[1], load[2]);
	printf("ns per no-op child, median (min) of %u rounds\n", rounds);
	printf("%-5s %6s", "shape", "batch");
	for (int c = 0; c < NCONF; c++)
		printf(" %18s", conf_name[c]);
	printf("\n");
	for (int par = 0; par < 2; par++)
		for (unsigned s = 0; s < nsizes; s++) {
			printf("%-5s %6u", par ? "par" : "solo", sizes[s]);
			for (int c = 0; c < NCONF; c++) {
				double *x =
					&v[((size_t)(par * nsizes + s) * NCONF +
					    c) *
					   rounds];

				qsort(x, rounds, sizeof(*x), cmp_double);
				printf("  %7.1f (%7.1f)", x[rounds / 2], x[0]);
			}
			printf("\n");
		}
	for (int par = 0; par < 2; par++)
		for (int nc = 0; nc < 2; nc++)
			fanout_destroy(eng[par][nc]);
	free(v);
	free(t);
	return 0;
}
