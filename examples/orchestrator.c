/* SPDX-License-Identifier: MIT */
/*
 * orchestrator.c - the delegate policy of an agent orchestrator, end to end.
 *
 * fanout_delegate() decides how a batch of subagents runs:
 *   - at top level it goes to the background (FANOUT_BACKGROUND): the
 *     orchestrator keeps chatting and gets ONE consolidated event later;
 *   - inside a child (a subagent delegating further) it runs inline
 *     (FANOUT_INLINE): the child needs the answer before it can return;
 *   - at top level with the async pool full it runs inline too, and says so
 *     (FANOUT_INLINE_FULL) - never a silent downgrade.
 * Then fanout_format() gives the consolidated text block an LLM would read,
 * and fanout_cancel() stops a delegation that is no longer wanted.
 *
 * Build: cc -Wall -Wextra orchestrator.c $(pkg-config --cflags --libs fanout)
 */
#define _GNU_SOURCE
#include <fanout.h>

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static struct fanout_engine *engine;
static int failures;

#define EXPECT(cond)                                                           \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "orchestrator: %s:%d: %s\n", __FILE__, \
				__LINE__, #cond);                              \
			failures++;                                            \
		}                                                              \
	} while (0)

static void nap_us(long us)
{
	struct timespec ts = {0, us * 1000};

	nanosleep(&ts, NULL);
}

/* A subagent: "researches" its topic (here: formats a line about it). */
static int research(struct fanout_child *c, void *arg)
{
	char out[128];
	int n = snprintf(out, sizeof(out), "notes on %s", (const char *)arg);

	fanout_add_cost(c, 0.001); /* e.g. what its model calls cost */
	return fanout_set_summary(c, out, (size_t)n);
}

/*
 * A subagent that delegates further.  It is inside a child, so
 * fanout_delegate() runs the sub-batch inline and hands back its event.
 */
static int plan(struct fanout_child *c, void *arg)
{
	struct fanout_task sub[] = {
		{"check sources", research, "sources"},
		{"check numbers", research, "numbers"},
	};
	struct fanout_batch b = {.tasks = sub, .ntasks = 2};
	struct fanout_event *ev;
	char out[256];
	int rc, n;

	(void)arg;
	rc = fanout_delegate(engine, &b, NULL, &ev);
	if (rc != FANOUT_INLINE) { /* the policy inside a child */
		fanout_set_error(c, "expected an inline sub-delegation");
		return rc < 0 ? rc : -EPROTO;
	}
	n = snprintf(out, sizeof(out), "plan from %u sub-results: %s; %s",
		     ev->nresults, ev->results[0].summary,
		     ev->results[1].summary);
	fanout_add_cost(c, ev->cost); /* the sub-batch's cost rolls up */
	fanout_event_free(ev);
	return fanout_set_summary(c, out, (size_t)n);
}

/* Holds its worker (and its delegation's async slot) until *gate opens. */
static int hold(struct fanout_child *c, void *arg)
{
	atomic_int *gate = arg;

	while (!atomic_load(gate) && !fanout_interrupted(c))
		nap_us(200);
	return 0;
}

/* A long subagent that stops when the delegation is cancelled. */
static int long_task(struct fanout_child *c, void *arg)
{
	(void)arg;
	for (int i = 0; i < 50000; i++) { /* at most ~10 s */
		if (fanout_interrupted(c))
			return -ECANCELED; /* reported as interrupted */
		nap_us(200);
	}
	return 0;
}

static void print_block(const struct fanout_event *ev)
{
	char text[4096];

	fanout_format(ev, text, sizeof(text));
	fputs(text, stdout);
}

int main(void)
{
	/* max_async 2: a small async pool, to show what happens when full. */
	struct fanout_config cfg = {.max_async = 2};
	struct fanout_sink *sink;
	struct fanout_event *ev;
	fanout_id id;
	int rc;

	if (fanout_create(&cfg, &engine))
		return 1;
	sink = fanout_default_sink(engine);

	/* 1. Top level: background; one of the children delegates inline. */
	struct fanout_task research_tasks[] = {
		{"survey caches", research, "caches"},
		{"survey queues", research, "queues"},
		{"draft a plan", plan, NULL},
	};
	struct fanout_batch b1 = {.tasks = research_tasks,
				  .ntasks = 3,
				  .context = "user asked for a design review",
				  .session_key = "chat-42"};
	rc = fanout_delegate(engine, &b1, &id, &ev);
	EXPECT(rc == FANOUT_BACKGROUND);
	printf("delegated " FANOUT_ID_FMT " to the background\n",
	       (unsigned long long)id);
	/* ... the orchestrator keeps talking to its user here ... */
	if (fanout_wait(sink, &ev, 10000) == 0) {
		EXPECT(ev->id == id && ev->status == FANOUT_COMPLETED);
		EXPECT(ev->ncompleted == 3);
		EXPECT(strstr(ev->results[2].summary, "2 sub-results"));
		/* two research children + the plan's two sub-results */
		EXPECT(ev->cost > 0.0039 && ev->cost < 0.0041);
		print_block(ev);
		fanout_event_free(ev);
	} else {
		EXPECT(!"no event for the background delegation");
	}

	/* 2. Fill the async pool (2 slots), then delegate again. */
	atomic_int gate = 0;
	struct fanout_task holder = {"hold a slot", hold, &gate};
	struct fanout_batch bh = {.tasks = &holder, .ntasks = 1};
	EXPECT(fanout_dispatch(engine, &bh, NULL) == 0);
	EXPECT(fanout_dispatch(engine, &bh, NULL) == 0);
	struct fanout_task quick[] = {{"quick look", research, "logs"}};
	struct fanout_batch b2 = {.tasks = quick, .ntasks = 1};
	rc = fanout_delegate(engine, &b2, &id, &ev);
	EXPECT(rc == FANOUT_INLINE_FULL);
	if (rc == FANOUT_INLINE_FULL) {
		/* Say so: the user waited for this one. */
		printf("async pool full (max_async %u): ran " FANOUT_ID_FMT
		       " inline instead\n",
		       cfg.max_async, (unsigned long long)id);
		EXPECT(ev->status == FANOUT_COMPLETED);
		fanout_event_free(ev);
	} else if (rc == FANOUT_BACKGROUND && !fanout_wait(sink, &ev, 10000)) {
		fanout_event_free(ev);
	}
	atomic_store(&gate, 1); /* let the two holders finish */
	for (int i = 0; i < 2; i++) {
		rc = fanout_wait(sink, &ev, 10000);
		EXPECT(rc == 0);
		if (rc == 0)
			fanout_event_free(ev);
	}

	/* 3. Cancel: the user changed their mind. */
	struct fanout_task slow[] = {{"deep dive A", long_task, NULL},
				     {"deep dive B", long_task, NULL}};
	struct fanout_batch b3 = {.tasks = slow, .ntasks = 2};
	EXPECT(fanout_dispatch(engine, &b3, &id) == 0);
	rc = fanout_cancel(engine, id, FANOUT_CANCEL_INTERRUPT);
	EXPECT(rc == 0);
	if (fanout_wait(sink, &ev, 10000) == 0) {
		/* Still exactly one event, every child in it. */
		EXPECT(ev->id == id && ev->cancelled);
		EXPECT(ev->status == FANOUT_INTERRUPTED);
		EXPECT(ev->ninterrupted == 2);
		print_block(ev);
		fanout_event_free(ev);
	} else {
		EXPECT(!"no event for the cancelled delegation");
	}

	fanout_destroy(engine);
	printf("orchestrator: background, inline, inline-when-full and cancel "
	       "%s\n",
	       failures ? "FAILED" : "behaved as documented");
	return failures != 0;
}
