// Linux-only header: not in Apple's SDK. Reaching it from Baton's C shim, read as Apple reads
// it (BATON_APPLE_CHECK_SHIM, set by scripts/check-apple.sh around the shim only), fails the
// check. Other modules (the toolchain's own shims) still get glibc's header.
#if defined(BATON_APPLE_CHECK_SHIM)
#error "<linux/futex.h> is Linux-only: not in Apple's SDK"
#else
#include_next <linux/futex.h>
#endif
