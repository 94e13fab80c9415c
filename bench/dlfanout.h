/* SPDX-License-Identifier: MIT */
/*
 * dlfanout.h - one build of libfanout.so opened with dlopen(), for the
 * tools that compare builds inside one process (abdl.c, latab.c).  Each
 * is opened RTLD_LOCAL: copy the files first, as one path opened twice
 * is one library.  "LIB.so@FLAGS" gives that library's engine
 * fanout_config.flags FLAGS.
 */
#ifndef FANOUT_BENCH_DLFANOUT_H
#define FANOUT_BENCH_DLFANOUT_H

#include <fanout.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dlfanout {
	const char *path;
	int (*create)(const struct fanout_config *, struct fanout_engine **);
	void (*destroy)(struct fanout_engine *);
	int (*run)(struct fanout_engine *, const struct fanout_batch *,
		   struct fanout_event **);
	int (*dispatch)(struct fanout_engine *, const struct fanout_batch *,
			fanout_id *);
	int (*wait)(struct fanout_sink *, struct fanout_event **, int);
	struct fanout_sink *(*sink)(struct fanout_engine *);
	void (*event_free)(struct fanout_event *);
	unsigned flags; /* from "@FLAGS", else the caller's default */
};

/* Open @path (cut at its '@', if any) into @l; @prog names the tool in
 * messages.  0, or -1 after saying why on stderr. */
static inline int dlfanout_load(struct dlfanout *l, char *path, unsigned flags,
				const char *prog)
{
	char *at = strrchr(path, '@');
	void *h;

	l->flags = flags;
	if (at) {
		*at = '\0';
		l->flags = (unsigned)strtoul(at + 1, NULL, 0);
	}
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "%s: %s\n", prog, dlerror());
		return -1;
	}
	l->path = path;
	*(void **)&l->create = dlsym(h, "fanout_create");
	*(void **)&l->destroy = dlsym(h, "fanout_destroy");
	*(void **)&l->run = dlsym(h, "fanout_run");
	*(void **)&l->dispatch = dlsym(h, "fanout_dispatch");
	*(void **)&l->wait = dlsym(h, "fanout_wait");
	*(void **)&l->sink = dlsym(h, "fanout_default_sink");
	*(void **)&l->event_free = dlsym(h, "fanout_event_free");
	if (!l->create || !l->destroy || !l->run || !l->dispatch || !l->wait ||
	    !l->sink || !l->event_free) {
		fprintf(stderr, "%s: %s lacks the API\n", prog, path);
		return -1;
	}
	return 0;
}

#endif
