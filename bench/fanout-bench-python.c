/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-python.c - Python's ThreadPoolExecutor as a peer.
 *
 * bench/peer-python.py --serve runs as a child process for the whole
 * benchmark; each measurement is one command line on its stdin and one
 * answer line on its stdout, so its rounds are interleaved with the other
 * peers' exactly like theirs are with each other.
 */
#include "bench.h"
#include "bench-scen.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t py_pid;
static FILE *py_in, *py_out;
static char *py_line;
static size_t py_cap;

bool bench_py_running(void)
{
	return py_pid > 0;
}

static void py_fail(const char *what)
{
	fprintf(stderr,
		"fanout-bench: python peer: %s; left out from here on\n", what);
	bench_py_stop();
}

bool bench_py_start(void)
{
	const char *script = bench_opt.python;
	if (bench_opt.no_python)
		return false;
	if (access(script, R_OK) != 0) {
		fprintf(stderr,
			"fanout-bench: %s not found; python peer left out\n",
			script);
		return false;
	}
	int to[2], from[2];
	if (pipe(to) || pipe(from))
		bench_die("pipe: %s", strerror(errno));
	char threads[16];
	snprintf(threads, sizeof(threads), "%u", bench_opt.nthreads);
	pid_t pid = fork();
	if (pid < 0)
		bench_die("fork: %s", strerror(errno));
	if (pid == 0) {
		dup2(to[0], 0);
		dup2(from[1], 1);
		close(to[0]);
		close(to[1]);
		close(from[0]);
		close(from[1]);
		execlp("python3", "python3", script, "--serve", "--threads",
		       threads, (char *)NULL);
		_exit(127);
	}
	close(to[0]);
	close(from[1]);
	py_pid = pid;
	py_in = fdopen(to[1], "w");
	py_out = fdopen(from[0], "r");
	if (!py_in || !py_out)
		bench_die("fdopen failed");
	signal(SIGPIPE, SIG_IGN);
	if (getline(&py_line, &py_cap, py_out) < 0 ||
	    strncmp(py_line, "ready", 5)) {
		py_fail("did not start (is python3 installed?)");
		return false;
	}
	return true;
}

void bench_py_stop(void)
{
	if (py_pid <= 0)
		return;
	fputs("quit\n", py_in);
	fclose(py_in);
	fclose(py_out);
	int st;
	waitpid(py_pid, &st, 0);
	py_pid = 0;
	py_in = py_out = NULL;
}

/* Send one command, return the answer line (owned here) or NULL. */
static const char *py_ask(const char *cmd, const char *expect)
{
	if (py_pid <= 0)
		return NULL;
	if (fprintf(py_in, "%s\n", cmd) < 0 || fflush(py_in)) {
		py_fail("write failed");
		return NULL;
	}
	if (getline(&py_line, &py_cap, py_out) < 0) {
		py_fail("exited (see its message above)");
		return NULL;
	}
	if (strncmp(py_line, expect, strlen(expect))) {
		py_fail("unexpected answer");
		return NULL;
	}
	return py_line + strlen(expect);
}

double bench_py_throughput(unsigned n, unsigned inflight, uint64_t dur_ns)
{
	char cmd[96];
	snprintf(cmd, sizeof(cmd), "tp %u %u %.4f", n, inflight,
		 (double)dur_ns / 1e9);
	const char *a = py_ask(cmd, "tp ");
	return a ? strtod(a, NULL) : NAN;
}

void bench_py_latency(unsigned nsamples, uint64_t gap_ns, struct bench_hist *h)
{
	char cmd[96];
	snprintf(cmd, sizeof(cmd), "lat %u %.6f", nsamples,
		 (double)gap_ns / 1e9);
	const char *a = py_ask(cmd, "lat ");
	char *end;
	while (a && *a && *a != '\n') {
		unsigned long long v = strtoull(a, &end, 10);
		if (end == a)
			break;
		bench_hist_add(h, v);
		a = end;
	}
}

double bench_py_idle(uint64_t ns)
{
	char cmd[64];
	snprintf(cmd, sizeof(cmd), "idle %.3f", (double)ns / 1e9);
	const char *a = py_ask(cmd, "idle ");
	return a ? strtod(a, NULL) : NAN;
}
