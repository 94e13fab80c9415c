/* SPDX-License-Identifier: MIT */
/*
 * utf8.h - a strict UTF-8 checker for the tests and the fuzzer, which
 * check that fanout_format() and fanout_event_json() emit clean text.
 */
#ifndef FANOUT_TESTS_UTF8_H
#define FANOUT_TESTS_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Strict UTF-8 (RFC 3629): no overlong form, surrogate, code point above
 * U+10FFFF, cut sequence or stray byte.  No C0 control but those in the
 * bitmask @ctl, no DEL; C1 controls (U+0080..U+009F) only if @c1.
 */
static inline bool utf8_strict(const char *str, size_t n, uint32_t ctl, bool c1)
{
	const unsigned char *s = (const unsigned char *)str;

	for (size_t i = 0; i < n;) {
		unsigned c = s[i], k, cp;

		if (c < 0x80) {
			if ((c < 0x20 && !(ctl >> c & 1)) || c == 0x7f)
				return false;
			i++;
			continue;
		}
		k = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
		if (!k || c > 0xf4 || n - i <= k)
			return false;
		cp = c & (0x3fu >> k);
		for (unsigned j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		if (cp < (k == 1 ? 0x80u :
			  k == 2 ? 0x800u :
				   0x10000u) ||
		    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff ||
		    (cp < 0xa0 && !c1))
			return false;
		i += k + 1;
	}
	return true;
}

#endif
