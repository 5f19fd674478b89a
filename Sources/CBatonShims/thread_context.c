// The thread context: one pointer per thread (see CBatonShims.h). C11 `_Thread_local` is
// supported by clang on Linux and on every Apple platform Baton targets.
#include "CBatonShims.h"

static _Thread_local void *baton_context;

void baton_set_thread_context(void *context) { baton_context = context; }

void *baton_thread_context(void) { return baton_context; }
