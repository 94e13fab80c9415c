/* SPDX-License-Identifier: MIT */
/* test_format.c - fanout_format, fanout_event_json, fanout_strerror. */
#include "common.h"

#include <float.h>
#include <math.h>
#include "utf8.h"

#include <jansson.h>

/* U+FFFD, the replacement character, as UTF-8 */
#define R "\xef\xbf\xbd"

/* ----------------------------------------------------- UTF-8, JSON parse */

/* Any bytes at all are fine in the validator's eyes but ill-formed UTF-8:
 * is @s something a JSON string can carry unchanged? */
static bool utf8_any_ctl(const char *s)
{
	return utf8_strict(s, strlen(s), UINT32_MAX, true);
}

/* Parse @buf as JSON, strictly (jansson rejects ill-formed UTF-8, raw
 * control characters and, asked to, duplicate keys). */
static json_t *json_parse(const char *buf, size_t len)
{
	json_error_t err;
	json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &err);

	if (!root)
		fail_msg("JSON rejected: %s (line %d col %d): %s", err.text,
			 err.line, err.column, buf);
	return root;
}

/* @o[@key] is null when @want is NULL, else a string of exactly @want's
 * bytes (compared with its length: a decoded \u0000 would show). */
static void assert_jstr(json_t *o, const char *key, const char *want)
{
	json_t *v = json_object_get(o, key);

	if (!v)
		fail_msg("no member \"%s\"", key);
	if (!want) {
		if (!json_is_null(v))
			fail_msg("\"%s\" should be null", key);
		return;
	}
	if (!json_is_string(v))
		fail_msg("\"%s\" is not a string", key);
	if (json_string_length(v) != strlen(want) ||
	    memcmp(json_string_value(v), want, strlen(want)) != 0)
		fail_msg("\"%s\" is \"%s\", want \"%s\"", key,
			 json_string_value(v), want);
}

static json_int_t jint(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v))
		fail_msg("\"%s\" is not an integer", key);
	return json_integer_value(v);
}

static double jnum(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_number(v))
		fail_msg("\"%s\" is not a number", key);
	return json_number_value(v);
}

/* ------------------------------------------------------------ fixtures */

struct evfix {
	struct fanout_engine *e;
	struct tbatch *tb;
	struct fanout_event *ev;
};

/* Run a batch of goals with given summaries/errors/returns synchronously. */
static void make_event(struct evfix *f, unsigned n, const char **goals,
		       const char **sums, const char **errs, const int *rets,
		       const char *ctx, const char *key)
{
	f->e = NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	f->tb = tb_new(n);
	for (unsigned i = 0; i < n; i++) {
		if (goals)
			f->tb->tasks[i].goal = goals[i];
		if (sums)
			f->tb->probes[i].summary = sums[i];
		if (errs)
			f->tb->probes[i].error = errs[i];
		if (rets)
			f->tb->probes[i].ret = rets[i];
	}
	f->tb->b.context = ctx;
	f->tb->b.session_key = key;
	assert_int_equal(fanout_run(f->e, &f->tb->b, &f->ev), 0);
}

static void drop_event(struct evfix *f)
{
	fanout_event_free(f->ev);
	tb_free(f->tb);
	fanout_destroy(f->e);
}

static char *format_alloc(const struct fanout_event *ev, bool json)
{
	int n = json ? fanout_event_json(ev, NULL, 0) :
		       fanout_format(ev, NULL, 0);

	assert_true(n > 0);
	char *buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	memset(buf, 0x7f, (size_t)n + 1);
	int m = json ? fanout_event_json(ev, buf, (size_t)n + 1) :
		       fanout_format(ev, buf, (size_t)n + 1);
	assert_int_equal(m, n);
	assert_int_equal(strlen(buf), (size_t)n);
	return buf;
}

/* "(status=<st>, <number>ms)" right after @at; returns the end of it. */
static const char *check_task_line(const char *at, const char *prefix,
				   const char *st)
{
	char want[128];

	snprintf(want, sizeof(want), "%s (status=%s, ", prefix, st);
	const char *p = strstr(at, want);
	if (!p)
		print_error("missing \"%s\" in:\n%s\n", want, at);
	assert_non_null(p);
	p += strlen(want);
	char *endp = NULL;
	double ms = strtod(p, &endp);
	assert_true(endp != p);
	assert_true(ms >= 0);
	assert_true(strncmp(endp, "ms)", 3) == 0);
	return endp + 3;
}

/* -------------------------------------------------------------- format */

static void format_text_block(void **state)
{
	static const char *goals[] = {"alpha", "beta", "gamma"};
	static const char *sums[] = {"sum-alpha", NULL, "sum-gamma"};
	static const char *errs[] = {NULL, "err-beta", NULL};
	static const int rets[] = {0, -EIO, 0};
	struct evfix f;
	char id[64];

	make_event(&f, 3, goals, sums, errs, rets, "ctx-line", "sess-line");
	char *buf = format_alloc(f.ev, false);
	snprintf(id, sizeof(id), FANOUT_ID_FMT, (unsigned long long)f.ev->id);
	assert_int_equal(strlen(id), 6 + 16);

	/* header line: the id and the overall status */
	const char *nl = strchr(buf, '\n');
	assert_non_null(nl);
	char *head = strndup(buf, (size_t)(nl - buf));
	assert_contains(head, id);
	assert_contains(head, "completed");
	free(head);
	assert_contains(buf, "ctx-line");
	assert_contains(buf, "sess-line");

	const char *t1 = strstr(buf, "TASK 1/3: alpha");
	const char *t2 = strstr(buf, "TASK 2/3: beta");
	const char *t3 = strstr(buf, "TASK 3/3: gamma");
	assert_non_null(t1);
	assert_non_null(t2);
	assert_non_null(t3);
	assert_true(t1 < t2 && t2 < t3);
	check_task_line(buf, "TASK 1/3: alpha", "completed");
	check_task_line(buf, "TASK 2/3: beta", "error");
	check_task_line(buf, "TASK 3/3: gamma", "completed");
	/* each child's summary or error follows its own TASK line */
	const char *s1 = strstr(buf, "sum-alpha");
	const char *e2 = strstr(buf, "err-beta");
	const char *s3 = strstr(buf, "sum-gamma");
	assert_true(s1 && t1 < s1 && s1 < t2);
	assert_true(e2 && t2 < e2 && e2 < t3);
	assert_true(s3 && t3 < s3);
	assert_null(strstr(buf, "(null)"));
	free(buf);
	drop_event(&f);
}

/*
 * "followed by its summary or error, indented": every line of a child's
 * error is, as every line of its summary is, so no line a child writes
 * can pass for a TASK line of its own.  (Its later lines started at the
 * margin.)
 */
static void format_multiline_error_indented(void **state)
{
	static const char *goals[] = {"one", "two"};
	static const char *sums[] = {"s1\ns2", NULL};
	static const char *errs[] = {NULL, "e1\nTASK 3/2: forged "
					   "(status=completed, 0.0ms)\r\ne3"};
	static const int rets[] = {0, -EIO};
	struct evfix f;

	make_event(&f, 2, goals, sums, errs, rets, NULL, NULL);
	char *buf = format_alloc(f.ev, false);
	assert_contains(buf, "TASK 1/2: one (status=completed, ");
	assert_contains(buf, "ms)\n  s1\n  s2\nTASK 2/2: two (status=error, ");
	assert_contains(buf, "ms)\n  error: e1\n  TASK 3/2: forged "
			     "(status=completed, 0.0ms)\n  e3\n");
	/* the only lines at the margin: the header and the TASK lines */
	for (const char *l = buf; *l; l = strchr(l, '\n') + 1) {
		if (l != buf && *l != ' ' && strncmp(l, "TASK ", 5) != 0)
			fail_msg("line at the margin: %.40s\nin:\n%s", l, buf);
		if (strncmp(l, "TASK ", 5) == 0 &&
		    strncmp(l, "TASK 1/2: one", 13) != 0 &&
		    strncmp(l, "TASK 2/2: two", 13) != 0)
			fail_msg("forged TASK line in:\n%s", buf);
	}
	free(buf);
	drop_event(&f);
}

/*
 * The same for the batch's strings: a goal, context or session key of
 * several lines had its later lines at the margin, where one could pass
 * for a TASK line (or a context line) of its own.  They are indented now.
 */
static void format_multiline_goal_context_indented(void **state)
{
	static const char *goals[] = {"one\nTASK 3/2: forged "
				      "(status=completed, 0.0ms)",
				      "two\r\ncontext: fake"};
	static const int rets[] = {0, 0};
	struct evfix f;

	make_event(&f, 2, goals, NULL, NULL, rets,
		   "ctx\nTASK 4/2: forged (status=completed, 0.0ms)",
		   "key\nsession: fake");
	char *buf = format_alloc(f.ev, false);
	assert_contains(buf, "context: ctx\n  TASK 4/2: forged "
			     "(status=completed, 0.0ms)\n");
	assert_contains(buf, "session: key\n  session: fake\n");
	assert_contains(buf, "TASK 1/2: one\n  TASK 3/2: forged "
			     "(status=completed, 0.0ms) (status=completed, ");
	assert_contains(buf, "TASK 2/2: two\n  context: fake (status=");
	/* at the margin: the header, one context line, one session line and
	 * the two TASK lines, nothing else */
	unsigned ctx = 0, sess = 0;
	for (const char *l = buf; *l; l = strchr(l, '\n') + 1) {
		if (l == buf || *l == ' ')
			continue;
		if (strncmp(l, "context: ", 9) == 0)
			ctx++;
		else if (strncmp(l, "session: ", 9) == 0)
			sess++;
		else if (strncmp(l, "TASK 1/2: one", 13) != 0 &&
			 strncmp(l, "TASK 2/2: two", 13) != 0)
			fail_msg("line at the margin: %.40s\nin:\n%s", l, buf);
	}
	if (ctx != 1 || sess != 1)
		fail_msg("%u context, %u session lines in:\n%s", ctx, sess,
			 buf);
	free(buf);
	drop_event(&f);
}

static void format_statuses(void **state)
{
	static const int rets[] = {-ECANCELED, -ECANCELED};
	struct evfix f;

	make_event(&f, 2, NULL, NULL, NULL, rets, NULL, NULL);
	char *buf = format_alloc(f.ev, false);
	check_task_line(buf, "TASK 1/2: task-0", "interrupted");
	check_task_line(buf, "TASK 2/2: task-1", "interrupted");
	const char *nl = strchr(buf, '\n');
	assert_non_null(nl);
	char *head = strndup(buf, (size_t)(nl - buf));
	assert_contains(head, "interrupted");
	free(head);
	/* no context, no session, no summaries: nothing printed as (null) */
	assert_null(strstr(buf, "(null)"));
	free(buf);
	drop_event(&f);
}

static void format_many_tasks(void **state)
{
	struct evfix f;

	make_event(&f, 12, NULL, NULL, NULL, NULL, NULL, NULL);
	char *buf = format_alloc(f.ev, false);
	check_task_line(buf, "TASK 1/12: task-0", "completed");
	check_task_line(buf, "TASK 10/12: task-9", "completed");
	check_task_line(buf, "TASK 12/12: task-11", "completed");
	free(buf);
	drop_event(&f);
}

static void check_snprintf_semantics(const struct fanout_event *ev, bool json)
{
	int (*fmt)(const struct fanout_event *, char *, size_t) =
		json ? fanout_event_json : fanout_format;
	char *full = format_alloc(ev, json);
	int n = (int)strlen(full);
	static const size_t lens[] = {1, 2, 10, 33};

	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		size_t len = lens[k];
		char *buf = malloc(len + 8);

		assert_non_null(buf);
		memset(buf, 'Q', len + 8);
		assert_int_equal(fmt(ev, buf, len), n);
		size_t want = (size_t)n < len - 1 ? (size_t)n : len - 1;
		assert_int_equal(strlen(buf), want);
		assert_memory_equal(buf, full, want);
		/* nothing written past len */
		for (size_t i = len; i < len + 8; i++)
			assert_int_equal(buf[i], 'Q');
		free(buf);
	}
	/* exactly n bytes: the last character is cut for the NUL */
	char *buf = malloc((size_t)n);
	assert_non_null(buf);
	assert_int_equal(fmt(ev, buf, (size_t)n), n);
	assert_int_equal(strlen(buf), (size_t)n - 1);
	assert_memory_equal(buf, full, (size_t)n - 1);
	free(buf);
	assert_int_equal(fmt(ev, NULL, 0), n);
	assert_int_equal(fmt(NULL, NULL, 0), -EINVAL);
	char small[4];
	assert_int_equal(fmt(NULL, small, sizeof(small)), -EINVAL);
	assert_int_equal(fmt(ev, NULL, 5), -EINVAL);
	free(full);
}

static void format_snprintf_semantics(void **state)
{
	static const char *sums[] = {"first summary", "second"};
	struct evfix f;

	make_event(&f, 2, NULL, sums, NULL, NULL, "ctx", "key");
	check_snprintf_semantics(f.ev, false);
	drop_event(&f);
}

static void json_snprintf_semantics(void **state)
{
	static const char *sums[] = {"first summary", "second"};
	struct evfix f;

	make_event(&f, 2, NULL, sums, NULL, NULL, "ctx", "key");
	check_snprintf_semantics(f.ev, true);
	drop_event(&f);
}

/* ---------------------------------------------------------------- json */

/* An event string as JSON must carry it: itself when it is valid UTF-8 (the
 * bytes come back exactly), else anything valid (jansson checked that). */
static void assert_jstr_of(json_t *o, const char *key, const char *have)
{
	if (!have || utf8_any_ctl(have))
		assert_jstr(o, key, have);
	else
		assert_true(json_is_string(json_object_get(o, key)));
}

/*
 * Parse the event's JSON strictly, check its bytes are strict UTF-8 with no
 * raw control character, and every member against the event; strings given
 * by the caller (goals, sums, errs, ctx, key; NULL = not checked) must come
 * back byte-identical.  Returns the root for more checks (caller frees).
 */
static json_t *check_json(const struct fanout_event *ev, const char **goals,
			  const char **sums, const char **errs, const char *ctx,
			  const char *key)
{
	char *buf = format_alloc(ev, true);
	size_t len = strlen(buf);
	json_t *root, *res;
	char id[64];

	assert_true(len >= 2);
	assert_int_equal(buf[len - 1], '}'); /* no trailing newline */
	if (!utf8_strict(buf, len, 0, true))
		fail_msg("JSON is not strict UTF-8: %s", buf);
	root = json_parse(buf, len);
	assert_true(json_is_object(root));

	snprintf(id, sizeof(id), FANOUT_ID_FMT, (unsigned long long)ev->id);
	assert_jstr(root, "id", id);
	assert_jstr(root, "status", fanout_status_name(ev->status));
	assert_jstr(root, "error", ev->error);
	assert_jstr_of(root, "context", ev->context);
	assert_jstr_of(root, "session_key", ev->session_key);
	if (ctx)
		assert_jstr(root, "context", ctx);
	if (key)
		assert_jstr(root, "session_key", key);
	assert_true(jint(root, "dispatched_ns") ==
		    (json_int_t)ev->dispatched_ns);
	assert_true(jint(root, "completed_ns") == (json_int_t)ev->completed_ns);
	assert_true(jnum(root, "cost") == ev->cost);
	assert_int_equal(jint(root, "completed"), ev->ncompleted);
	assert_int_equal(jint(root, "errors"), ev->nerror);
	assert_int_equal(jint(root, "interrupted"), ev->ninterrupted);
	assert_true(json_is_boolean(json_object_get(root, "cancelled")));
	assert_int_equal(json_is_true(json_object_get(root, "cancelled")),
			 ev->cancelled);
	assert_true(json_is_boolean(json_object_get(root, "timed_out")));
	assert_int_equal(json_is_true(json_object_get(root, "timed_out")),
			 ev->timed_out);
	assert_true(json_is_boolean(
		json_object_get(root, "interrupted_by_policy")));
	assert_int_equal(
		json_is_true(json_object_get(root, "interrupted_by_policy")),
		ev->interrupted_by_policy);
	assert_int_equal(json_object_size(root), 15);

	res = json_object_get(root, "results");
	assert_true(json_is_array(res));
	assert_int_equal(json_array_size(res), ev->nresults);
	for (unsigned i = 0; i < ev->nresults; i++) {
		const struct fanout_result *r = &ev->results[i];
		json_t *o = json_array_get(res, i);

		assert_true(json_is_object(o));
		assert_int_equal(json_object_size(o), 8);
		assert_int_equal(jint(o, "index"), r->index);
		assert_jstr(o, "status", fanout_status_name(r->status));
		assert_jstr_of(o, "goal", r->goal);
		assert_jstr_of(o, "summary", r->summary);
		assert_jstr_of(o, "error",
			       r->status == FANOUT_COMPLETED ? NULL : r->error);
		assert_int_equal(jint(o, "code"), r->code);
		assert_true(jint(o, "duration_ns") ==
			    (json_int_t)r->duration_ns);
		assert_true(jnum(o, "cost") == r->cost);
		if (goals)
			assert_jstr(o, "goal", goals[i]);
		if (sums && sums[i])
			assert_jstr(o, "summary", sums[i]);
		if (errs && errs[i])
			assert_jstr(o, "error", errs[i]);
	}
	free(buf);
	return root;
}

static void check_json_event(const struct fanout_event *ev, const char **goals,
			     const char **sums, const char **errs,
			     const char *ctx, const char *key)
{
	json_decref(check_json(ev, goals, sums, errs, ctx, key));
}

static void json_valid_and_escaped(void **state)
{
	static const char *goals[] = {
		"quote\" back\\slash /slash",
		"new\nline\ttab\rcr\bbs\ffeed",
		"ctrl\x01\x02\x1f del\x7f end",
		"utf8 \xc3\xbc \xe2\x82\xac \xf0\x9f\x98\x80",
	};
	static const char *sums[] = {
		"summary with \"quotes\" and \\",
		"multi\nline\nsummary\n",
		NULL,
		"\x1b[31mansi\x1b[0m",
	};
	static const char *errs[] = {NULL, NULL, "err \"x\"\n\x01", NULL};
	static const int rets[] = {0, 0, -EIO, 0};
	struct evfix f;

	make_event(&f, 4, goals, sums, errs, rets, "ctx \"quoted\"\n\\",
		   "key\twith\ttabs");
	check_json_event(f.ev, goals, sums, errs, "ctx \"quoted\"\n\\",
			 "key\twith\ttabs");
	drop_event(&f);
}

static void json_nulls_and_statuses(void **state)
{
	static const int rets[] = {-ECANCELED, -EIO, 0};
	struct evfix f;

	make_event(&f, 3, NULL, NULL, NULL, rets, NULL, NULL);
	check_json_event(f.ev, NULL, NULL, NULL, NULL, NULL);
	drop_event(&f);
}

static void json_large_summary(void **state)
{
	size_t n = 100000;
	char *big = malloc(n + 1);
	struct evfix f;

	assert_non_null(big);
	for (size_t i = 0; i < n; i++)
		big[i] = "ab\"\\\n\x01"[i % 6];
	big[n] = '\0';
	const char *sums[] = {big};
	make_event(&f, 1, NULL, sums, NULL, NULL, NULL, NULL);
	check_json_event(f.ev, NULL, sums, NULL, NULL, NULL);
	char *txt = format_alloc(f.ev, false);
	assert_true(strlen(txt) > n / 2);
	free(txt);
	drop_event(&f);
	free(big);
}

/* ------------------------------------------------- bytes that are not text */

/* jansson is the judge below: it must reject what the library must never
 * write, and so must the test's own validator. */
static void jansson_is_strict(void **state)
{
	static const char *bad[] = {
		"\"\xc3\"",		/* cut */
		"\"\xe2\x82\"",		/* cut */
		"\"\xed\xa0\x80\"",	/* lone surrogate, 3 bytes */
		"\"\xc0\xaf\"",		/* overlong */
		"\"\xf4\x90\x80\x80\"", /* above U+10FFFF */
		"\"\x80\"",		/* stray continuation */
		"\"\xff\"",		/* starts nothing */
		"\"a\x01\"",		/* raw control */
		"\"a\nb\"",		/* raw newline */
	};
	json_error_t err;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		json_t *j = json_loadb(bad[i], strlen(bad[i]), JSON_DECODE_ANY,
				       &err);

		if (j)
			fail_msg("jansson accepted bad input %zu", i);
		/* the validator agrees on the bytes inside the quotes */
		assert_false(
			utf8_strict(bad[i] + 1, strlen(bad[i]) - 2, 0, true));
	}
	assert_null(
		json_loads("{\"a\":1,\"a\":2}", JSON_REJECT_DUPLICATES, &err));
	const char *good = "\"\xf0\x9f\x98\x80 \xef\xbf\xbf \xf4\x8f\xbf\xbf "
			   "\xc2\x80\"";
	json_t *j = json_loadb(good, strlen(good), JSON_DECODE_ANY, &err);
	assert_non_null(j);
	assert_int_equal(json_string_length(j), strlen(good) - 2);
	json_decref(j);
	assert_true(utf8_strict(good, strlen(good), 0, true));
	assert_false(utf8_strict(good, strlen(good), 0, false)); /* C1 */
}

/* Ill-formed UTF-8 and what each maximal ill-formed part becomes (one
 * U+FFFD each; the same as Python's decode(errors="replace")). */
static const struct {
	const char *in, *want;
} bad_utf8[] = {
	{"cut \xc3", "cut " R},
	{"ab\xe2\x82", "ab" R},
	{"\xf0\x9f\x98", R},
	{"\xe2\x82x\xf0\x9f\x98y\xc3", R "x" R "y" R},
	{"\xed\xa0\x80|\xed\xbf\xbf|\xed\xb0\x80", /* lone surrogates */
	 R R R "|" R R R "|" R R R},
	{"\xc0\xaf|\xe0\x80\xaf|\xf0\x80\x80\xaf|\xc1\xbf", /* overlongs */
	 R R "|" R R R "|" R R R R "|" R R},
	{"\xf4\x90\x80\x80|\xf5\x80|\xf8\x88\x80\x80\x80", /* > U+10FFFF */
	 R R R R "|" R R "|" R R R R R},
	{"\x80\xbf|\xfe\xff|a\x80", R R "|" R R "|a" R}, /* stray bytes */
	{"ok \xf0\x9f\x98\x80 \xe2\x82\xac \xc3\xbc \xef\xbf\xbf "
	 "\xf4\x8f\xbf\xbf",
	 "ok \xf0\x9f\x98\x80 \xe2\x82\xac \xc3\xbc \xef\xbf\xbf "
	 "\xf4\x8f\xbf\xbf"},
};
#define NBAD (sizeof(bad_utf8) / sizeof(bad_utf8[0]))

static void json_bad_utf8_replaced(void **state)
{
	const char *goals[NBAD], *sums[NBAD], *errs[NBAD], *wg[NBAD], *we[NBAD];
	int rets[NBAD];
	struct evfix f;

	for (unsigned i = 0; i < NBAD; i++) {
		goals[i] = sums[i] = bad_utf8[i].in;
		wg[i] = bad_utf8[i].want;
		errs[i] = i & 1 ? bad_utf8[i].in : NULL;
		we[i] = i & 1 ? bad_utf8[i].want : NULL;
		rets[i] = i & 1 ? -EIO : 0;
	}
	make_event(&f, NBAD, goals, sums, errs, rets, bad_utf8[1].in,
		   bad_utf8[4].in);
	json_decref(check_json(f.ev, wg, wg, we, bad_utf8[1].want,
			       bad_utf8[4].want));

	/* the text: the same replacements, clean UTF-8 throughout */
	char *txt = format_alloc(f.ev, false);
	if (!utf8_strict(txt, strlen(txt), 1u << '\n' | 1u << '\t', false))
		fail_msg("text is not clean UTF-8:\n%s", txt);
	for (unsigned i = 0; i < NBAD; i++) {
		char want[256];

		snprintf(want, sizeof(want), "TASK %u/%u: %s (", i + 1,
			 (unsigned)NBAD, bad_utf8[i].want);
		assert_contains(txt, want);
		snprintf(want, sizeof(want), "\n  %s\n", bad_utf8[i].want);
		assert_contains(txt, want);
	}
	assert_contains(txt, "context: "
			     "ab" R "\n");
	free(txt);
	drop_event(&f);
}

/* Every control character, DEL and C1: escaped in JSON and given back
 * exactly; in the text, U+FFFD but for \n and \t (and \r\n reads \n). */
static void json_and_text_controls(void **state)
{
	char all[64], *p = all;
	const char *sums[2], *goals[2] = {"g0", "g1"};
	struct evfix f;

	*p++ = '<';
	for (int c = 1; c < 0x20; c++)
		*p++ = (char)c;
	*p++ = 0x7f;
	memcpy(p, "\xc2\x80\xc2\x9b\xc2\x9f\xc2\xa0>", 9); /* C1, then NBSP */
	p += 9;
	*p = '\0';
	sums[0] = all;
	sums[1] = "a\x01"
		  "b\x1b[1mc\r\nd\te\rf\xc2\x9bg";
	make_event(&f, 2, goals, sums, NULL, NULL, "ctx\x7f", "key\x1b");
	json_decref(check_json(f.ev, goals, sums, NULL, "ctx\x7f", "key\x1b"));

	char *js = format_alloc(f.ev, true);
	static const char *esc[] = {"\\u0001", "\\b",	  "\\t",
				    "\\n",     "\\f",	  "\\r",
				    "\\u001b", "\\u001f", "\\u007f"};
	for (size_t i = 0; i < sizeof(esc) / sizeof(esc[0]); i++)
		assert_contains(js, esc[i]);
	free(js);

	char *txt = format_alloc(f.ev, false);
	if (!utf8_strict(txt, strlen(txt), 1u << '\n' | 1u << '\t', false))
		fail_msg("text is not clean UTF-8:\n%s", txt);
	assert_contains(txt, "\n  a" R "b" R "[1mc\n  d\te" R "f" R "g\n");
	assert_contains(txt, "context: ctx" R "\n");
	assert_contains(txt, "session: key" R "\n");
	/* summary 0: each control but \t and \n, DEL and the C1 ones become
	 * one U+FFFD; NBSP (U+00A0) stays */
	char want[256] = "\n  <";
	for (int c = 1; c < 0x20; c++)
		strcat(want, c == '\t' ? "\t" : c == '\n' ? "\n  " : R);
	strcat(want, R R R R "\xc2\xa0>\n");
	assert_contains(txt, want);
	free(txt);
	drop_event(&f);
}

/* A child cuts its summary by bytes, mid-character; another one's holds a
 * NUL (strings are read up to it). */
static const char euros[] = "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac";

static int cut_child(struct fanout_child *c, void *arg)
{
	unsigned i = fanout_child_index(c);

	if (i < 3)
		CHECK(fanout_set_summary(c, euros, (size_t[]){8, 7, 5}[i]) ==
		      0);
	else if (i == 3)
		CHECK(fanout_set_summary(c, "a\0b", 3) == 0);
	else
		CHECK(fanout_set_summary(c, "\xf0\x9f\x98\x80\xf0\x9f", 6) ==
		      0);
	return 0;
}

static void json_summary_cut_mid_character(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_task t[5];
	struct fanout_batch b = {.tasks = t, .ntasks = 5};
	struct fanout_event *ev = NULL;
	static const char *want[] = {
		"\xe2\x82\xac\xe2\x82\xac" R, /* 8 bytes: 2 of the 3rd */
		"\xe2\x82\xac\xe2\x82\xac" R, /* 7 bytes: 1 of the 3rd */
		"\xe2\x82\xac" R,	      /* 5 bytes */
		"a",
		"\xf0\x9f\x98\x80" R,
	};

	memset(t, 0, sizeof(t));
	for (int i = 0; i < 5; i++)
		t[i].fn = cut_child;
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	json_decref(check_json(ev, NULL, want, NULL, NULL, NULL));
	char *txt = format_alloc(ev, false);
	if (!utf8_strict(txt, strlen(txt), 1u << '\n' | 1u << '\t', false))
		fail_msg("text is not clean UTF-8:\n%s", txt);
	free(txt);
	fanout_event_free(ev);
	fanout_destroy(e);
}

/*
 * More than INT_MAX bytes: -EOVERFLOW, and an empty string in the buffer.
 * A hand-built event (the writers read only the event): 33 results sharing
 * one 64 MiB goal make 2112 MiB of text.  Each call scans 2 GiB, seconds
 * under a sanitizer for code that is single-threaded and checked there by
 * every other test: the plain build runs it.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define OVERFLOW_TEST 0
#else
#define OVERFLOW_TEST 1
#endif

#if OVERFLOW_TEST
static void format_overflow(void **state)
{
	size_t n = (size_t)64 << 20;
	char *big = malloc(n + 1);
	struct fanout_result *res = calloc(33, sizeof(*res));
	struct fanout_event ev;
	char buf[16];

	assert_non_null(big);
	assert_non_null(res);
	memset(big, 'a', n);
	big[n] = '\0';
	for (unsigned i = 0; i < 33; i++) {
		res[i].index = i;
		res[i].status = FANOUT_COMPLETED;
		res[i].goal = big;
	}
	memset(&ev, 0, sizeof(ev));
	ev.id = 1;
	ev.status = FANOUT_COMPLETED;
	ev.results = res;
	ev.nresults = 33;
	ev.ncompleted = 33;
	memset(buf, 'x', sizeof(buf));
	assert_int_equal(fanout_format(&ev, buf, sizeof(buf)), -EOVERFLOW);
	assert_int_equal(buf[0], '\0');
	memset(buf, 'x', sizeof(buf));
	assert_int_equal(fanout_event_json(&ev, buf, sizeof(buf)), -EOVERFLOW);
	assert_int_equal(buf[0], '\0');
	free(res);
	free(big);
}
#endif

/*
 * "The same event as one JSON object": the event's flags are all there,
 * timed_out and interrupted_by_policy included (a deadline or a policy
 * that stopped a batch some of whose children completed leaves its status
 * COMPLETED and error NULL; the flags are what tells).  A hand-built event
 * (the writers read only the event), each flag alone and both.
 */
static void json_carries_every_flag(void **state)
{
	struct fanout_result res = {.index = 0,
				    .status = FANOUT_COMPLETED,
				    .goal = "g",
				    .duration_ns = 1};
	struct fanout_event ev;

	for (unsigned k = 1; k < 4; k++) {
		memset(&ev, 0, sizeof(ev));
		ev.id = 7;
		ev.status = FANOUT_COMPLETED;
		ev.results = &res;
		ev.nresults = 1;
		ev.ncompleted = 1;
		ev.dispatched_ns = 1;
		ev.completed_ns = 2;
		ev.timed_out = k & 1;
		ev.interrupted_by_policy = (k & 2) != 0;
		json_decref(check_json(&ev, NULL, NULL, NULL, NULL, NULL));
	}
}

/* ------------------------------------------------------------ strerror */

/* Every code a fanout_* call returns (fanout_format and fanout_event_json
 * return -EOVERFLOW; fanout_worker_stats -ERANGE; a sink's eventfd
 * -EMFILE/-ENFILE; a batch.within abandoned -ECANCELED): each has a text
 * of its own, not the "not one fanout returns" of an unknown code. */
static const int named[] = {EBUSY,	EINVAL,	  E2BIG,    ELOOP,  ENOMEM,
			    ESHUTDOWN,	ENOENT,	  EALREADY, EAGAIN, ETIMEDOUT,
			    EDEADLK,	EMFILE,	  ENFILE,   ERANGE, ECANCELED,
			    EOWNERDEAD, EOVERFLOW};

static void strerror_named_codes(void **state)
{
	const char *unknown = fanout_strerror(-123456);
	size_t nn = sizeof(named) / sizeof(named[0]);

	assert_non_null(unknown);
	for (size_t i = 0; i < nn; i++) {
		const char *m = fanout_strerror(-named[i]);

		assert_non_null(m);
		if (strlen(m) == 0)
			fail_msg("empty message for %d", -named[i]);
		if (strcmp(m, unknown) == 0)
			fail_msg("generic message for %d: %s", -named[i], m);
		assert_string_equal(fanout_strerror(named[i]), m);
		for (size_t j = 0; j < i; j++)
			if (strcmp(m, fanout_strerror(-named[j])) == 0)
				fail_msg("%d and %d share \"%s\"", -named[i],
					 -named[j], m);
	}
	/* A code with two meanings names both: -EAGAIN is an empty sink
	 * (poll), a worker fanout_create could not start, and the timer
	 * thread a first deadline dispatch/run could not start. */
	assert_contains(fanout_strerror(-EAGAIN), "no event waiting");
	assert_contains(fanout_strerror(-EAGAIN), "worker thread");
	assert_contains(fanout_strerror(-EAGAIN), "timer thread");
	/* static storage: the same answer twice */
	assert_ptr_equal(fanout_strerror(-EBUSY), fanout_strerror(-EBUSY));
}

static void strerror_unknown_codes(void **state)
{
	static const int odd[] = {0,	   1,	       -1,	4095,
				  -4095,   123456,     -123456, INT_MAX,
				  INT_MIN, INT_MIN + 1};

	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		const char *m = fanout_strerror(odd[i]);

		assert_non_null(m);
	}
	assert_non_null(fanout_strerror(-ECANCELED));
	assert_non_null(fanout_strerror(-EMFILE));
}

/* Costs summed past the largest double are inf, which JSON cannot say:
 * the JSON has null there and still parses (it had "cost":inf). */
static void json_cost_overflow_is_null(void **state)
{
	struct evfix f;
	json_t *root, *res;

	f.e = NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	f.tb = tb_new(2);
	f.tb->probes[0].cost = DBL_MAX;
	f.tb->probes[1].cost = DBL_MAX;
	assert_int_equal(fanout_run(f.e, &f.tb->b, &f.ev), 0);
	assert_true(isinf(f.ev->cost));
	char *buf = format_alloc(f.ev, true);
	root = json_parse(buf, strlen(buf));
	assert_non_null(root);
	assert_true(json_is_null(json_object_get(root, "cost")));
	res = json_array_get(json_object_get(root, "results"), 0);
	assert_true(json_is_number(json_object_get(res, "cost")));
	json_decref(root);
	free(buf);
	drop_event(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(format_text_block),
		TC(format_statuses),
		TC(format_multiline_error_indented),
		TC(format_multiline_goal_context_indented),
		TC(format_many_tasks),
		TC(format_snprintf_semantics),
		TC(json_snprintf_semantics),
		TC(json_valid_and_escaped),
		TC(json_nulls_and_statuses),
		TC(json_cost_overflow_is_null),
		TC(json_carries_every_flag),
		TC(json_large_summary),
		TC(jansson_is_strict),
		TC(json_bad_utf8_replaced),
		TC(json_and_text_controls),
		TC(json_summary_cut_mid_character),
#if OVERFLOW_TEST
		TC(format_overflow),
#endif
		TC(strerror_named_codes),
		TC(strerror_unknown_codes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
