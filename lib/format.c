/* SPDX-License-Identifier: MIT */
/*
 * format.c - an event as a consolidated text block and as JSON.
 *
 * Correctness: both writers append through one bounded cursor that counts
 * every byte it would have written (snprintf semantics) and never writes
 * past len - 1, then NUL-terminates.  They read only the event, which its
 * holder owns.
 */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct out {
	char *buf;
	size_t len;
	size_t pos; /* bytes the full text needs so far */
};

static void put(struct out *o, const char *s, size_t n)
{
	if (o->pos < o->len) {
		size_t room = o->len - 1 - o->pos;

		memcpy(o->buf + o->pos, s, n < room ? n : room);
	}
	o->pos += n;
}

static void putf(struct out *o, const char *fmt, ...)
{
	char tmp[256];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n > 0)
		put(o, tmp,
		    (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

static void puts_(struct out *o, const char *s)
{
	put(o, s, strlen(s));
}

static int finish(struct out *o)
{
	if (o->len)
		o->buf[o->pos < o->len ? o->pos : o->len - 1] = '\0';
	return o->pos > (size_t)INT32_MAX ? -EOVERFLOW : (int)o->pos;
}

/* Text, each line of a multi-line string indented by `ind`. */
static void put_indented(struct out *o, const char *s, const char *ind)
{
	puts_(o, ind);
	for (; *s; s++) {
		put(o, s, 1);
		if (*s == '\n' && s[1])
			puts_(o, ind);
	}
	puts_(o, "\n");
}

int fanout_format(const struct fanout_event *ev, char *buf, size_t len)
{
	struct out o = {buf, len, 0};
	unsigned i;

	if (!ev || (!buf && len))
		return -EINVAL;
	putf(&o, "[" FANOUT_ID_FMT "] %s: %u/%u completed",
	     (unsigned long long)ev->id, fanout_status_name(ev->status),
	     ev->ncompleted, ev->nresults);
	if (ev->nerror)
		putf(&o, ", %u error", ev->nerror);
	if (ev->ninterrupted)
		putf(&o, ", %u interrupted", ev->ninterrupted);
	putf(&o, " in %.1fms",
	     (double)(ev->completed_ns - ev->dispatched_ns) / 1e6);
	if (ev->cost != 0)
		putf(&o, ", cost %g", ev->cost);
	puts_(&o, "\n");
	if (ev->error) {
		puts_(&o, "error: ");
		puts_(&o, ev->error);
		puts_(&o, "\n");
	}
	if (ev->context) {
		puts_(&o, "context: ");
		puts_(&o, ev->context);
		puts_(&o, "\n");
	}
	if (ev->session_key) {
		puts_(&o, "session: ");
		puts_(&o, ev->session_key);
		puts_(&o, "\n");
	}
	for (i = 0; i < ev->nresults; i++) {
		const struct fanout_result *r = &ev->results[i];

		putf(&o, "TASK %u/%u: ", r->index + 1, ev->nresults);
		puts_(&o, r->goal ? r->goal : "");
		putf(&o, " (status=%s, %.1fms)\n",
		     fanout_status_name(r->status),
		     (double)r->duration_ns / 1e6);
		if (r->summary && *r->summary)
			put_indented(&o, r->summary, "  ");
		if (r->status != FANOUT_COMPLETED && r->error) {
			puts_(&o, "  error: ");
			put_indented(&o, r->error, "");
		}
	}
	return finish(&o);
}

static void json_str(struct out *o, const char *s)
{
	if (!s) {
		puts_(o, "null");
		return;
	}
	puts_(o, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		switch (c) {
		case '"':
			puts_(o, "\\\"");
			break;
		case '\\':
			puts_(o, "\\\\");
			break;
		case '\n':
			puts_(o, "\\n");
			break;
		case '\r':
			puts_(o, "\\r");
			break;
		case '\t':
			puts_(o, "\\t");
			break;
		default:
			if (c < 0x20 || c == 0x7f)
				putf(o, "\\u%04x", c);
			else
				put(o, (const char *)&c, 1);
		}
	}
	puts_(o, "\"");
}

int fanout_event_json(const struct fanout_event *ev, char *buf, size_t len)
{
	struct out o = {buf, len, 0};
	unsigned i;

	if (!ev || (!buf && len))
		return -EINVAL;
	putf(&o, "{\"id\":\"" FANOUT_ID_FMT "\",\"status\":",
	     (unsigned long long)ev->id);
	json_str(&o, fanout_status_name(ev->status));
	puts_(&o, ",\"error\":");
	json_str(&o, ev->error);
	puts_(&o, ",\"context\":");
	json_str(&o, ev->context);
	puts_(&o, ",\"session_key\":");
	json_str(&o, ev->session_key);
	putf(&o, ",\"dispatched_ns\":%llu,\"completed_ns\":%llu,\"cost\":%.17g",
	     (unsigned long long)ev->dispatched_ns,
	     (unsigned long long)ev->completed_ns, ev->cost);
	putf(&o,
	     ",\"completed\":%u,\"errors\":%u,\"interrupted\":%u,"
	     "\"cancelled\":%s,\"results\":[",
	     ev->ncompleted, ev->nerror, ev->ninterrupted,
	     ev->cancelled ? "true" : "false");
	for (i = 0; i < ev->nresults; i++) {
		const struct fanout_result *r = &ev->results[i];

		putf(&o, "%s{\"index\":%u,\"status\":", i ? "," : "", r->index);
		json_str(&o, fanout_status_name(r->status));
		puts_(&o, ",\"goal\":");
		json_str(&o, r->goal);
		puts_(&o, ",\"summary\":");
		json_str(&o, r->summary);
		puts_(&o, ",\"error\":");
		json_str(&o, r->status == FANOUT_COMPLETED ? NULL : r->error);
		putf(&o, ",\"code\":%d,\"duration_ns\":%llu,\"cost\":%.17g}",
		     r->code, (unsigned long long)r->duration_ns, r->cost);
	}
	puts_(&o, "]}");
	return finish(&o);
}
