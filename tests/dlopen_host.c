/* SPDX-License-Identifier: MIT */
/*
 * dlopen_host.c - libfanout.so loads with dlopen into a program whose
 * malloc is glibc's, runs delegations through dlsym'd functions, and leaves
 * that malloc alone (issue 11, "Loads anywhere").
 *
 * This program is NOT linked with fanout: it dlopen()s the shared library
 * named on its command line (build/plain/libfanout.so), as a Python
 * extension or a plugin host would, after its own threads have started
 * (so nothing can have reserved TLS for the library at startup).
 *
 * Usage: dlopen_host PATH/TO/libfanout.so
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fanout.h"

static const char *so_path;
static void *so;

/* The calls this host makes, all through dlsym. */
static struct {
	int (*create)(const struct fanout_config *, struct fanout_engine **);
	void (*destroy)(struct fanout_engine *);
	int (*dispatch)(struct fanout_engine *, const struct fanout_batch *,
			fanout_id *);
	int (*run)(struct fanout_engine *, const struct fanout_batch *,
		   struct fanout_event **);
	int (*wait)(struct fanout_sink *, struct fanout_event **, int);
	struct fanout_sink *(*default_sink)(struct fanout_engine *);
	void (*event_free)(struct fanout_event *);
	int (*set_summary)(struct fanout_child *, const char *, size_t);
	unsigned (*child_index)(const struct fanout_child *);
	unsigned (*child_depth)(const struct fanout_child *);
	struct fanout_child *(*current_child)(void);
	int (*format)(const struct fanout_event *, char *, size_t);
} fo;

#define SYM(field, name)                                                       \
	do {                                                                   \
		*(void **)&fo.field = dlsym(so, name);                         \
		assert_non_null(fo.field);                                     \
	} while (0)

/* The object that defines the function at @addr, e.g. ".../libc.so.6". */
static const char *object_of(void *addr)
{
	Dl_info info;

	assert_non_null(addr);
	assert_true(dladdr(addr, &info) != 0);
	assert_non_null(info.dli_fname);
	return info.dli_fname;
}

static int count_jemalloc(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	if (info->dlpi_name && strstr(info->dlpi_name, "jemalloc"))
		++*(int *)data;
	return 0;
}

/* A thread that exists before the library is loaded, and then runs a
 * delegation itself: its thread-locals must be set up lazily. */
static pthread_barrier_t early_loaded;
static struct fanout_engine *engine;

/* A child: the summary names its index and depth, read through the
 * library's thread-locals (fanout_current_child) on a worker. */
static int child(struct fanout_child *c, void *arg)
{
	char buf[64];
	int n;

	(void)arg;
	if (fo.current_child() != c)
		return -EPROTO;
	n = snprintf(buf, sizeof(buf), "child %u depth %u", fo.child_index(c),
		     fo.child_depth(c));
	return fo.set_summary(c, buf, (size_t)n);
}

/* A child that runs a nested synchronous delegation (depth 2). */
static int nesting_child(struct fanout_child *c, void *arg)
{
	struct fanout_engine *e = arg;
	struct fanout_task t = {"inner", child, NULL};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev;
	int rc = fo.run(e, &b, &ev);

	(void)c;
	if (rc)
		return rc;
	rc = ev->status == FANOUT_COMPLETED && ev->results[0].summary &&
			     strcmp(ev->results[0].summary,
				    "child 0 depth 2") == 0 ?
		     0 :
		     -EPROTO;
	fo.event_free(ev);
	return rc;
}

static void *early_thread(void *arg)
{
	struct fanout_task t[2] = {{"x", child, NULL}, {"y", child, NULL}};
	struct fanout_batch b = {.tasks = t, .ntasks = 2};
	struct fanout_event *ev;
	intptr_t ok;

	(void)arg;
	pthread_barrier_wait(&early_loaded); /* library loaded, engine made */
	if (fo.run(engine, &b, &ev))
		return (void *)0;
	ok = ev->status == FANOUT_COMPLETED && ev->nresults == 2;
	fo.event_free(ev);
	return (void *)ok;
}

static void loads_and_runs_without_replacing_malloc(void **state)
{
	void *host_malloc = dlsym(RTLD_DEFAULT, "malloc");
	const char *before = object_of(host_malloc);
	struct fanout_engine *e;
	struct fanout_event *ev;
	struct fanout_task t[8];
	struct fanout_batch b = {.tasks = t, .ntasks = 8};
	fanout_id id;
	pthread_t early;
	void *ok;
	char text[2048];
	int njemalloc = 0;

	(void)state;
	assert_non_null(strstr(before, "libc.so"));
	pthread_barrier_init(&early_loaded, NULL, 2);
	assert_int_equal(pthread_create(&early, NULL, early_thread, NULL), 0);

	so = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
	if (!so)
		fail_msg("dlopen(%s): %s", so_path, dlerror());
	SYM(create, "fanout_create");
	SYM(destroy, "fanout_destroy");
	SYM(dispatch, "fanout_dispatch");
	SYM(run, "fanout_run");
	SYM(wait, "fanout_wait");
	SYM(default_sink, "fanout_default_sink");
	SYM(event_free, "fanout_event_free");
	SYM(set_summary, "fanout_set_summary");
	SYM(child_index, "fanout_child_index");
	SYM(child_depth, "fanout_child_depth");
	SYM(current_child, "fanout_current_child");
	SYM(format, "fanout_format");

	struct fanout_config cfg = {.workers = 2, .flags = FANOUT_NO_PIN};
	assert_int_equal(fo.create(&cfg, &e), 0);
	engine = e;
	pthread_barrier_wait(&early_loaded);

	/* A background delegation, its one event through the sink. */
	for (unsigned i = 0; i < 8; i++)
		t[i] = (struct fanout_task){"g", child, NULL};
	t[7] = (struct fanout_task){"nested", nesting_child, e};
	assert_int_equal(fo.dispatch(e, &b, &id), 0);
	assert_int_equal(fo.wait(fo.default_sink(e), &ev, 10000), 0);
	assert_true(ev->id == id);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	assert_int_equal(ev->ncompleted, 8);
	for (unsigned i = 0; i < 7; i++) {
		char want[64];

		snprintf(want, sizeof(want), "child %u depth 1", i);
		assert_string_equal(ev->results[i].summary, want);
	}
	assert_true(fo.format(ev, text, sizeof(text)) > 0);
	assert_non_null(strstr(text, "TASK 8/8: nested"));
	fo.event_free(ev);

	assert_int_equal(pthread_join(early, &ok), 0);
	assert_true(ok == (void *)1);
	fo.destroy(e);

	/* The host's malloc is still glibc's, both as the program sees it and
	 * as the library's own references resolve; no jemalloc came in. */
	assert_true(dlsym(RTLD_DEFAULT, "malloc") == host_malloc);
	assert_non_null(strstr(object_of(dlsym(so, "malloc")), "libc.so"));
	assert_non_null(strstr(object_of(dlsym(so, "free")), "libc.so"));
	assert_null(dlsym(RTLD_DEFAULT, "mallocx"));
	dl_iterate_phdr(count_jemalloc, &njemalloc);
	assert_int_equal(njemalloc, 0);
	pthread_barrier_destroy(&early_loaded);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(loads_and_runs_without_replacing_malloc),
	};

	if (argc != 2) {
		fprintf(stderr, "usage: %s PATH/TO/libfanout.so\n", argv[0]);
		return 2;
	}
	so_path = argv[1];
	return cmocka_run_group_tests(tests, NULL, NULL);
}
