# SPDX-License-Identifier: MIT
"""cffi build script: the extension fanout._fanout.

API mode.  The extension is the library itself (every lib/*.c and
queue/*.c of the checkout this package sits in, compiled here with
global-dynamic thread-locals and the system allocator, as libfanout.so is)
plus fanout/_glue.c.  So `pip install ./python` needs no prior `make` and
there is no library to find at import time; it needs the Debian packages
the library needs (liburcu-dev, libck-dev) and a C compiler.

Struct layouts are written with `...;`, so the compiler fills them in from
include/fanout.h: fields added to the header do not break the binding.
"""
import glob
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("FANOUT_SOURCE_DIR") or os.path.dirname(HERE)

if not os.path.exists(os.path.join(ROOT, "include", "fanout.h")):
    raise SystemExit(
        f"fanout: the library sources are not at {ROOT} "
        "(include/fanout.h missing); build from the fanout checkout "
        "(pip install ./python) or set FANOUT_SOURCE_DIR")

LIB_SRC = sorted(glob.glob(os.path.join(ROOT, "lib", "*.c")) +
                 glob.glob(os.path.join(ROOT, "queue", "*.c")))


def _implemented(name):
    """True when a lib/*.c defines the public function `name`."""
    pat = re.compile(r"^\w[\w \*]*\b" + name + r"\(", re.M)
    for f in LIB_SRC:
        with open(f) as fh:
            if pat.search(fh.read()):
                return True
    return False


HAVE_DEFER = _implemented("fanout_defer")
with open(os.path.join(ROOT, "include", "fanout.h")) as fh:
    HEADER = fh.read()
HAVE_V02_BATCH = "deadline_ns;" in HEADER

CDEF = """
typedef uint64_t fanout_id;
struct fanout_engine;
struct fanout_sink;
struct fanout_child;
struct fanout_pending;
enum fanout_status { FANOUT_PENDING, FANOUT_RUNNING, FANOUT_COMPLETED,
                     FANOUT_ERROR, FANOUT_INTERRUPTED, ... };
typedef int (*fanout_fn)(struct fanout_child *c, void *arg);

#define FANOUT_NO_PIN ...
#define FANOUT_WAIT_HELPS ...
#define FANOUT_RUNNERS_ON_DEMAND ...
#define FANOUT_CANCEL_PENDING ...
#define FANOUT_CANCEL_INTERRUPT ...
#define FANOUT_BACKGROUND ...
#define FANOUT_INLINE ...
#define FANOUT_INLINE_FULL ...

struct fanout_config {
    unsigned workers; unsigned flags; unsigned queue_slots;
    unsigned max_async; unsigned max_children; unsigned max_tasks;
    unsigned max_depth; unsigned keep_completed; uint64_t spin_ns;
    ...;
};
struct fanout_task { const char *goal; fanout_fn fn; void *arg; };
struct fanout_batch {
    const struct fanout_task *tasks; unsigned ntasks;
    const char *context; const char *session_key;
    struct fanout_sink *sink; void *user;
    %(BATCH_V02)s
    ...;
};
struct fanout_result {
    unsigned index; enum fanout_status status; const char *goal;
    const char *summary; const char *error; uint64_t duration_ns;
    double cost; int code; ...;
};
struct fanout_event {
    fanout_id id; enum fanout_status status; unsigned nresults;
    const struct fanout_result *results; const char *context;
    const char *session_key; const char *error; void *user;
    uint64_t dispatched_ns; uint64_t completed_ns; double cost;
    unsigned ncompleted; unsigned nerror; unsigned ninterrupted;
    bool cancelled;
    %(EVENT_V02)s
    ...;
};
struct fanout_info {
    fanout_id id; enum fanout_status status; unsigned ntasks;
    unsigned ndone; uint64_t dispatched_ns; uint64_t completed_ns;
    double cost; unsigned depth; bool background; bool cancelled;
    void *user;
    %(INFO_V02)s
    ...;
};
struct fanout_worker_stats { uint64_t children_run; uint64_t parks;
                             uint64_t wakeups; int cpu; ...; };
struct fanout_stats {
    uint64_t dispatched; uint64_t runs; uint64_t completed;
    uint64_t rejected; uint64_t cancelled; uint64_t children_run;
    uint64_t children_skipped; uint64_t parks; uint64_t wakeups;
    unsigned running; unsigned async_running; unsigned nworkers;
    struct fanout_worker_stats worker[...];
    ...;
};

const char *fanout_status_name(enum fanout_status st);
int fanout_create(const struct fanout_config *cfg, struct fanout_engine **out);
int fanout_shutdown(struct fanout_engine *e);
void fanout_destroy(struct fanout_engine *e);
int fanout_dispatch(struct fanout_engine *e, const struct fanout_batch *b,
                    fanout_id *id);
int fanout_run(struct fanout_engine *e, const struct fanout_batch *b,
               struct fanout_event **ev);
int fanout_cancel(struct fanout_engine *e, fanout_id id, unsigned how);
int fanout_lookup(struct fanout_engine *e, fanout_id id,
                  struct fanout_info *info);
int fanout_list(struct fanout_engine *e, struct fanout_info *infos,
                size_t cap, size_t *n);
int fanout_stats(struct fanout_engine *e, struct fanout_stats *st);
int fanout_sink_create(struct fanout_engine *e, struct fanout_sink **out);
int fanout_sink_destroy(struct fanout_sink *s);
struct fanout_sink *fanout_default_sink(struct fanout_engine *e);
int fanout_poll(struct fanout_sink *s, struct fanout_event **ev);
int fanout_sink_fd(struct fanout_sink *s);
void fanout_event_free(struct fanout_event *ev);
int fanout_format(const struct fanout_event *ev, char *buf, size_t len);
int fanout_event_json(const struct fanout_event *ev, char *buf, size_t len);
const char *fanout_strerror(int err);
int fanout_describe_error(struct fanout_engine *e, int err, char *buf,
                          size_t len);
uint64_t fanout_now_ns(void);
%(API_V02)s

/* _glue.c */
struct pyfo_glue;
struct pyfo_batch { struct pyfo_glue *g; uint64_t token; };
struct pyfo_start { struct fanout_pending *p; uint64_t token; fanout_id id;
                    unsigned index; };
struct pyfo_glue *pyfo_glue_new(void);
int pyfo_glue_fd(struct pyfo_glue *g);
size_t pyfo_glue_free(struct pyfo_glue *g);
int pyfo_take(struct pyfo_glue *g, struct pyfo_start *starts,
              size_t *nstarts, struct pyfo_start *cancels, size_t *ncancels,
              size_t cap);
int pyfo_defer_child(struct fanout_child *c, void *arg);
struct pyfo_run { struct fanout_engine *e; ...; };
struct pyfo_cwrap { fanout_fn fn; void *arg; struct pyfo_run *run; };
int pyfo_run_child(struct fanout_child *c, void *arg);
fanout_id pyfo_run_cancel(struct pyfo_run *r);
int pyfo_child_noop(struct fanout_child *c, void *arg);
int pyfo_child_spin(struct fanout_child *c, void *arg);
int pyfo_child_sleep(struct fanout_child *c, void *arg);
int pyfo_child_tick(struct fanout_child *c, void *arg);
uint64_t pyfo_load(const void *p);
void pyfo_store(void *p, uint64_t v);
void *dlopen(const char *filename, int flags);
void *dlsym(void *handle, const char *symbol);
char *dlerror(void);
#define RTLD_NOW ...
#define RTLD_LOCAL ...
#define PYFO_HAVE_DEFER ...
#define PYFO_HAVE_V02_BATCH ...
"""

V02 = {
    "BATCH_V02": ("uint64_t deadline_ns; unsigned join; unsigned quorum;"
                  " struct fanout_pending *within;"
                  if HAVE_V02_BATCH else ""),
    "EVENT_V02": ("bool timed_out; bool interrupted_by_policy;"
                  if HAVE_V02_BATCH else ""),
    "INFO_V02": ("const char *session_key; unsigned npending;"
                 if HAVE_V02_BATCH else ""),
    "API_V02": ("""
#define FANOUT_CANCEL_ABANDON ...
#define FANOUT_JOIN_ALL ...
#define FANOUT_JOIN_FIRST_ERROR ...
#define FANOUT_JOIN_ANY ...
#define FANOUT_JOIN_QUORUM ...
#define FANOUT_MAX_DEADLINE_NS ...
""" if HAVE_V02_BATCH else "") + ("""
int fanout_cancel_session(struct fanout_engine *e, const char *session_key,
                          unsigned how, size_t *n);
""" if _implemented("fanout_cancel_session") else "") + ("""
struct fanout_outcome { int code; const char *summary; size_t summary_len;
                        const char *error; double cost; ...; };
struct fanout_pending *fanout_defer(struct fanout_child *c);
int fanout_complete(struct fanout_pending *p, const struct fanout_outcome *o);
bool fanout_pending_interrupted(const struct fanout_pending *p);
unsigned fanout_pending_index(const struct fanout_pending *p);
fanout_id fanout_pending_id(const struct fanout_pending *p);
int fanout_pending_add_cost(struct fanout_pending *p, double x);
""" if HAVE_DEFER else ""),
}

ffibuilder = FFI()
ffibuilder.cdef(CDEF % V02)

with open(os.path.join(HERE, "fanout", "_glue.c")) as fh:
    GLUE = fh.read()

PRELUDE = """
#include <dlfcn.h>
#define PYFO_HAVE_DEFER %d
#define PYFO_HAVE_V02_BATCH %d
""" % (HAVE_DEFER, HAVE_V02_BATCH)

ffibuilder.set_source(
    "fanout._fanout",
    PRELUDE + GLUE,
    sources=LIB_SRC,
    include_dirs=[os.path.join(ROOT, d) for d in ("include", "lib", "queue")],
    define_macros=[("_GNU_SOURCE", None), ("FQ_TLS_GLOBAL_DYNAMIC", None)],
    extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden",
                        "-Wno-unused-parameter"],
    libraries=["urcu-bp", "urcu-cds", "urcu-common", "ck", "pthread", "m",
               "dl"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
