/* SPDX-License-Identifier: MIT */
/*
 * version.c - fanout_version(): the version this library was built as,
 * taken from the header it was compiled with (include/fanout.h).
 */
#include "fanout.h"

const char *fanout_version(void)
{
	return FANOUT_VERSION_STRING;
}
