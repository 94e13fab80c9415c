/* SPDX-License-Identifier: MIT */
/*
 * epoll_server.c - fanout's completion sink in an edge-triggered epoll loop,
 * beside a timerfd, the way a server's event loop would hold it.
 *
 * Every timer tick dispatches a few background delegations to our own sink;
 * the loop collects their events through the sink's eventfd.
 *
 * The rule that matters (fanout.h, fanout_sink_fd): the fd is written only
 * when the sink goes from empty to non-empty, "empty" meaning a
 * fanout_poll() found no event.  With EPOLLET you get one edge for that
 * transition and none for the events that follow it, so on EVERY wakeup
 * drain with fanout_poll() until it returns -EAGAIN.  Stop earlier and the
 * events left in the sink never produce another edge.  (Level-triggered
 * epoll would just report the fd again; EPOLLET is the strict case.)
 *
 * Build: cc -Wall -Wextra epoll_server.c $(pkg-config --cflags --libs fanout)
 */
#define _GNU_SOURCE
#include <fanout.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define BATCHES 60	/* delegations in all */
#define PER_TICK 3	/* dispatched per timer tick */
#define CHILDREN 4	/* children per delegation */
#define TICK_NS 2000000 /* 2 ms */

/* A child: some work, then a summary that says who it was. */
static int square(struct fanout_child *c, void *arg)
{
	unsigned long x = (unsigned long)(uintptr_t)arg;
	char out[32];
	int n = snprintf(out, sizeof(out), "%lu", x * x);

	return fanout_set_summary(c, out, (size_t)n);
}

int main(void)
{
	struct fanout_engine *e;
	struct fanout_sink *sink;
	struct fanout_task tasks[CHILDREN];
	int efd, tfd, sfd, err;
	unsigned dispatched = 0, events = 0, wakeups = 0, bad = 0;
	uint64_t idsum_sent = 0, idsum_got = 0;

	if (fanout_create(NULL, &e))
		return 1;
	if (fanout_sink_create(e, &sink)) /* our own sink, our own fd */
		return 1;
	sfd = fanout_sink_fd(sink);

	/* A periodic timer beside the sink, as any server loop has. */
	tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	struct itimerspec its = {.it_interval = {0, TICK_NS},
				 .it_value = {0, TICK_NS}};
	if (tfd < 0 || timerfd_settime(tfd, 0, &its, NULL))
		return 1;

	efd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev_sink = {.events = EPOLLIN | EPOLLET,
				      .data.fd = sfd};
	struct epoll_event ev_timer = {.events = EPOLLIN | EPOLLET,
				       .data.fd = tfd};
	if (efd < 0 || epoll_ctl(efd, EPOLL_CTL_ADD, sfd, &ev_sink) ||
	    epoll_ctl(efd, EPOLL_CTL_ADD, tfd, &ev_timer))
		return 1;

	for (unsigned i = 0; i < CHILDREN; i++)
		tasks[i] = (struct fanout_task){"square", square,
						(void *)(uintptr_t)(i + 1)};

	while (events < BATCHES) {
		struct epoll_event ready[4];
		/* 10 s without any readiness means something is broken
		 * (e.g. a drain that stopped before -EAGAIN: no new edge). */
		int n = epoll_wait(efd, ready, 4, 10000);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr,
				"epoll_server: stalled with %u of %u "
				"events\n",
				events, BATCHES);
			return 1;
		}
		for (int k = 0; k < n; k++) {
			if (ready[k].data.fd == tfd) {
				uint64_t ticks;

				/* Edge-triggered too: read it to re-arm. */
				if (read(tfd, &ticks, sizeof(ticks)) < 0)
					continue;
				for (unsigned j = 0;
				     j < PER_TICK && dispatched < BATCHES;
				     j++) {
					struct fanout_batch b = {
						.tasks = tasks,
						.ntasks = CHILDREN,
						.sink = sink};
					fanout_id id;

					err = fanout_dispatch(e, &b, &id);
					if (err) {
						fprintf(stderr,
							"dispatch: %s\n",
							fanout_strerror(err));
						return 1;
					}
					idsum_sent += id;
					dispatched++;
				}
				if (dispatched ==
				    BATCHES) { /* stop the timer */
					struct itimerspec off = {{0, 0},
								 {0, 0}};

					timerfd_settime(tfd, 0, &off, NULL);
				}
				continue;
			}
			/* The sink's fd: drain until -EAGAIN, every time. */
			wakeups++;
			for (;;) {
				struct fanout_event *ev;

				err = fanout_poll(sink, &ev);
				if (err == -EAGAIN)
					break; /* empty: the fd is re-armed */
				if (err) {
					fprintf(stderr, "poll: %s\n",
						fanout_strerror(err));
					return 1;
				}
				/* Check what came back: 1, 4, 9, 16. */
				for (unsigned i = 0; i < ev->nresults; i++) {
					char want[32];

					snprintf(want, sizeof(want), "%u",
						 (i + 1) * (i + 1));
					if (ev->results[i].status !=
						    FANOUT_COMPLETED ||
					    strcmp(ev->results[i].summary,
						   want))
						bad++;
				}
				if (ev->nresults != CHILDREN)
					bad++;
				idsum_got += ev->id;
				events++;
				fanout_event_free(ev);
			}
		}
	}
	close(efd);
	close(tfd);
	fanout_sink_destroy(sink);
	fanout_destroy(e);

	printf("epoll_server: %u delegations of %u children, %u events "
	       "collected in %u wakeups of the sink fd (EPOLLET)\n",
	       dispatched, CHILDREN, events, wakeups);
	/* Every id came back once (sum check) and every result was right. */
	if (bad || idsum_got != idsum_sent) {
		fprintf(stderr, "epoll_server: %u wrong results, ids %s\n", bad,
			idsum_got == idsum_sent ? "ok" : "differ");
		return 1;
	}
	return 0;
}
