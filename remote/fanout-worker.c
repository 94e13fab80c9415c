// SPDX-License-Identifier: MIT
/*
 * fanout-worker - run remote children of one kind with a shell command.
 *
 *   fanout-worker --kind K --exec CMD [--url URL] [--concurrency N]
 *                 [--ack-wait-ms MS] [--max-deliver N] [--max-held N]
 *
 * Per child: `sh -c CMD` with the payload on stdin and FANOUT_KEY,
 * FANOUT_DELIVERY in its environment; its stdout becomes the summary,
 * its exit status the code (0 completed; k > 0 reported as an error
 * "command exited with status k"; killed by signal s: error, code
 * -EINTR).  A cancel from the dispatcher sends SIGTERM to the command's
 * process group (SIGKILL 2 s later) and reports the child interrupted.
 * SIGINT/SIGTERM stop the worker: running children are interrupted and
 * handed back to JetStream for another worker.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fanout_nats.h"

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void spawn_child(const char *cmd, const struct fanout_nats_job *job,
			int in, int out)
{
	char dv[16];

	setpgid(0, 0);
	dup2(in, 0);
	dup2(out, 1);
	snprintf(dv, sizeof(dv), "%u", job->delivery);
	setenv("FANOUT_KEY", job->key, 1);
	setenv("FANOUT_DELIVERY", dv, 1);
	execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
	_exit(127);
}

static int run_exec(struct fanout_child *c, void *arg)
{
	const struct fanout_nats_job *job = arg;
	const char *cmd = job->user;
	int inp[2], outp[2], status = 0;
	size_t off = 0, olen = 0, ocap = 4096;
	char *obuf = malloc(ocap);
	bool killed = false;
	struct timespec kill_at = {0};
	pid_t pid;

	if (!obuf)
		return -ENOMEM;
	if (pipe2(inp, O_CLOEXEC) || pipe2(outp, O_CLOEXEC)) {
		free(obuf);
		return -errno;
	}
	pid = fork();
	if (pid == 0)
		spawn_child(cmd, job, inp[0], outp[1]);
	close(inp[0]);
	close(outp[1]);
	if (pid < 0) {
		close(inp[1]);
		close(outp[0]);
		free(obuf);
		return -EAGAIN;
	}
	fcntl(inp[1], F_SETFL, O_NONBLOCK);
	if (!job->len) {
		close(inp[1]);
		inp[1] = -1;
	}
	for (;;) {
		struct pollfd pf[2] = {{outp[0], POLLIN, 0},
				       {inp[1], POLLOUT, 0}};
		int np = inp[1] >= 0 ? 2 : 1;

		if (fanout_interrupted(c) && !killed) {
			kill(-pid, SIGTERM);
			killed = true;
			clock_gettime(CLOCK_MONOTONIC, &kill_at);
		}
		if (killed) {
			struct timespec now;

			clock_gettime(CLOCK_MONOTONIC, &now);
			if (now.tv_sec - kill_at.tv_sec >= 2)
				kill(-pid, SIGKILL);
		}
		if (poll(pf, (nfds_t)np, 50) < 0 && errno != EINTR)
			break;
		if (np == 2 && (pf[1].revents & (POLLOUT | POLLERR))) {
			ssize_t w =
				write(inp[1], (const char *)job->payload + off,
				      job->len - off);

			if (w > 0)
				off += (size_t)w;
			if (w < 0 && errno != EAGAIN)
				off = job->len;
			if (off == job->len) {
				close(inp[1]);
				inp[1] = -1;
			}
		}
		if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t r;

			if (olen == ocap) {
				char *nb = realloc(obuf, ocap * 2);

				if (!nb)
					break;
				obuf = nb;
				ocap *= 2;
			}
			r = read(outp[0], obuf + olen, ocap - olen);
			if (r <= 0)
				break;
			olen += (size_t)r;
		}
	}
	if (inp[1] >= 0)
		close(inp[1]);
	close(outp[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (olen)
		fanout_set_summary(c, obuf, olen);
	free(obuf);
	if (killed)
		return -ECANCELED;
	if (WIFEXITED(status)) {
		char msg[64];

		if (!WEXITSTATUS(status))
			return 0;
		snprintf(msg, sizeof(msg), "command exited with status %d",
			 WEXITSTATUS(status));
		fanout_set_error(c, msg);
		return WEXITSTATUS(status);
	}
	{
		char msg[64];

		snprintf(msg, sizeof(msg), "command killed by signal %d",
			 WTERMSIG(status));
		fanout_set_error(c, msg);
	}
	return -EINTR;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: fanout-worker --kind K --exec CMD [--url URL] "
		   "[--concurrency N]\n"
		   "                     [--ack-wait-ms MS] [--max-deliver N] "
		   "[--max-held N]\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"kind", required_argument, NULL, 'k'},
		{"exec", required_argument, NULL, 'e'},
		{"url", required_argument, NULL, 'u'},
		{"concurrency", required_argument, NULL, 'c'},
		{"ack-wait-ms", required_argument, NULL, 'a'},
		{"max-deliver", required_argument, NULL, 'm'},
		{"max-held", required_argument, NULL, 'H'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct fanout_nats_serve_opts o = {.handler = run_exec, .stop = &stop};
	struct sigaction sa;
	char *cmd = NULL;
	int ch, err;

	while ((ch = getopt_long(argc, argv, "k:e:u:c:a:m:H:h", lo, NULL)) !=
	       -1) {
		switch (ch) {
		case 'k':
			o.kind = optarg;
			break;
		case 'e':
			cmd = optarg;
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
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!o.kind || !cmd) {
		usage(stderr);
		return 2;
	}
	o.handler_arg = cmd;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	err = fanout_nats_serve(&o);
	if (err) {
		fprintf(stderr, "fanout-worker: %s\n", strerror(-err));
		return 1;
	}
	return 0;
}
