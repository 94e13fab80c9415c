/* SPDX-License-Identifier: MIT */
/* test_format.c - fanout_format, fanout_event_json, fanout_strerror. */
#include "common.h"

/* ------------------------------------------------- a small JSON parser */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jv {
	enum jtype t;
	char *s; /* J_STR: decoded bytes (NUL-terminated); J_NUM: text */
	size_t slen;
	size_t n;     /* J_ARR/J_OBJ: number of members */
	struct jv *v; /* members */
	char **k;     /* J_OBJ: keys (decoded) */
	bool b;
};

struct jp {
	const char *p, *end;
	const char *err;
};

static void jv_free(struct jv *j)
{
	if (!j)
		return;
	for (size_t i = 0; i < j->n; i++) {
		jv_free(&j->v[i]);
		if (j->k)
			free(j->k[i]);
	}
	free(j->v);
	free(j->k);
	free(j->s);
	memset(j, 0, sizeof(*j));
}

static void ws(struct jp *p)
{
	while (p->p < p->end && (*p->p == ' ' || *p->p == '\t' ||
				 *p->p == '\n' || *p->p == '\r'))
		p->p++;
}

static bool jfail(struct jp *p, const char *why)
{
	if (!p->err)
		p->err = why;
	return false;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static bool hex4(struct jp *p, unsigned *out)
{
	unsigned v = 0;

	if (p->end - p->p < 4)
		return jfail(p, "short \\u escape");
	for (int i = 0; i < 4; i++) {
		int h = hexval(p->p[i]);

		if (h < 0)
			return jfail(p, "bad hex in \\u escape");
		v = v * 16 + (unsigned)h;
	}
	p->p += 4;
	*out = v;
	return true;
}

static void put_utf8(char *buf, size_t *n, unsigned cp)
{
	if (cp < 0x80) {
		buf[(*n)++] = (char)cp;
	} else if (cp < 0x800) {
		buf[(*n)++] = (char)(0xc0 | (cp >> 6));
		buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
	} else if (cp < 0x10000) {
		buf[(*n)++] = (char)(0xe0 | (cp >> 12));
		buf[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
	} else {
		buf[(*n)++] = (char)(0xf0 | (cp >> 18));
		buf[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
		buf[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
	}
}

static bool jstring(struct jp *p, char **out, size_t *outlen)
{
	size_t cap = (size_t)(p->end - p->p) + 8, n = 0;
	char *buf = malloc(cap);

	if (!buf)
		return jfail(p, "oom");
	p->p++; /* opening quote */
	for (;;) {
		if (p->p >= p->end) {
			free(buf);
			return jfail(p, "unterminated string");
		}
		unsigned char c = (unsigned char)*p->p++;

		if (c == '"')
			break;
		if (c < 0x20) {
			free(buf);
			return jfail(p, "raw control character in string");
		}
		if (c != '\\') {
			buf[n++] = (char)c;
			continue;
		}
		if (p->p >= p->end) {
			free(buf);
			return jfail(p, "dangling backslash");
		}
		char esc = *p->p++;
		unsigned cp, lo;

		switch (esc) {
		case '"':
			buf[n++] = '"';
			break;
		case '\\':
			buf[n++] = '\\';
			break;
		case '/':
			buf[n++] = '/';
			break;
		case 'b':
			buf[n++] = '\b';
			break;
		case 'f':
			buf[n++] = '\f';
			break;
		case 'n':
			buf[n++] = '\n';
			break;
		case 'r':
			buf[n++] = '\r';
			break;
		case 't':
			buf[n++] = '\t';
			break;
		case 'u':
			if (!hex4(p, &cp)) {
				free(buf);
				return false;
			}
			if (cp >= 0xd800 && cp < 0xdc00) {
				if (p->end - p->p < 6 || p->p[0] != '\\' ||
				    p->p[1] != 'u') {
					free(buf);
					return jfail(p, "lone high surrogate");
				}
				p->p += 2;
				if (!hex4(p, &lo) || lo < 0xdc00 ||
				    lo > 0xdfff) {
					free(buf);
					return jfail(p, "bad low surrogate");
				}
				cp = 0x10000 + ((cp - 0xd800) << 10) +
				     (lo - 0xdc00);
			} else if (cp >= 0xdc00 && cp < 0xe000) {
				free(buf);
				return jfail(p, "lone low surrogate");
			}
			put_utf8(buf, &n, cp);
			break;
		default:
			free(buf);
			return jfail(p, "unknown escape");
		}
	}
	buf[n] = '\0';
	*out = buf;
	*outlen = n;
	return true;
}

static bool jvalue(struct jp *p, struct jv *out, int depth);

static bool jnumber(struct jp *p, struct jv *out)
{
	const char *s = p->p;

	if (p->p < p->end && *p->p == '-')
		p->p++;
	if (p->p >= p->end)
		return jfail(p, "bad number");
	if (*p->p == '0') {
		p->p++;
	} else if (*p->p >= '1' && *p->p <= '9') {
		while (p->p < p->end && *p->p >= '0' && *p->p <= '9')
			p->p++;
	} else {
		return jfail(p, "bad number");
	}
	if (p->p < p->end && *p->p == '.') {
		p->p++;
		if (p->p >= p->end || *p->p < '0' || *p->p > '9')
			return jfail(p, "bad fraction");
		while (p->p < p->end && *p->p >= '0' && *p->p <= '9')
			p->p++;
	}
	if (p->p < p->end && (*p->p == 'e' || *p->p == 'E')) {
		p->p++;
		if (p->p < p->end && (*p->p == '+' || *p->p == '-'))
			p->p++;
		if (p->p >= p->end || *p->p < '0' || *p->p > '9')
			return jfail(p, "bad exponent");
		while (p->p < p->end && *p->p >= '0' && *p->p <= '9')
			p->p++;
	}
	out->t = J_NUM;
	out->slen = (size_t)(p->p - s);
	out->s = strndup(s, out->slen);
	return out->s ? true : jfail(p, "oom");
}

static bool jlit(struct jp *p, const char *lit)
{
	size_t n = strlen(lit);

	if ((size_t)(p->end - p->p) < n || memcmp(p->p, lit, n) != 0)
		return jfail(p, "bad literal");
	p->p += n;
	return true;
}

static bool jpush(struct jv *out, char *key)
{
	struct jv *v = realloc(out->v, (out->n + 1) * sizeof(*v));

	if (!v)
		return false;
	out->v = v;
	memset(&out->v[out->n], 0, sizeof(*v));
	if (out->t == J_OBJ) {
		char **k = realloc(out->k, (out->n + 1) * sizeof(*k));

		if (!k)
			return false;
		out->k = k;
		out->k[out->n] = key;
	}
	out->n++;
	return true;
}

static bool jvalue(struct jp *p, struct jv *out, int depth)
{
	memset(out, 0, sizeof(*out));
	if (depth > 64)
		return jfail(p, "too deep");
	ws(p);
	if (p->p >= p->end)
		return jfail(p, "unexpected end");
	switch (*p->p) {
	case '"':
		out->t = J_STR;
		return jstring(p, &out->s, &out->slen);
	case 't':
		out->t = J_BOOL;
		out->b = true;
		return jlit(p, "true");
	case 'f':
		out->t = J_BOOL;
		return jlit(p, "false");
	case 'n':
		out->t = J_NULL;
		return jlit(p, "null");
	case '[':
		out->t = J_ARR;
		p->p++;
		ws(p);
		if (p->p < p->end && *p->p == ']') {
			p->p++;
			return true;
		}
		for (;;) {
			if (!jpush(out, NULL))
				return jfail(p, "oom");
			if (!jvalue(p, &out->v[out->n - 1], depth + 1))
				return false;
			ws(p);
			if (p->p < p->end && *p->p == ',') {
				p->p++;
				continue;
			}
			if (p->p < p->end && *p->p == ']') {
				p->p++;
				return true;
			}
			return jfail(p, "expected , or ]");
		}
	case '{':
		out->t = J_OBJ;
		p->p++;
		ws(p);
		if (p->p < p->end && *p->p == '}') {
			p->p++;
			return true;
		}
		for (;;) {
			char *key = NULL;
			size_t klen;

			ws(p);
			if (p->p >= p->end || *p->p != '"')
				return jfail(p, "expected key");
			if (!jstring(p, &key, &klen))
				return false;
			for (size_t i = 0; i < out->n; i++)
				if (strcmp(out->k[i], key) == 0) {
					free(key);
					return jfail(p, "duplicate key");
				}
			if (!jpush(out, key)) {
				free(key);
				return jfail(p, "oom");
			}
			ws(p);
			if (p->p >= p->end || *p->p != ':')
				return jfail(p, "expected :");
			p->p++;
			if (!jvalue(p, &out->v[out->n - 1], depth + 1))
				return false;
			ws(p);
			if (p->p < p->end && *p->p == ',') {
				p->p++;
				continue;
			}
			if (p->p < p->end && *p->p == '}') {
				p->p++;
				return true;
			}
			return jfail(p, "expected , or }");
		}
	default:
		if (*p->p == '-' || (*p->p >= '0' && *p->p <= '9'))
			return jnumber(p, out);
		return jfail(p, "unexpected character");
	}
}

/* Parse exactly one JSON value spanning the whole of @s. */
static bool json_parse(const char *s, size_t len, struct jv *out)
{
	struct jp p = {s, s + len, NULL};
	bool ok = jvalue(&p, out, 0);

	if (ok) {
		ws(&p);
		if (p.p != p.end)
			ok = jfail(&p, "trailing garbage");
	}
	if (!ok) {
		print_error("invalid JSON (%s) at offset %td:\n%s\n", p.err,
			    p.p - s, s);
		jv_free(out);
	}
	return ok;
}

static const struct jv *jget(const struct jv *o, const char *key)
{
	if (!o || o->t != J_OBJ)
		return NULL;
	for (size_t i = 0; i < o->n; i++)
		if (strcmp(o->k[i], key) == 0)
			return &o->v[i];
	return NULL;
}

/* Does object @o hold a string member whose decoded value is @want? */
static bool jhas_string(const struct jv *o, const char *want)
{
	if (!o || o->t != J_OBJ)
		return false;
	for (size_t i = 0; i < o->n; i++)
		if (o->v[i].t == J_STR && o->v[i].slen == strlen(want) &&
		    memcmp(o->v[i].s, want, o->v[i].slen) == 0)
			return true;
	return false;
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

static void check_json_event(const struct fanout_event *ev, const char **goals,
			     const char **sums, const char **errs,
			     const char *ctx, const char *key)
{
	char *buf = format_alloc(ev, true);
	size_t len = strlen(buf);
	struct jv root;
	char id[64];

	assert_true(len >= 2);
	assert_int_equal(buf[len - 1], '}'); /* no trailing newline */
	assert_true(json_parse(buf, len, &root));
	assert_int_equal(root.t, J_OBJ);

	const struct jv *jid = jget(&root, "id");
	assert_non_null(jid);
	snprintf(id, sizeof(id), FANOUT_ID_FMT, (unsigned long long)ev->id);
	if (jid->t == J_STR)
		assert_string_equal(jid->s, id);
	else if (jid->t == J_NUM)
		assert_true(strtoull(jid->s, NULL, 10) == ev->id);
	else
		fail_msg("id is neither a string nor a number");

	const struct jv *st = jget(&root, "status");
	assert_non_null(st);
	if (st->t == J_STR)
		assert_string_equal(st->s, fanout_status_name(ev->status));

	const struct jv *res = jget(&root, "results");
	assert_non_null(res);
	assert_int_equal(res->t, J_ARR);
	assert_int_equal(res->n, ev->nresults);
	for (unsigned i = 0; i < ev->nresults; i++) {
		const struct jv *r = &res->v[i];

		assert_int_equal(r->t, J_OBJ);
		if (goals && !jhas_string(r, goals[i]))
			fail_msg("result %u lacks goal \"%s\": %s", i, goals[i],
				 buf);
		if (sums && sums[i] && !jhas_string(r, sums[i]))
			fail_msg("result %u lacks summary: %s", i, buf);
		if (errs && errs[i] && !jhas_string(r, errs[i]))
			fail_msg("result %u lacks error: %s", i, buf);
	}
	if (ctx && !jhas_string(&root, ctx))
		fail_msg("context missing: %s", buf);
	if (key && !jhas_string(&root, key))
		fail_msg("session_key missing: %s", buf);
	jv_free(&root);
	free(buf);
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

/* ------------------------------------------------------------ strerror */

static const int named[] = {EBUSY,     E2BIG,	  EINVAL,  ENOMEM,
			    ESHUTDOWN, ELOOP,	  ENOENT,  EALREADY,
			    EAGAIN,    ETIMEDOUT, EDEADLK, EOWNERDEAD};

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(format_text_block),	     TC(format_statuses),
		TC(format_many_tasks),	     TC(format_snprintf_semantics),
		TC(json_snprintf_semantics), TC(json_valid_and_escaped),
		TC(json_nulls_and_statuses), TC(json_large_summary),
		TC(strerror_named_codes),    TC(strerror_unknown_codes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
