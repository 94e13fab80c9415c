/* SPDX-License-Identifier: MIT */
/*
 * lookup-lines.c - how many cache lines a fanout_lookup() of a finished
 * record misses on, counted rather than timed (issue 13: lookup at 1M
 * records against lookup at 1k).
 *
 *   make lookup-lines        (callgrind's cache simulator; see bench.mk)
 *   build/plain/lookup-lines [RECORDS] [LOOKUPS]    (timed, no valgrind)
 *
 * Fills an engine with RECORDS finished one-child delegations (default
 * 20000: about 13 MB of records), then looks up LOOKUPS random known ids
 * (default 200000), drawn before the clock starts into an array read in
 * order (a random read of the id array would add a miss of its own to
 * every lookup once it outgrows the cache).  Under callgrind only the lookups are counted
 * (CALLGRIND_TOGGLE_COLLECT around them); with a 2 MiB last level the
 * records do not fit, as a million do not fit a real one, so "LL misses
 * per lookup" is the number of lines a lookup fetches from memory.  The
 * timed figure is printed too; on a shared host it moves a lot, the count
 * does not.  So is the process's AnonHugePages (/proc/self/smaps_rollup)
 * once the records are made: how much of the table the kernel put on
 * 2 MiB pages.
 */
#include <fanout.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <valgrind/callgrind.h>

static int noop(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	return 0;
}

/* A "Name:  N kB" field of /proc/self/smaps_rollup, in KiB; -1 if none. */
static long rollup_kb(const char *name)
{
	FILE *f = fopen("/proc/self/smaps_rollup", "r");
	char line[256];
	long kb = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, name, strlen(name)) &&
		    sscanf(line + strlen(name), ": %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

int main(int argc, char **argv)
{
	size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 20000;
	size_t nl = argc > 2 ? strtoul(argv[2], NULL, 0) : 200000;
	struct fanout_config cfg = {.workers = 1,
				    .flags = FANOUT_NO_PIN,
				    .keep_completed = (unsigned)n + 1024,
				    .spin_ns = 1};
	struct fanout_task t = {"record", noop, NULL};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	unsigned long long rng = 12345, bad = 0;
	struct fanout_engine *e;
	fanout_id *ids, *seq;
	uint64_t t0, t1;

	if (!n || n > (1u << 24) || fanout_create(&cfg, &e))
		return 2;
	ids = malloc(n * sizeof(*ids));
	seq = malloc(nl * sizeof(*seq));
	if (!ids || !seq)
		return 2;
	for (size_t i = 0; i < n; i++) {
		struct fanout_event *ev;

		if (fanout_run(e, &b, &ev))
			return 1;
		ids[i] = ev->id;
		fanout_event_free(ev);
	}
	for (size_t i = 0; i < nl; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		seq[i] = ids[(rng >> 33) % n];
	}
	CALLGRIND_TOGGLE_COLLECT;
	t0 = fanout_now_ns();
	for (size_t i = 0; i < nl; i++) {
		struct fanout_info info;
		fanout_id id = seq[i];

		if (fanout_lookup(e, id, &info) || info.id != id ||
		    info.status != FANOUT_COMPLETED)
			bad++;
	}
	t1 = fanout_now_ns();
	CALLGRIND_TOGGLE_COLLECT;
	printf("lookup-lines: %zu records, %zu lookups, %.1f ns/lookup "
	       "(timed); Rss %ld MiB, AnonHugePages %ld MiB\n",
	       n, nl, (double)(t1 - t0) / (double)nl, rollup_kb("Rss") >> 10,
	       rollup_kb("AnonHugePages") >> 10);
	fanout_destroy(e);
	free(ids);
	free(seq);
	if (bad) {
		fprintf(stderr, "lookup-lines: %llu lookups failed\n", bad);
		return 1;
	}
	return 0;
}
