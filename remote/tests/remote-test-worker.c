// SPDX-License-Identifier: MIT
/*
 * remote-test-worker - a fanout_nats_serve() worker for the remote tests,
 * remote-check and bench-remote.  The payload says what to do:
 *
 *   "echo:TEXT"        summary TEXT, completed
 *   "sleep:MS:TEXT"    sleep MS (watching fanout_interrupted()), then as echo
 *   "fail:N:TEXT"      error TEXT, code -N
 *   "cost:X"           add cost X, completed
 *   "crash"            the worker process dies (SIGKILL) while running it
 *   "stopfail:TEXT"    first delivery: waits (up to 60 s) for an interrupt,
 *                      then fails with -EIO, as a handler whose command
 *                      was killed by the worker's stop; later deliveries:
 *                      as echo
 *   "linger:PATH:TEXT" first delivery: waits (up to 60 s) for an
 *                      interrupt, then (up to 60 s) for PATH to exist, then
 *                      returns -ECANCELED, as a handler slow to stop;
 *                      later deliveries: as echo
 *   "big:N"            summary of N bytes ('x'), completed
 *   "noop"             completed, nothing else
 *
 *   remote-test-worker --url URL --kind K [--concurrency N]
 *                      [--ack-wait-ms MS] [--max-deliver N] [--max-held N]
 *                      [--log FILE]
 *
 * With --log, one line per event, flushed at once: "S key delivery" when
 * a child starts, "D key" when its handler returns, "C key" when it saw
 * an interrupt.  SIGTERM/SIGINT stop it cleanly.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fanout_nats.h"

static volatile sig_atomic_t stop;
static FILE *logfp;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void logline(const char *what, const char *key, unsigned delivery)
{
	if (!logfp)
		return;
	pthread_mutex_lock(&log_lock);
	fprintf(logfp, "%s %s %u\n", what, key, delivery);
	fflush(logfp);
	pthread_mutex_unlock(&log_lock);
}

/* stopfail and linger on a redelivery: complete at once with @text. */
static bool redelivered(struct fanout_child *c,
			const struct fanout_nats_job *job, const char *text)
{
	if (job->delivery <= 1)
		return false;
	fanout_set_summary(c, text, strlen(text));
	logline("D", job->key, job->delivery);
	return true;
}

/* Wait (at most 60 s) until the child is interrupted, then log "C". */
static void until_interrupted(struct fanout_child *c,
			      const struct fanout_nats_job *job)
{
	struct timespec t0, now;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		usleep(5000);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (!fanout_interrupted(c) && now.tv_sec - t0.tv_sec < 60);
	logline("C", job->key, job->delivery);
}

static int handler(struct fanout_child *c, void *arg)
{
	const struct fanout_nats_job *job = arg;
	char buf[4096];
	size_t len = job->len < sizeof(buf) - 1 ? job->len : sizeof(buf) - 1;
	char *text;
	int rc = 0;

	memcpy(buf, job->payload, len);
	buf[len] = '\0';
	logline("S", job->key, job->delivery);
	if (!strcmp(buf, "noop")) {
		rc = 0;
	} else if (!strncmp(buf, "echo:", 5)) {
		fanout_set_summary(c, buf + 5, strlen(buf + 5));
	} else if (!strncmp(buf, "sleep:", 6)) {
		long ms = strtol(buf + 6, &text, 10);
		struct timespec t0, now;

		text = *text == ':' ? text + 1 : text;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (;;) {
			if (fanout_interrupted(c)) {
				logline("C", job->key, job->delivery);
				return -ECANCELED;
			}
			clock_gettime(CLOCK_MONOTONIC, &now);
			if ((now.tv_sec - t0.tv_sec) * 1000 +
				    (now.tv_nsec - t0.tv_nsec) / 1000000 >=
			    ms)
				break;
			usleep(5000);
		}
		fanout_set_summary(c, text, strlen(text));
	} else if (!strncmp(buf, "fail:", 5)) {
		long code = strtol(buf + 5, &text, 10);

		fanout_set_error(c, *text == ':' ? text + 1 : text);
		rc = (int)-code;
	} else if (!strncmp(buf, "cost:", 5)) {
		fanout_add_cost(c, strtod(buf + 5, NULL));
	} else if (!strncmp(buf, "stopfail:", 9)) {
		if (redelivered(c, job, buf + 9))
			return 0;
		until_interrupted(c, job);
		fanout_set_error(c, "stopped mid-run");
		rc = -EIO;
	} else if (!strncmp(buf, "linger:", 7)) {
		char *path = buf + 7;
		struct timespec t0, now;

		text = strchr(path, ':');
		if (!text) {
			fanout_set_error(c, "linger:PATH:TEXT");
			return -EINVAL;
		}
		*text++ = '\0';
		if (redelivered(c, job, text))
			return 0;
		until_interrupted(c, job);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		do {
			usleep(5000);
			clock_gettime(CLOCK_MONOTONIC, &now);
		} while (access(path, F_OK) && now.tv_sec - t0.tv_sec < 60);
		rc = -ECANCELED;
	} else if (!strncmp(buf, "big:", 4)) {
		size_t n = strtoul(buf + 4, NULL, 10);
		char *big = malloc(n ? n : 1);

		if (!big)
			return -ENOMEM;
		memset(big, 'x', n);
		rc = fanout_set_summary(c, big, n);
		free(big);
	} else if (!strcmp(buf, "crash")) {
		raise(SIGKILL);
	} else {
		fanout_set_error(c, "unknown test payload");
		rc = -EINVAL;
	}
	logline("D", job->key, job->delivery);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"kind", required_argument, NULL, 'k'},
		{"url", required_argument, NULL, 'u'},
		{"concurrency", required_argument, NULL, 'c'},
		{"ack-wait-ms", required_argument, NULL, 'a'},
		{"max-deliver", required_argument, NULL, 'm'},
		{"max-held", required_argument, NULL, 'H'},
		{"log", required_argument, NULL, 'l'},
		{NULL, 0, NULL, 0},
	};
	struct fanout_nats_serve_opts o = {.handler = handler, .stop = &stop};
	struct sigaction sa;
	int ch, err;

	while ((ch = getopt_long(argc, argv, "k:u:c:a:m:H:l:", lo, NULL)) !=
	       -1) {
		switch (ch) {
		case 'k':
			o.kind = optarg;
			break;
		case 'u':
			o.url = optarg;
			break;
		case 'c':
			o.concurrency = (unsigned)atoi(optarg);
			break;
		case 'a':
			o.ack_wait_ms = atoi(optarg);
			break;
		case 'm':
			o.max_deliver = atoi(optarg);
			break;
		case 'H':
			o.max_held = (unsigned)atoi(optarg);
			break;
		case 'l':
			logfp = fopen(optarg, "a");
			if (!logfp) {
				perror(optarg);
				return 2;
			}
			break;
		default:
			return 2;
		}
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	err = fanout_nats_serve(&o);
	if (logfp)
		fclose(logfp);
	if (err) {
		fprintf(stderr, "remote-test-worker: %s\n", strerror(-err));
		return 1;
	}
	return 0;
}
