/* SPDX-License-Identifier: MIT */
/*
 * nats_harness.h - real nats-server processes, worker processes and a TCP
 * fault injector for the remote tests, remote-check and bench-remote.
 *
 * Every user starts its own `nats-server -js` on a free port with its
 * store in a fresh temporary directory, and kills it at the end.  The
 * proxy forwards TCP between a client and the server and can cut every
 * connection through it (and refuse new ones) for a while: the real
 * client library and server see a real network drop.
 */
#ifndef NATS_HARNESS_H
#define NATS_HARNESS_H

#include <arpa/inet.h>
#include <nats/nats.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct nats_srv {
	char dir[PATH_MAX];
	char url[64];
	int port;
	pid_t pid;
};

static inline void h_sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static inline long h_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int h_free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    getsockname(fd, (struct sockaddr *)&a, &l)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static inline bool h_port_open(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	bool ok;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ok = fd >= 0 && !connect(fd, (struct sockaddr *)&a, sizeof(a));
	if (fd >= 0)
		close(fd);
	return ok;
}

/* (Re)start the server on s->port with its store in s->dir. */
static inline int nats_srv_run(struct nats_srv *s)
{
	char port[16], store[PATH_MAX + 8], logp[PATH_MAX + 16];
	long t0 = h_now_ms();

	snprintf(port, sizeof(port), "%d", s->port);
	snprintf(store, sizeof(store), "%s/js", s->dir);
	snprintf(logp, sizeof(logp), "%s/server.log", s->dir);
	s->pid = fork();
	if (s->pid < 0)
		return -errno;
	if (s->pid == 0) {
		int fd = open(logp, O_WRONLY | O_CREAT | O_APPEND, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execlp("nats-server", "nats-server", "-js", "-a", "127.0.0.1",
		       "-p", port, "-sd", store, (char *)NULL);
		_exit(127);
	}
	while (!h_port_open(s->port)) {
		int st;

		if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
			s->pid = 0;
			return -ECHILD;
		}
		if (h_now_ms() - t0 > 15000)
			return -ETIMEDOUT;
		h_sleep_ms(20);
	}
	return 0;
}

static inline int nats_srv_start(struct nats_srv *s)
{
	const char *tmp = getenv("TMPDIR");

	memset(s, 0, sizeof(*s));
	snprintf(s->dir, sizeof(s->dir), "%s/fanout-nats-XXXXXX",
		 tmp ? tmp : "/tmp");
	if (!mkdtemp(s->dir))
		return -errno;
	s->port = h_free_port();
	if (s->port < 0)
		return -EADDRNOTAVAIL;
	snprintf(s->url, sizeof(s->url), "nats://127.0.0.1:%d", s->port);
	return nats_srv_run(s);
}

/* Stop the server process (SIGTERM: it flushes its store; sig 9: crash). */
static inline void nats_srv_kill(struct nats_srv *s, int sig)
{
	int st;

	if (s->pid <= 0)
		return;
	kill(s->pid, sig);
	waitpid(s->pid, &st, 0);
	s->pid = 0;
}

static inline void nats_srv_stop(struct nats_srv *s)
{
	char cmd[PATH_MAX + 32];

	nats_srv_kill(s, SIGTERM);
	if (s->dir[0] && !getenv("FANOUT_KEEP_NATS_DIR")) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", s->dir);
	}
}

/* Start a worker program; argv ends with NULL. */
static inline pid_t h_spawn(char *const argv[])
{
	pid_t pid = fork();

	if (pid == 0) {
		execv(argv[0], argv);
		_exit(127);
	}
	return pid;
}

static inline void h_kill_wait(pid_t pid, int sig)
{
	int st;

	if (pid <= 0)
		return;
	kill(pid, sig);
	waitpid(pid, &st, 0);
}

/* Lines of @path starting with @prefix (0 if it does not exist). */
static inline int h_count_lines(const char *path, const char *prefix)
{
	char line[256];
	FILE *f = fopen(path, "r");
	int n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, prefix, strlen(prefix)))
			n++;
	fclose(f);
	return n;
}

/* Wait up to @ms for @path to hold at least @n lines starting @prefix. */
static inline bool h_wait_lines(const char *path, const char *prefix, int n,
				long ms)
{
	long t0 = h_now_ms();

	while (h_count_lines(path, prefix) < n) {
		if (h_now_ms() - t0 > ms)
			return false;
		h_sleep_ms(10);
	}
	return true;
}

/* A program next to this one's build directory: build/<v>/<name>. */
static inline void h_sibling(char *out, size_t cap, const char *name)
{
	char self[PATH_MAX];
	ssize_t l = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	self[l > 0 ? l : 0] = '\0';
	slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	/* tests live in build/<v>/tests, programs in build/<v> */
	if (strlen(self) > 6 && !strcmp(self + strlen(self) - 6, "/tests"))
		self[strlen(self) - 6] = '\0';
	if (strlen(self) + 1 + strlen(name) >= cap) {
		out[0] = '\0';
		return;
	}
	strcpy(out, self);
	strcat(out, "/");
	strcat(out, name);
}

/* ------------------------------------------------------------------ proxy */

#define PROXY_MAX 64

struct proxy {
	int lfd, port, target;
	atomic_bool down, quit;
	pthread_t thr;
	pthread_mutex_t lock;
	int fds[PROXY_MAX][2];
	int nfds;
};

static inline int proxy_connect(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		fd = -1;
	}
	return fd;
}

static inline void *proxy_main(void *arg)
{
	struct proxy *p = arg;

	while (!atomic_load(&p->quit)) {
		struct pollfd pf[1 + 2 * PROXY_MAX];
		int n = 1, i;
		char buf[65536];

		pf[0] = (struct pollfd){p->lfd, POLLIN, 0};
		pthread_mutex_lock(&p->lock);
		for (i = 0; i < p->nfds; i++) {
			pf[n++] = (struct pollfd){p->fds[i][0], POLLIN, 0};
			pf[n++] = (struct pollfd){p->fds[i][1], POLLIN, 0};
		}
		pthread_mutex_unlock(&p->lock);
		if (poll(pf, (nfds_t)n, 20) <= 0)
			continue;
		if (pf[0].revents & POLLIN) {
			int c = accept(p->lfd, NULL, NULL), s;

			if (c >= 0) {
				s = atomic_load(&p->down) ?
					    -1 :
					    proxy_connect(p->target);
				pthread_mutex_lock(&p->lock);
				if (s < 0 || p->nfds == PROXY_MAX) {
					close(c);
					if (s >= 0)
						close(s);
				} else {
					p->fds[p->nfds][0] = c;
					p->fds[p->nfds][1] = s;
					p->nfds++;
				}
				pthread_mutex_unlock(&p->lock);
			}
		}
		pthread_mutex_lock(&p->lock);
		for (i = 0; i < p->nfds; i++) {
			int k, dead = 0;

			for (k = 0; k < 2 && 1 + 2 * i + k < n; k++) {
				struct pollfd *q = &pf[1 + 2 * i + k];
				ssize_t r;

				if (q->fd != p->fds[i][k] || !q->revents)
					continue;
				r = read(q->fd, buf, sizeof(buf));
				if (r <= 0 || write(p->fds[i][1 - k], buf,
						    (size_t)r) != r)
					dead = 1;
			}
			if (dead || atomic_load(&p->down)) {
				close(p->fds[i][0]);
				close(p->fds[i][1]);
				p->fds[i][0] = p->fds[p->nfds - 1][0];
				p->fds[i][1] = p->fds[p->nfds - 1][1];
				p->nfds--;
				i--;
				n = 0; /* poll results no longer match */
			}
		}
		pthread_mutex_unlock(&p->lock);
	}
	return NULL;
}

static inline int proxy_start(struct proxy *p, int target)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t l = sizeof(a);

	memset(p, 0, sizeof(*p));
	p->target = target;
	pthread_mutex_init(&p->lock, NULL);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	p->lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof(a)) ||
	    listen(p->lfd, 16) ||
	    getsockname(p->lfd, (struct sockaddr *)&a, &l))
		return -errno;
	p->port = ntohs(a.sin_port);
	return pthread_create(&p->thr, NULL, proxy_main, p) ? -EAGAIN : 0;
}

static inline void proxy_stop(struct proxy *p)
{
	int i;

	atomic_store(&p->quit, true);
	pthread_join(p->thr, NULL);
	for (i = 0; i < p->nfds; i++) {
		close(p->fds[i][0]);
		close(p->fds[i][1]);
	}
	close(p->lfd);
	pthread_mutex_destroy(&p->lock);
}

/* The end of a suite whose NATS objects are all destroyed: join libnats'
 * threads before the process exits (LeakSanitizer checks at exit).  A
 * NATS object left undestroyed makes this time out, and fails the suite.
 * Returns the suite's exit status. */
static inline int nats_suite_end(int rc)
{
	if (nats_CloseAndWait(10000) != NATS_OK) {
		fprintf(stderr, "libnats did not close: a NATS object was left "
				"undestroyed\n");
		return rc ? rc : 1;
	}
	return rc;
}

#endif
