/* SPDX-License-Identifier: MIT */
/*
 * format.c - an event as a consolidated text block and as JSON.
 *
 * Correctness: both writers append through one bounded cursor that counts
 * every byte it would have written (snprintf semantics) and never writes
 * past len - 1, then NUL-terminates.  They read only the event, which its
 * holder owns.
 *
 * Children set their strings to any bytes.  Both writers pass well-formed
 * UTF-8 through and write U+FFFD for each maximal ill-formed subsequence
 * (Unicode 15, 3.9, "U+FFFD substitution of maximal subparts"): bytes that
 * start no sequence (80..C1, F5..FF), overlongs, surrogates, code points
 * above U+10FFFF and sequences cut short.  The text also replaces control
 * characters (C0 but \n and \t, DEL, C1) with U+FFFD and drops the \r of a
 * \r\n, so no escape sequence reaches a terminal; JSON escapes C0, '"' and
 * '\\' and keeps every valid character, so a parser gives back the bytes.
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
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

/* A text longer than an int can count leaves an empty string behind. */
static int finish(struct out *o)
{
	if (o->pos > (size_t)INT_MAX) {
		if (o->len)
			o->buf[0] = '\0';
		return -EOVERFLOW;
	}
	if (o->len)
		o->buf[o->pos < o->len ? o->pos : o->len - 1] = '\0';
	return (int)o->pos;
}

static const char repl[] = "\xef\xbf\xbd"; /* U+FFFD */

/*
 * The well-formed UTF-8 sequence at @s (Unicode 15, table 3-7): its length,
 * 1 to 4; or 0 when ill-formed, with *skip the length of its maximal
 * ill-formed prefix (at least 1), which one U+FFFD replaces.  Never reads
 * past a NUL (no continuation byte is 0).
 */
static size_t utf8_seq(const unsigned char *s, size_t *skip)
{
	unsigned char c = s[0], lo = 0x80, hi = 0xbf;
	size_t n, i;

	if (c < 0x80) {
		*skip = 1;
		return 1;
	}
	if (c >= 0xc2 && c <= 0xdf) {
		n = 2;
	} else if (c >= 0xe0 && c <= 0xef) {
		n = 3;
		if (c == 0xe0)
			lo = 0xa0; /* overlong */
		else if (c == 0xed)
			hi = 0x9f; /* surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4;
		if (c == 0xf0)
			lo = 0x90; /* overlong */
		else if (c == 0xf4)
			hi = 0x8f; /* above U+10FFFF */
	} else {
		*skip = 1;
		return 0;
	}
	for (i = 1; i < n; i++) {
		if (s[i] < lo || s[i] > hi) {
			*skip = i;
			return 0;
		}
		lo = 0x80;
		hi = 0xbf;
	}
	*skip = n;
	return n;
}

/*
 * Text: @str as valid UTF-8 without control characters but \n and \t (see
 * the top); with @ind, each line after the first starts with it (every
 * caller passes one, so no string can start a line of its own).  Runs of
 * bytes that pass unchanged are copied in one piece.
 */
static void put_text(struct out *o, const char *str, const char *ind)
{
	const unsigned char *s = (const unsigned char *)str, *run = s;
	size_t n, skip;

	while (*s) {
		unsigned char c = *s;

		if ((c >= 0x20 && c < 0x7f) || c == '\t') {
			s++;
			continue;
		}
		if (c == '\n') {
			s++;
			if (ind && *s) {
				put(o, (const char *)run, (size_t)(s - run));
				puts_(o, ind);
				run = s;
			}
			continue;
		}
		n = c < 0x80 ? 0 : utf8_seq(s, &skip);
		if (n && !(n == 2 && c == 0xc2 && s[1] < 0xa0)) { /* not C1 */
			s += n;
			continue;
		}
		put(o, (const char *)run, (size_t)(s - run));
		if (c == '\r' && s[1] == '\n') {
			s++; /* \r\n reads as \n */
		} else {
			puts_(o, repl);
			s += c < 0x80 ? 1 : skip;
		}
		run = s;
	}
	put(o, (const char *)run, (size_t)(s - run));
}

/* Text, each line of a multi-line string indented by `ind`. */
static void put_indented(struct out *o, const char *s, const char *ind)
{
	puts_(o, ind);
	put_text(o, s, ind);
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
		put_text(&o, ev->error, "  ");
		puts_(&o, "\n");
	}
	if (ev->context) {
		puts_(&o, "context: ");
		put_text(&o, ev->context, "  ");
		puts_(&o, "\n");
	}
	if (ev->session_key) {
		puts_(&o, "session: ");
		put_text(&o, ev->session_key, "  ");
		puts_(&o, "\n");
	}
	for (i = 0; i < ev->nresults; i++) {
		const struct fanout_result *r = &ev->results[i];

		/* Every string's later lines are indented, the batch's as
		 * a child's: at the margin only the header, the error,
		 * context and session lines and the TASK lines. */
		putf(&o, "TASK %u/%u: ", r->index + 1, ev->nresults);
		put_text(&o, r->goal ? r->goal : "", "  ");
		putf(&o, " (status=%s, %.1fms)\n",
		     fanout_status_name(r->status),
		     (double)r->duration_ns / 1e6);
		if (r->summary && *r->summary)
			put_indented(&o, r->summary, "  ");
		if (r->status != FANOUT_COMPLETED && r->error) {
			/* Every line indented, as a summary's: none can pass
			 * for a TASK line. */
			puts_(&o, "  error: ");
			put_text(&o, r->error, "  ");
			puts_(&o, "\n");
		}
	}
	return finish(&o);
}

/* A JSON string (RFC 8259) holding @str with ill-formed UTF-8 replaced. */
static void json_str(struct out *o, const char *str)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *s = (const unsigned char *)str, *run;
	size_t n, skip;

	if (!s) {
		puts_(o, "null");
		return;
	}
	puts_(o, "\"");
	for (run = s; *s;) {
		unsigned char c = *s;
		char esc[7] = {'\\', 'u', '0', '0', 0, 0, 0};

		if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
			s++;
			continue;
		}
		n = c < 0x80 ? 0 : utf8_seq(s, &skip);
		if (n) {
			s += n;
			continue;
		}
		put(o, (const char *)run, (size_t)(s - run));
		switch (c) {
		case '"':
		case '\\':
			esc[1] = (char)c;
			put(o, esc, 2);
			break;
		case '\b':
			puts_(o, "\\b");
			break;
		case '\f':
			puts_(o, "\\f");
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
			if (c < 0x80) { /* other C0, and DEL for good measure */
				esc[4] = hex[c >> 4];
				esc[5] = hex[c & 15];
				put(o, esc, 6);
			} else {
				puts_(o, repl);
			}
		}
		s += c < 0x80 ? 1 : skip;
		run = s;
	}
	put(o, (const char *)run, (size_t)(s - run));
	puts_(o, "\"");
}

/* A number for JSON: a cost summed past the largest double is inf,
 * which JSON has no literal for: null. */
static void json_num(struct out *o, double v)
{
	if (isfinite(v))
		putf(o, "%.17g", v);
	else
		puts_(o, "null");
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
	putf(&o, ",\"dispatched_ns\":%llu,\"completed_ns\":%llu,\"cost\":",
	     (unsigned long long)ev->dispatched_ns,
	     (unsigned long long)ev->completed_ns);
	json_num(&o, ev->cost);
	putf(&o,
	     ",\"completed\":%u,\"errors\":%u,\"interrupted\":%u,"
	     "\"cancelled\":%s,\"timed_out\":%s,"
	     "\"interrupted_by_policy\":%s,\"results\":[",
	     ev->ncompleted, ev->nerror, ev->ninterrupted,
	     ev->cancelled ? "true" : "false", ev->timed_out ? "true" : "false",
	     ev->interrupted_by_policy ? "true" : "false");
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
		putf(&o, ",\"code\":%d,\"duration_ns\":%llu,\"cost\":", r->code,
		     (unsigned long long)r->duration_ns);
		json_num(&o, r->cost);
		puts_(&o, "}");
	}
	puts_(&o, "]}");
	return finish(&o);
}
